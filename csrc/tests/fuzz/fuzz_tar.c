/* libFuzzer target over the tar header walker and the WebDataset grouping
 * (tar_fuzz_body.h). Built by CMake where the compiler is clang
 * (-DFASTREAD_FUZZ=ON); run: build/fuzz/fuzz_tar -max_total_time=60. */
#include <stddef.h>
#include <stdint.h>

#include "tar_fuzz_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tar_fuzz_one(data, size);
    return 0;
}

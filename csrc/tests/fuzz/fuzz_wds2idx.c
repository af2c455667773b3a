/* libFuzzer target over DALI wds2idx parsing (wds2idx_fuzz_body.h). Built
 * by CMake where the compiler is clang (-DFASTREAD_FUZZ=ON); run:
 * build/fuzz/fuzz_wds2idx -max_total_time=60. */
#include <stddef.h>
#include <stdint.h>

#include "wds2idx_fuzz_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wds2idx_fuzz_one(data, size);
    return 0;
}

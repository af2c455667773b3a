/* libFuzzer target over the Squirrel MessagePack walk (squirrel_fuzz_body.h).
 * Built by CMake where the compiler is clang (-DFASTREAD_FUZZ=ON); run:
 * build/fuzz/fuzz_squirrel -max_total_time=60. */
#include <stddef.h>
#include <stdint.h>

#include "squirrel_fuzz_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    squirrel_fuzz_one(data, size);
    return 0;
}

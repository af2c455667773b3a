/* libFuzzer target over every parser of a Cassandra node's bytes
 * (cql_fuzz_body.h). Built by CMake where the compiler is clang
 * (-DFASTREAD_FUZZ=ON); run: build/fuzz/fuzz_cql -max_total_time=60. */
#include <stddef.h>
#include <stdint.h>

#include "cql_fuzz_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cql_fuzz_one(data, size);
    return 0;
}

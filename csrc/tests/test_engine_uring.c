/* io_uring reads every edge size byte-exactly: buffered and O_DIRECT, with
 * and without direct descriptors and registered buffers, with a queue much
 * shallower than the batch. */
#include <stdio.h>

#include "harness.h"

int main(void)
{
    char why[FR_ERRLEN];
    if (fr_engine_probe("io_uring", why, sizeof(why)) != 0) {
        printf("test_engine_uring: skipped: %s\n", why);
        return 77;
    }
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "io_uring";
    unsigned depths[] = {1, 8, 64};
    for (int d = 0; d < 3; d++) {
        cfg.queue_depth = depths[d];
        for (int mode = 0; mode < 8; mode++) {
            cfg.o_direct = mode & 1;
            cfg.register_files = (mode >> 1) & 1;
            cfg.register_buffers = (mode >> 2) & 1;
            CHECK(fr_test_engine_roundtrip(&cfg, 3) == 0);
        }
    }
    return fr_test_finish("test_engine_uring");
}

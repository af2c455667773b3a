/* psync reads every edge size byte-exactly, buffered and O_DIRECT, with
 * more files than one window and with one or many threads. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

int main(void)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "psync";
    unsigned threads[] = {1, 4};
    for (int t = 0; t < 2; t++) {
        cfg.threads = threads[t];
        for (int direct = 0; direct < 2; direct++) {
            cfg.o_direct = direct;
            CHECK(fr_test_engine_roundtrip(&cfg, 30) == 0); /* 300 files > one window */
        }
    }
    /* psync takes no engine_args: another engine's key is refused by name
     * (engine="auto" hands psync "" for its io_uring side). */
    cfg.engine_args = "taskrun=defer";
    fr_ctx *ctx = NULL;
    char err[FR_ERRLEN] = "";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "psync") &&
          strstr(err, "taskrun"));
    cfg.engine_args = ",";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == 0);
    fr_ctx_close(ctx);
    return fr_test_finish("test_engine_psync");
}

/* The s3 client's ranged GETs (fr_s3_client_get_range, the tar header walk
 * of formats/_s3_tar.py): which answers are the bytes asked for
 * (fr_s3_client_check_range, no server needed), and a range that cannot be
 * asked for, or a server nobody listens on, is an error naming the object. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engines/s3/s3_client.h"
#include "harness.h"

static void test_check_range(void)
{
    uint64_t total = 0;
    size_t n = 512;
    /* The bytes asked for, and the object's size. */
    CHECK(fr_s3_client_check_range(206, "bytes 1024-1535/4096", 1024, 512, &n, &total) == NULL);
    CHECK(total == 4096 && n == 512);
    /* Fewer at the object's end. */
    n = 100;
    CHECK(fr_s3_client_check_range(206, "bytes 3996-4095/4096", 3996, 512, &n, &total) == NULL);
    CHECK(total == 4096 && n == 100);
    /* Another start, more than asked, a body shorter than its range, no
     * total, no Content-Range: not the bytes at `first`. */
    n = 512;
    CHECK(fr_s3_client_check_range(206, "bytes 0-511/4096", 1024, 512, &n, &total) != NULL);
    n = 1024;
    CHECK(fr_s3_client_check_range(206, "bytes 1024-2047/4096", 1024, 512, &n, &total) != NULL);
    n = 10;
    CHECK(fr_s3_client_check_range(206, "bytes 1024-1535/4096", 1024, 512, &n, &total) != NULL);
    n = 512;
    CHECK(fr_s3_client_check_range(206, "bytes 1024-1535/*", 1024, 512, &n, &total) != NULL);
    CHECK(fr_s3_client_check_range(206, "", 1024, 512, &n, &total) != NULL);
    CHECK(fr_s3_client_check_range(206, NULL, 1024, 512, &n, &total) != NULL);
    CHECK(total == UINT64_MAX);
    /* Past the end: no bytes, the size where the server says it. */
    n = 200;
    CHECK(fr_s3_client_check_range(416, "bytes */4096", 8192, 512, &n, &total) == NULL);
    CHECK(n == 0 && total == 4096);
    n = 200;
    CHECK(fr_s3_client_check_range(416, "", 8192, 512, &n, &total) == NULL);
    CHECK(n == 0 && total == UINT64_MAX);
    /* A range from byte 0 refused: an empty object, with or without the
     * Content-Range (MinIO sends none). */
    n = 200;
    CHECK(fr_s3_client_check_range(416, "bytes */0", 0, 512, &n, &total) == NULL);
    CHECK(n == 0 && total == 0);
    n = 200;
    CHECK(fr_s3_client_check_range(416, "", 0, 512, &n, &total) == NULL);
    CHECK(n == 0 && total == 0);
    /* A server that ignores Range: the whole object, cut to the range,
     * only from the start. */
    n = 3000;
    CHECK(fr_s3_client_check_range(200, "", 0, 512, &n, &total) == NULL);
    CHECK(n == 512 && total == 3000);
    n = 3000;
    CHECK(fr_s3_client_check_range(200, "", 512, 512, &n, &total) != NULL);
    /* Other statuses pass through (the caller reports them). */
    n = 80;
    CHECK(fr_s3_client_check_range(404, "", 0, 512, &n, &total) == NULL);
    CHECK(total == UINT64_MAX);
}

static void test_get_range_errors(void)
{
    fr_s3_client *c = NULL;
    char err[256] = "";
    CHECK(fr_s3_client_open("endpoint=http://127.0.0.1:1,unsigned=1,retries=0", &c, err,
                            sizeof(err)) == 0);
    if (!c)
        return;
    char *body = NULL;
    size_t len = 7;
    uint64_t total = 0;
    CHECK(fr_s3_client_get_range(c, "bkt", "a.tar", 0, 0, &body, &len, &total, err,
                                 sizeof(err)) == -EINVAL);
    CHECK(body == NULL && len == 0 && strstr(err, "s3://bkt/a.tar"));
    CHECK(fr_s3_client_get_range(c, "bkt", "a.tar", UINT64_MAX - 10, 512, &body, &len, &total,
                                 err, sizeof(err)) == -EINVAL);
    CHECK(fr_s3_client_get_range(c, "bkt", "a.tar", 0, 512, &body, &len, &total, err,
                                 sizeof(err)) == -ECONNREFUSED);
    CHECK(body == NULL && total == UINT64_MAX && strstr(err, "s3://bkt/a.tar"));
    CHECK(fr_s3_client_requests(c) == 1 && fr_s3_client_bytes(c) == 0);
    fr_s3_client_close(c);
}

int main(void)
{
    test_check_range();
    test_get_range_errors();
    fr_test_cleanup();
    return fr_test_finish("test_s3_client_range");
}

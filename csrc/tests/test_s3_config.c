/* The s3 engine's parts that need no server: URLs, SigV4 key encoding,
 * settings from engine_args, the environment and the AWS files (secrets
 * never in a message), Content-Range and S3 error bodies, retry backoff
 * bounds; and the engine itself against a port nobody listens on (an
 * error within the deadline, after the retries, never a hang). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engines/s3/s3_client.h"
#include "engines/s3/s3_config.h"
#include "fastread.h"
#include "harness.h"

/* A fake environment: NAME=VALUE strings, NULL-terminated. */
static const char *fake_getenv(const char *name, void *arg)
{
    size_t n = strlen(name);
    for (const char *const *e = arg; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static int resolve(const char *args, const char *const *env, fr_s3_config *cfg, char *err)
{
    err[0] = 0;
    return fr_s3_config_resolve(args, fake_getenv, (void *)env, cfg, err, 256);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        CHECK(fclose(f) == 0);
    }
}

static void test_urls(void)
{
    char bucket[FR_S3_BUCKET_MAX + 1], err[256];
    const char *key;
    CHECK(fr_s3_parse_url("s3://b-1.x/dir/a b.jpg", bucket, &key, err, sizeof(err)) == 0);
    CHECK(strcmp(bucket, "b-1.x") == 0 && strcmp(key, "dir/a b.jpg") == 0);
    CHECK(fr_s3_parse_url("s3://bucket", bucket, &key, err, sizeof(err)) == 0 && *key == 0);
    CHECK(fr_s3_parse_url("s3://bucket/", bucket, &key, err, sizeof(err)) == 0 && *key == 0);
    CHECK(fr_s3_parse_url("s3:///key", bucket, &key, err, sizeof(err)) == -EINVAL &&
          strstr(err, "bucket"));
    CHECK(fr_s3_parse_url("/local/file", bucket, &key, err, sizeof(err)) == -EINVAL &&
          strstr(err, "not an s3:// URL"));
    CHECK(fr_s3_parse_url("s3://bad bucket/k", bucket, &key, err, sizeof(err)) == -EINVAL);
    CHECK(fr_s3_is_url("s3://b/k") && !fr_s3_is_url("S3://b/k") && !fr_s3_is_url("/s3://"));

    /* SigV4 UriEncode: unreserved kept, '/' kept in paths only, UTF-8 bytes
     * as upper-case %XX, '+' and '%' encoded (S3 would read '+' as itself,
     * but SigV4 canonical form encodes it). */
    char out[128];
    CHECK(fr_s3_uri_encode("a b/ü~._-+%", 1, out, sizeof(out)) == strlen("a%20b/%C3%BC~._-%2B%25"));
    CHECK(strcmp(out, "a%20b/%C3%BC~._-%2B%25") == 0);
    fr_s3_uri_encode("a/b", 0, out, sizeof(out));
    CHECK(strcmp(out, "a%2Fb") == 0);
    /* Too small: the needed length, a NUL-terminated prefix. */
    CHECK(fr_s3_uri_encode("ééé", 1, out, 4) == 18 && strlen(out) == 3);
}

static void test_object_urls(void)
{
    fr_s3_config cfg;
    char err[256], url[512];
    const char *env[] = {"AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=SECRET", NULL};
    /* A custom endpoint: path-style, the key encoded. */
    CHECK(resolve("endpoint=http://127.0.0.1:9000/", env, &cfg, err) == 0);
    CHECK(strcmp(cfg.endpoint, "http://127.0.0.1:9000") == 0 && !cfg.endpoint_is_aws);
    CHECK(fr_s3_object_url(&cfg, "bkt", "d/a b.jpg", NULL, url, sizeof(url)) > 0);
    CHECK(strcmp(url, "http://127.0.0.1:9000/bkt/d/a%20b.jpg") == 0);
    CHECK(fr_s3_object_url(&cfg, "bkt", "", "list-type=2&prefix=a%2F", url, sizeof(url)) > 0);
    CHECK(strcmp(url, "http://127.0.0.1:9000/bkt/?list-type=2&prefix=a%2F") == 0);
    CHECK(fr_s3_object_url(&cfg, "bkt", "k", NULL, url, 20) == -ENAMETOOLONG);
    /* AWS: virtual-hosted for DNS-compatible buckets, path-style for dotted ones. */
    const char *aws[] = {"AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=SECRET",
                         "AWS_REGION=eu-west-1", NULL};
    CHECK(resolve("", aws, &cfg, err) == 0);
    CHECK(strcmp(cfg.endpoint, "https://s3.eu-west-1.amazonaws.com") == 0 && cfg.endpoint_is_aws);
    CHECK(fr_s3_object_url(&cfg, "bkt", "k", NULL, url, sizeof(url)) > 0);
    CHECK(strcmp(url, "https://bkt.s3.eu-west-1.amazonaws.com/k") == 0);
    CHECK(fr_s3_object_url(&cfg, "my.bkt", "k", NULL, url, sizeof(url)) > 0);
    CHECK(strcmp(url, "https://s3.eu-west-1.amazonaws.com/my.bkt/k") == 0);
    CHECK(resolve("addressing=path", aws, &cfg, err) == 0);
    CHECK(fr_s3_object_url(&cfg, "bkt", "k", NULL, url, sizeof(url)) > 0);
    CHECK(strcmp(url, "https://s3.eu-west-1.amazonaws.com/bkt/k") == 0);
    CHECK(resolve("addressing=virtual,endpoint=http://minio:9000", aws, &cfg, err) == 0);
    CHECK(fr_s3_object_url(&cfg, "bkt", "k", NULL, url, sizeof(url)) > 0);
    CHECK(strcmp(url, "http://bkt.minio:9000/k") == 0);
}

static void test_resolution(void)
{
    fr_s3_config cfg;
    char err[256];
    const char *dir = fr_test_dir();
    char conf[512], creds[512], home[512];
    snprintf(conf, sizeof(conf), "%s/config", dir);
    snprintf(creds, sizeof(creds), "%s/credentials", dir);
    snprintf(home, sizeof(home), "HOME=%s/nohome", dir);
    write_file(conf, "# comment\n[default]\nregion = eu-central-1\n\n"
                     "[profile dev]\nregion=ap-south-1\nendpoint_url = http://127.0.0.1:8333/\n"
                     "s3 =\n  addressing_style = path\n"
                     "[profile confonly]\naws_access_key_id = CONFKEY\n"
                     "aws_secret_access_key = CONFSECRET\n");
    write_file(creds, "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = DEFSECRET\n"
                      "[dev]\naws_access_key_id=DEVKEY\naws_secret_access_key=DEV/SECRET+x\n"
                      "aws_session_token = DEVTOKEN\n");
    char conf_var[600], creds_var[600];
    snprintf(conf_var, sizeof(conf_var), "AWS_CONFIG_FILE=%s", conf);
    snprintf(creds_var, sizeof(creds_var), "AWS_SHARED_CREDENTIALS_FILE=%s", creds);

    /* Nothing set anywhere: AWS in us-east-1, and no credentials is an
     * error that says where they could come from. */
    const char *bare[] = {home, NULL};
    CHECK(resolve("", bare, &cfg, err) == -EACCES && strstr(err, "AWS_ACCESS_KEY_ID") &&
          strstr(err, "unsigned=1"));
    CHECK(resolve("unsigned=1", bare, &cfg, err) == 0 && cfg.unsigned_requests);
    CHECK(strcmp(cfg.region, "us-east-1") == 0 &&
          strcmp(cfg.endpoint, "https://s3.us-east-1.amazonaws.com") == 0);
    CHECK(cfg.verify == 1 && cfg.inflight == FR_S3_INFLIGHT && cfg.part_size == FR_S3_PART_SIZE);

    /* The default profile: region from the config file, keys from the
     * credentials file. */
    const char *files[] = {conf_var, creds_var, NULL};
    CHECK(resolve("", files, &cfg, err) == 0);
    CHECK(strcmp(cfg.region, "eu-central-1") == 0 && strcmp(cfg.access_key_id, "DEFKEY") == 0 &&
          strcmp(cfg.secret_access_key, "DEFSECRET") == 0 && !cfg.session_token[0]);
    CHECK(strstr(cfg.credentials_from, "credentials"));

    /* AWS_PROFILE=dev: its endpoint_url (path-style), its keys and token;
     * the nested "s3 =" block is not mistaken for keys. */
    const char *dev[] = {conf_var, creds_var, "AWS_PROFILE=dev", NULL};
    CHECK(resolve("", dev, &cfg, err) == 0);
    CHECK(strcmp(cfg.endpoint, "http://127.0.0.1:8333") == 0 && strcmp(cfg.region, "ap-south-1") == 0);
    CHECK(strcmp(cfg.secret_access_key, "DEV/SECRET+x") == 0 &&
          strcmp(cfg.session_token, "DEVTOKEN") == 0);
    /* Keys only in the config file's profile are found there. */
    CHECK(resolve("profile=confonly", files, &cfg, err) == 0 &&
          strcmp(cfg.access_key_id, "CONFKEY") == 0);
    /* A profile named but nowhere is an error naming it. */
    CHECK(resolve("profile=nosuch", files, &cfg, err) == -EINVAL && strstr(err, "'nosuch'"));

    /* The environment's keys beat the files, unless profile= is given;
     * the environment's region and endpoint beat the profile's. */
    const char *envk[] = {conf_var, creds_var, "AWS_PROFILE=dev", "AWS_ACCESS_KEY_ID=ENVKEY",
                          "AWS_SECRET_ACCESS_KEY=ENVSECRET", "AWS_REGION=sa-east-1",
                          "AWS_ENDPOINT_URL=http://other:1", "AWS_ENDPOINT_URL_S3=http://s3only:2",
                          NULL};
    CHECK(resolve("", envk, &cfg, err) == 0 && strcmp(cfg.access_key_id, "ENVKEY") == 0 &&
          !cfg.session_token[0] && strcmp(cfg.region, "sa-east-1") == 0 &&
          strcmp(cfg.endpoint, "http://s3only:2") == 0);
    CHECK(resolve("profile=dev", envk, &cfg, err) == 0 && strcmp(cfg.access_key_id, "DEVKEY") == 0);
    /* engine_args beat everything. */
    CHECK(resolve("access_key_id=ARGKEY,secret_access_key=ARGSECRET,region=us-west-2,"
                  "endpoint=https://example.com", envk, &cfg, err) == 0);
    CHECK(strcmp(cfg.access_key_id, "ARGKEY") == 0 && strcmp(cfg.region, "us-west-2") == 0 &&
          strcmp(cfg.endpoint, "https://example.com") == 0);
}

static void test_refusals(void)
{
    fr_s3_config cfg;
    char err[256];
    const char *env[] = {"AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=SECRET", NULL};
    struct {
        const char *args, *says;
    } bad[] = {
        {"inflight=0", "inflight"},
        {"inflight=1025", "inflight"},
        {"part_size=1000", "part_size"},
        {"retries=21", "retries"},
        {"deadline_ms=5", "deadline_ms"},
        {"addressing=dns", "path|virtual|auto"},
        {"unsigned=yes", "unsigned"},
        {"verify=2", "verify"},
        {"endpoint=ftp://x", "http(s)://host"},
        {"endpoint=http://host/path", "no path"},
        {"endpoint=http://user@host", "no user"},
        {"region=eu west", "region"},
        {"bogus=1", "known:"},
        {"access_key_id=A", "go together"},
        {"session_token=T0KEN", "needs access_key_id"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = resolve(bad[i].args, env, &cfg, err);
        CHECK(rc == -EINVAL);
        if (!strstr(err, bad[i].says)) {
            fprintf(stderr, "%s: message '%s' does not say '%s'\n", bad[i].args, err, bad[i].says);
            fr_test_failures++;
        }
    }
    /* Credentials in an endpoint's user info are refused without being
     * shown: the host is, the user info is not (from engine_args or the
     * environment alike). */
    const char *with_user[] = {"endpoint=https://AKIAEXAMPLE:S3CR3T@s3.example.com",
                               "endpoint=http://S3CR3T@h:1/p@q", "endpoint=S3CR3T@h"};
    for (size_t i = 0; i < sizeof(with_user) / sizeof(with_user[0]); i++) {
        CHECK(resolve(with_user[i], env, &cfg, err) == -EINVAL);
        CHECK(strstr(err, "S3CR3T") == NULL && strstr(err, "AKIAEXAMPLE") == NULL);
        CHECK(strstr(err, "***@") != NULL);
    }
    const char *env_user[] = {"AWS_ENDPOINT_URL=https://AKIAEXAMPLE:S3CR3T@s3.example.com",
                              "AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=SECRET",
                              NULL};
    CHECK(resolve("", env_user, &cfg, err) == -EINVAL);
    CHECK(strstr(err, "S3CR3T") == NULL && strstr(err, "***@s3.example.com") != NULL &&
          strstr(err, "AWS_ENDPOINT_URL") != NULL);
    /* A secret too long is refused without being shown. */
    char args[700] = "access_key_id=AKID,secret_access_key=";
    size_t n = strlen(args);
    memset(args + n, 'Q', 600);
    args[n + 600] = 0;
    CHECK(resolve(args, env, &cfg, err) == -EINVAL && strstr(err, "secret_access_key") &&
          !strstr(err, "QQQQ"));
    CHECK(resolve("inflight=1024,part_size=65536,retries=0,deadline_ms=100,verify=0", env, &cfg,
                  err) == 0);
    CHECK(cfg.inflight == 1024 && cfg.part_size == 65536 && cfg.retries == 0 && !cfg.verify);
}

static void test_http_pieces(void)
{
    uint64_t a, b, t;
    CHECK(fr_s3_parse_content_range("bytes 0-99/1000", &a, &b, &t) == 0 && a == 0 && b == 99 &&
          t == 1000);
    CHECK(fr_s3_parse_content_range("bytes */0", &a, &b, &t) == 0 && a == UINT64_MAX && t == 0);
    CHECK(fr_s3_parse_content_range("bytes 5-9/*", &a, &b, &t) == 0 && t == UINT64_MAX);
    CHECK(fr_s3_parse_content_range("bytes 9-5/100", &a, &b, &t) == -1);   /* backwards */
    CHECK(fr_s3_parse_content_range("bytes 0-100/100", &a, &b, &t) == -1); /* past the total */
    CHECK(fr_s3_parse_content_range("bytes 0-1/2x", &a, &b, &t) == -1);
    CHECK(fr_s3_parse_content_range("items 0-1/2", &a, &b, &t) == -1);
    CHECK(fr_s3_parse_content_range("bytes 0-99999999999999999999/1", &a, &b, &t) == -1);

    char code[64];
    const char *xml = "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code>"
                      "<Message>x</Message></Error>";
    fr_s3_error_code(xml, strlen(xml), code, sizeof(code));
    CHECK(strcmp(code, "SignatureDoesNotMatch") == 0);
    fr_s3_error_code(xml, 40, code, sizeof(code)); /* cut before </Code> */
    CHECK(code[0] == 0);
    fr_s3_error_code("<Code>A<b>B</Code>", 18, code, sizeof(code)); /* markup dropped */
    CHECK(strcmp(code, "AbB") == 0);

    CHECK(fr_s3_status_errno(404) == -ENOENT && fr_s3_status_errno(403) == -EACCES &&
          fr_s3_status_errno(416) == -ENODATA && fr_s3_status_errno(500) == -EIO &&
          fr_s3_status_errno(400) == -EIO);
    CHECK(fr_s3_status_retryable(503) && fr_s3_status_retryable(500) &&
          !fr_s3_status_retryable(404) && !fr_s3_status_retryable(403) &&
          !fr_s3_status_retryable(501));

    /* Backoff: within [c/2, c] for c = base * 2^(k-1) capped, and spread. */
    uint64_t rng = 42;
    for (unsigned k = 1; k <= 30; k++) {
        unsigned c = k - 1 < 16 ? FR_S3_BACKOFF_BASE_MS << (k - 1) : FR_S3_BACKOFF_CAP_MS;
        if (c > FR_S3_BACKOFF_CAP_MS)
            c = FR_S3_BACKOFF_CAP_MS;
        unsigned lo = ~0u, hi = 0;
        for (int r = 0; r < 2000; r++) {
            unsigned ms = fr_s3_backoff_ms(k, &rng);
            lo = ms < lo ? ms : lo;
            hi = ms > hi ? ms : hi;
        }
        CHECK(lo >= c / 2 && hi <= c && hi > lo);
    }
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The engine against a port nobody listens on: every sample fails with
 * ECONNREFUSED after its retries, within the deadline; a bad engine_args
 * key fails the open naming it. */
static void test_dead_server(void)
{
    fr_config cfg;
    fr_config_init(&cfg);
    cfg.engine = "s3";
    char err[256] = "";
    fr_ctx *ctx = NULL;
    cfg.engine_args = "endpoint=http://127.0.0.1:1,unsigned=1,bogus=2";
    CHECK(fr_ctx_open(&cfg, &ctx, err, sizeof(err)) == -EINVAL && strstr(err, "bogus"));
    cfg.engine_args = "endpoint=http://127.0.0.1:1,access_key_id=AK,secret_access_key=TOPSECRET,"
                      "retries=3,deadline_ms=20000,connect_timeout_ms=500";
    int rc = fr_ctx_open(&cfg, &ctx, err, sizeof(err));
    CHECK(rc == 0);
    if (rc)
        return;
    fr_pool *pool = fr_pool_new();
    fr_batch *b = pool ? fr_pool_get(pool) : NULL;
    CHECK(b != NULL);
    if (b) {
        const char *paths[] = {"s3://bkt/a", "s3://bkt/b c", "/not/a/url", "s3://bkt/"};
        CHECK(fr_batch_prepare(b, 4) == 0);
        long long t0 = now_ms();
        CHECK(fr_read_files(ctx, paths, NULL, 4, b) == 0);
        long long took = now_ms() - t0;
        /* 3 retries: 100+200+400 ms of backoff at least (half of each),
         * far below the deadline. */
        CHECK(took >= 350 && took < 20000);
        CHECK(b->samples[0].length == -ECONNREFUSED && b->samples[1].length == -ECONNREFUSED);
        CHECK(b->samples[2].length == -EINVAL && b->samples[3].length == -EINVAL);
        char msg[FR_ERRLEN];
        CHECK(fr_ctx_sample_error(ctx, 1, msg, sizeof(msg)) == 1 && strstr(msg, "s3://bkt/b c") &&
              !strstr(msg, "TOPSECRET"));
        CHECK(fr_ctx_sample_error(ctx, 3, msg, sizeof(msg)) == 1 && strstr(msg, "no object key"));
        CHECK(fr_ctx_stat(ctx, "s3_retries") == 6 && fr_ctx_stat(ctx, "s3_requests") == 8);
        /* Ranges of an unreachable object fail the same way. */
        fr_range r[2] = {{0, 10}, {5, 0}};
        CHECK(fr_batch_prepare(b, 2) == 0);
        CHECK(fr_read_ranges(ctx, "s3://bkt/img", r, 2, b) == 0);
        CHECK(b->samples[0].length == -ECONNREFUSED && b->samples[1].length == 0);
        /* A path that is no URL fails every range, each with the reason. */
        CHECK(fr_batch_prepare(b, 2) == 0);
        CHECK(fr_read_ranges(ctx, "/local/img", r, 2, b) == 0);
        CHECK(b->samples[0].length == -EINVAL && b->samples[1].length == -EINVAL);
        CHECK(fr_ctx_sample_error(ctx, 1, msg, sizeof(msg)) == 1 &&
              strstr(msg, "not an s3:// URL"));
        fr_batch_recycle(b);
    }
    fr_pool_close(pool);
    fr_ctx_close(ctx);

    /* The client API: the same settings, a transport error as -errno. */
    fr_s3_client *c = NULL;
    CHECK(fr_s3_client_open("endpoint=http://127.0.0.1:1,unsigned=1,retries=0", &c, err,
                            sizeof(err)) == 0);
    if (c) {
        char *body = NULL;
        size_t len = 0;
        CHECK(fr_s3_client_request(c, "GET", "bkt", "", "list-type=2", NULL, 0, &body, &len, err,
                                   sizeof(err)) == -ECONNREFUSED);
        CHECK(body == NULL && strstr(err, "s3://bkt/"));
        CHECK(fr_s3_client_request(c, "DELETE", "bkt", "k", NULL, NULL, 0, &body, &len, err,
                                   sizeof(err)) == -EINVAL);
        fr_s3_client_close(c);
    }
    char what[256];
    CHECK(fr_s3_describe(what, sizeof(what)) == 0 && strstr(what, "libcurl"));
}

int main(void)
{
    test_urls();
    test_object_urls();
    test_resolution();
    test_refusals();
    test_http_pieces();
    test_dead_server();
    fr_test_cleanup();
    return fr_test_finish("test_s3_config");
}

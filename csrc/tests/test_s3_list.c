/* ListObjectsV2 answers parsed in C (fr_s3_list_parse, what fr_s3_list
 * does to every page): objects, sizes and ETags as one blob + offsets,
 * URL-encoded keys and XML character references decoded, common prefixes,
 * truncation and its token; malformed answers refused, never half read;
 * and a walk against a port nobody listens on fails naming the prefix. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engines/s3/s3_list.h"
#include "harness.h"

static int str_is(const fr_s3_strings *s, size_t i, const char *want)
{
    size_t len = (size_t)(s->off[i + 1] - s->off[i]);
    return len == strlen(want) && memcmp(s->blob + s->off[i], want, len) == 0;
}

static const char PAGE[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Name>b</Name><Prefix>p%2F</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>"
    "<Delimiter>%2F</Delimiter><IsTruncated>true</IsTruncated>"
    "<Contents><Key>p%2Fa+b.jpg</Key><LastModified>2024-01-01T00:00:00Z</LastModified>"
    "<ETag>&quot;d41d8&quot;</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass>"
    "</Contents>"
    "<Contents><Key>p%2F%E2%82%AC%2B%25.png</Key><Size>0</Size><ETag>&#34;e&#34;</ETag></Contents>"
    "<Contents><Key>p%2Fno-etag</Key><Size>7</Size></Contents>"
    "<CommonPrefixes><Prefix>p%2Fdir%2F</Prefix></CommonPrefixes>"
    "<CommonPrefixes><Prefix>p%2Fx%26y%2F</Prefix></CommonPrefixes>"
    "<EncodingType>url</EncodingType>"
    "<NextContinuationToken>tok/+=</NextContinuationToken>"
    "</ListBucketResult>";

static int parse(const char *body, fr_s3_listing *l, fr_s3_strings *pre, int *trunc, char *tok,
                 char *err)
{
    memset(l, 0, sizeof(*l));
    memset(pre, 0, sizeof(*pre));
    err[0] = 0;
    return fr_s3_list_parse(body, strlen(body), l, pre, trunc, tok, 256, err, 256);
}

static void test_page(void)
{
    fr_s3_listing l;
    fr_s3_strings pre;
    int trunc = 0;
    char tok[256], err[256];
    CHECK(parse(PAGE, &l, &pre, &trunc, tok, err) == 0);
    CHECK(l.keys.n == 3 && l.etags.n == 3);
    CHECK(str_is(&l.keys, 0, "p/a b.jpg"));
    CHECK(str_is(&l.keys, 1, "p/\xe2\x82\xac+%.png"));
    CHECK(str_is(&l.keys, 2, "p/no-etag"));
    CHECK(str_is(&l.etags, 0, "\"d41d8\""));
    CHECK(str_is(&l.etags, 1, "\"e\""));
    CHECK(str_is(&l.etags, 2, ""));
    CHECK(l.sizes[0] == 12 && l.sizes[1] == 0 && l.sizes[2] == 7);
    CHECK(pre.n == 2 && str_is(&pre, 0, "p/dir/") && str_is(&pre, 1, "p/x&y/"));
    CHECK(trunc == 1 && strcmp(tok, "tok/+=") == 0);
    fr_s3_listing_free(&l);
    fr_s3_strings_free(&pre);

    /* Not asked encoded (no EncodingType): keys as they are. */
    const char *plain = "<ListBucketResult><IsTruncated>false</IsTruncated>"
                        "<Contents><Key>a+b%41</Key><Size>1</Size></Contents></ListBucketResult>";
    CHECK(parse(plain, &l, &pre, &trunc, tok, err) == 0);
    CHECK(l.keys.n == 1 && str_is(&l.keys, 0, "a+b%41") && trunc == 0 && tok[0] == 0);
    fr_s3_listing_free(&l);
    fr_s3_strings_free(&pre);

    /* An empty listing. */
    CHECK(parse("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", &l,
                &pre, &trunc, tok, err) == 0);
    CHECK(l.keys.n == 0 && pre.n == 0);
    fr_s3_listing_free(&l);
    fr_s3_strings_free(&pre);
}

static void test_refused(void)
{
    static const char *const bad[] = {
        "<Error><Code>AccessDenied</Code></Error>",                    /* not a listing */
        "<ListBucketResult><Contents><Key>a</Key><Size>x</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", /* no token */
        "<ListBucketResult><Contents><Key>a</Key>",                    /* cut short */
        "<!DOCTYPE x [<!ENTITY a \"aaaa\">]><ListBucketResult/>",       /* a DTD */
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fr_s3_listing l;
        fr_s3_strings pre;
        int trunc;
        char tok[256], err[256];
        int rc = parse(bad[i], &l, &pre, &trunc, tok, err);
        if (rc != -EIO || !err[0])
            fprintf(stderr, "case %zu: rc %d, err '%s'\n", i, rc, err);
        CHECK(rc == -EIO && err[0]);
        CHECK(l.keys.n == 0); /* nothing of a refused page kept */
        fr_s3_listing_free(&l);
        fr_s3_strings_free(&pre);
    }
}

static void test_dead_server(void)
{
    fr_s3_listing l;
    char err[512] = "";
    /* Port 9 on loopback: nobody listens (discard is never enabled on CI). */
    int rc = fr_s3_list("endpoint=http://127.0.0.1:9 access_key_id=AKIAX "
                        "secret_access_key=topsecret region=us-east-1 retries=1 deadline_ms=2000",
                        "bkt", "pre/", 1, -1, 4, &l, err, sizeof(err));
    CHECK(rc < 0);
    if (!strstr(err, "s3://bkt/pre/"))
        fprintf(stderr, "dead server: rc %d, err %s\n", rc, err);
    CHECK(strstr(err, "s3://bkt/pre/") != NULL);
    CHECK(strstr(err, "topsecret") == NULL);
    fr_s3_listing_free(&l);
    CHECK(fr_s3_list("", "bkt", "", 1, -1, 0, &l, err, sizeof(err)) == -EINVAL);
    fr_s3_listing_free(&l);
}

int main(void)
{
    if (!fr_s3_list_native()) {
        printf("test_s3_list: SKIP (built without libexpat: listings are parsed in Python)\n");
        return 77;
    }
    test_page();
    test_refused();
    test_dead_server();
    return fr_test_finish("test_s3_list");
}

/* The one engine_args parser: every kind, every refusal names the key, and a
 * secret value never appears in a message. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/engine_args.h"
#include "harness.h"

static long long depth = 7;
static int mode = -1, depth_given;
static char name[8], key[64], tag[8];

static const fr_arg_spec specs[] = {
    {.key = "depth", .kind = FR_ARG_INT, .out = &depth, .min = 1, .max = 4096, .given = &depth_given},
    {.key = "mode", .kind = FR_ARG_CHOICE, .out = &mode, .choices = "auto|off|on"},
    {.key = "name", .kind = FR_ARG_STR, .out = name, .max = sizeof(name)},
    {.key = "secret_key", .kind = FR_ARG_STR, .out = key, .max = sizeof(key), .secret = 1},
    {.key = "tag", .kind = FR_ARG_STR, .out = tag, .min = 1, .max = sizeof(tag)},
};
#define NSPECS (sizeof(specs) / sizeof(specs[0]))

static int parse(const char *args, char *err)
{
    err[0] = 0;
    return fr_args_parse("demo", args, specs, NSPECS, err, 256);
}

int main(void)
{
    char err[256];
    CHECK(parse(NULL, err) == 0 && parse("", err) == 0 && parse(",,", err) == 0);
    CHECK(depth == 7 && mode == -1 && !depth_given); /* absent keys leave outputs alone */

    CHECK(parse("depth=64,mode=off,name=abcdefg", err) == 0);
    CHECK(depth == 64 && mode == 1 && depth_given && strcmp(name, "abcdefg") == 0);
    CHECK(parse("depth=0x10,depth=12", err) == 0 && depth == 12); /* hex; the last one wins */
    CHECK(parse("name=", err) == 0 && name[0] == 0);

    /* Refusals name the engine and the key. */
    CHECK(parse("depth=0", err) == -EINVAL && strstr(err, "demo:") && strstr(err, "depth"));
    CHECK(parse("depth=12x", err) == -EINVAL && strstr(err, "depth='12x'"));
    CHECK(parse("depth=", err) == -EINVAL && strstr(err, "depth"));
    CHECK(parse("depth=99999999999999999999999", err) == -EINVAL);
    CHECK(parse("mode=maybe", err) == -EINVAL && strstr(err, "auto|off|on"));
    CHECK(parse("bogus=1", err) == -EINVAL && strstr(err, "'bogus'") && strstr(err, "known:") &&
          strstr(err, "mode=auto|off|on"));
    CHECK(parse("mode", err) == -EINVAL && strstr(err, "no value"));

    /* A value too long is refused whole, never truncated (cuFile's old
     * parser cut values at 31 characters). */
    strcpy(name, "kept");
    CHECK(parse("name=abcdefgh", err) == -EINVAL && strstr(err, "name") && strstr(err, "at most 7"));
    CHECK(strcmp(name, "kept") == 0);

    /* A string with a shortest length (xNVMe's be=, async=...): an empty
     * value is refused, not taken as "not given". */
    CHECK(parse("tag=x", err) == 0 && strcmp(tag, "x") == 0);
    CHECK(parse("tag=", err) == -EINVAL && strstr(err, "demo:") && strstr(err, "tag") &&
          strstr(err, "at least 1 byte"));
    CHECK(strcmp(tag, "x") == 0);

    /* Secrets: accepted, and never echoed when refused. */
    CHECK(parse("secret_key=wJalrXUtnFEMI/K7MDENG", err) == 0 && strcmp(key, "wJalrXUtnFEMI/K7MDENG") == 0);
    char long_secret[100];
    memset(long_secret, 'S', sizeof(long_secret) - 1);
    long_secret[sizeof(long_secret) - 1] = 0;
    char args[128];
    snprintf(args, sizeof(args), "secret_key=%s", long_secret);
    CHECK(parse(args, err) == -EINVAL && strstr(err, "secret_key") && !strstr(err, "SSSS"));

    if (fr_test_failures)
        fprintf(stderr, "%d failures\n", fr_test_failures);
    return fr_test_failures ? 1 : 0;
}

/* xnvme-cuda: what runs without an NVMe device or a GPU.
 *
 * Everywhere: pages map to whole-block commands that cover exactly the
 * store's bytes (any geometry, MDTS splits, the last page's tail), layouts
 * GPU commands cannot read are refused with the device named; URIs resolve
 * to a controller or are refused with what is wrong (a fake sysfs tree, and
 * this machine's own PCI devices); engine_args parse.
 * Where fastread was built with xNVMe's GPU queues: the loaded libxnvme has
 * upcie-cuda; opening a device that is not there refuses cleanly, naming
 * the device and the backend; the device part compiles again with nvcc and
 * the embedded fatbin is there. Elsewhere that part is skipped (77) with
 * the reason, after the checks above have passed.
 * Not here (no NVMe device with P2P, no GPU): the fill itself. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gather_xnvme_cuda.h"
#include "harness.h"

#if defined(FASTREAD_HAVE_XNVME_CUDA) && defined(__has_include)
#if __has_include("xnvme_cuda_build.h")
#include "xnvme_cuda_build.h"
#endif
#endif

#define ERRLEN 1024

static int contains(const char *s, const char *needle)
{
    if (!strstr(s, needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", s, needle);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ geometry */

static void test_geometry_cases(void)
{
    fr_xc_geom g;
    char err[ERRLEN];
    fr_xc_cmd c;
    const uint64_t GiB = 1ull << 30;

    /* 1000 rows of 256 B in 64 KiB pages, 512 B blocks, MDTS 128 KiB. */
    CHECK(fr_xc_geom_init(&g, "dev0", 0, 1000, 256, 65536, 512, 128 << 10, GiB, err, ERRLEN) == 0);
    CHECK(g.pages == 4 && g.chunk_bytes == 65536 && g.cmds_per_page == 1 && g.lba_shift == 9);
    CHECK(g.mem_pages_per_page == 16 && g.read_end == 256000);
    CHECK(fr_xc_page_cmd(&g, 0, 0, &c) && c.slba == 0 && c.nlb == 128 && c.slot_off == 0);
    CHECK(fr_xc_page_cmd(&g, 2, 0, &c) && c.slba == 256 && c.nlb == 128);
    /* The last page stops at the data's end, in whole blocks. */
    CHECK(fr_xc_page_cmd(&g, 3, 0, &c) && c.slba == 384 && c.nlb == (256000 - 196608) / 512);
    CHECK(!fr_xc_page_cmd(&g, 4, 0, &c)); /* past the store */
    CHECK(!fr_xc_page_cmd(&g, 0, 1, &c)); /* past the page's commands */

    /* MDTS 16 KiB: four commands per page, block addresses follow. */
    CHECK(fr_xc_geom_init(&g, "dev0", 4096, 4096, 64, 65536, 4096, 16 << 10, GiB, err, ERRLEN) == 0);
    CHECK(g.chunk_bytes == 16384 && g.cmds_per_page == 4 && g.pages == 4);
    CHECK(fr_xc_page_cmd(&g, 1, 3, &c) && c.slba == (4096 + 65536 + 3 * 16384) / 4096 &&
          c.nlb == 4 && c.slot_off == 3 * 16384);
    /* MDTS not a power of two: the largest power of two below it. */
    CHECK(fr_xc_geom_init(&g, "dev0", 0, 16, 65536, 1 << 20, 512, 96 << 10, GiB, err, ERRLEN) == 0);
    CHECK(g.chunk_bytes == 65536 && g.cmds_per_page == 16);
    /* No MDTS: a 1 MiB page is one command (upcie's PRP list allows 2 MiB). */
    CHECK(fr_xc_geom_init(&g, "dev0", 0, 16, 65536, 1 << 20, 512, 0, GiB, err, ERRLEN) == 0);
    CHECK(g.chunk_bytes == (1u << 20) && g.cmds_per_page == 1);
    CHECK(fr_xc_page_cmd(&g, 0, 0, &c) && c.nlb == 2048);
    /* The store may end exactly at the namespace's end. */
    CHECK(fr_xc_geom_init(&g, "dev0", 512, 1, GiB - 512, 1 << 20, 512, 0, GiB, err, ERRLEN) ==
          -EINVAL); /* row_bytes does not divide the page */
    CHECK(fr_xc_geom_init(&g, "dev0", 4096, (GiB - 4096) / 4096, 4096, 65536, 4096, 0, GiB, err,
                          ERRLEN) == 0);
    CHECK(fr_xc_page_cmd(&g, g.pages - 1, 0, &c) && (c.slba + c.nlb) * 4096 == GiB);

    /* Refusals name the device and say why. */
    CHECK(fr_xc_geom_init(&g, "0000:01:00.0 nsid 1", 128, 10, 64, 4096, 512, 0, GiB, err,
                          ERRLEN) == -EINVAL);
    CHECK(contains(err, "0000:01:00.0 nsid 1") && contains(err, "block boundary") &&
          contains(err, "proxy"));
    CHECK(fr_xc_geom_init(&g, "d", 0, 10, 64, 4096, 8192, 0, GiB, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "smaller than the 8192-byte logical block"));
    CHECK(fr_xc_geom_init(&g, "d", 0, 10, 48, 4096, 512, 0, GiB, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "does not divide"));
    CHECK(fr_xc_geom_init(&g, "d", 0, 10, 64, 3 * 4096, 512, 0, GiB, err, ERRLEN) == -EINVAL);
    CHECK(fr_xc_geom_init(&g, "d", 0, 10, 64, 2 << 20, 512, 0, GiB, err, ERRLEN) == -EINVAL);
    CHECK(fr_xc_geom_init(&g, "d", 0, 10, 64, 4096, 520, 0, GiB, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "520"));
    CHECK(fr_xc_geom_init(&g, "d", 0, 10, 64, 4096, 512, 2048, GiB, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "2048 bytes per command"));
    CHECK(fr_xc_geom_init(&g, "dev9", 0, (GiB / 64) + 1, 64, 4096, 512, 0, GiB, err, ERRLEN) ==
          -ERANGE);
    CHECK(contains(err, "past the end of dev9"));
    CHECK(fr_xc_geom_init(&g, "d", 512, UINT64_MAX / 2, 4, 4096, 512, 0, GiB, err, ERRLEN) ==
          -ERANGE); /* rows * row_bytes overflows */
}

/* Every page's commands cover exactly its bytes up to the data's end (in
 * whole blocks), in order, within the slot and MDTS. */
static void test_geometry_cover(void)
{
    uint32_t x = 12345;
#define RND() (x ^= x << 13, x ^= x >> 17, x ^= x << 5, x)
    int bad = 0;
    for (int t = 0; t < 3000 && !bad; t++) {
        uint32_t lba = 512u << (RND() % 4);
        uint32_t page = 4096u << (RND() % 9);
        if (page < lba)
            page = lba;
        uint64_t row = page >> (RND() % 8);
        if (row == 0)
            row = 1;
        uint64_t mdts = (RND() % 3) ? (uint64_t)(RND() % 512 + 4) * 4096 : 0;
        uint64_t offset = (uint64_t)(RND() % 64) * lba;
        uint64_t rows = RND() % 3000 + 1;
        uint64_t dev = offset + rows * row + (uint64_t)(RND() % 4) * lba;
        dev = (dev + lba - 1) / lba * lba;
        fr_xc_geom g;
        char err[ERRLEN];
        if (fr_xc_geom_init(&g, "d", offset, rows, row, page, lba, mdts, dev, err, ERRLEN) != 0) {
            fprintf(stderr, "refused a valid geometry: %s\n", err);
            bad++;
            break;
        }
        uint64_t expect = offset;
        for (uint64_t p = 0; p < g.pages && !bad; p++) {
            for (uint32_t k = 0; k < g.cmds_per_page; k++) {
                fr_xc_cmd c;
                if (!fr_xc_page_cmd(&g, p, k, &c))
                    continue;
                uint64_t bytes = (uint64_t)c.nlb * lba;
                if (c.slba * lba != expect || c.nlb == 0 || c.nlb > 65536 ||
                    bytes > g.chunk_bytes || (mdts && bytes > mdts) ||
                    c.slot_off + bytes > page || offset + p * page + c.slot_off != expect ||
                    c.slot_off % 4096) {
                    fprintf(stderr, "bad command: lba %u page %u row %llu mdts %llu off %llu: "
                            "page %llu cmd %u slba %llu nlb %u slot_off %u (expected byte %llu)\n",
                            lba, page, (unsigned long long)row, (unsigned long long)mdts,
                            (unsigned long long)offset, (unsigned long long)p, k,
                            (unsigned long long)c.slba, c.nlb, c.slot_off,
                            (unsigned long long)expect);
                    bad++;
                    break;
                }
                expect += bytes;
            }
        }
        uint64_t want_end = (offset + rows * row + lba - 1) / lba * lba;
        if (!bad && (expect != want_end || expect > dev)) {
            fprintf(stderr, "commands end at %llu, expected %llu\n", (unsigned long long)expect,
                    (unsigned long long)want_end);
            bad++;
        }
    }
#undef RND
    CHECK(bad == 0);
}

/* ------------------------------------------------------------ URIs */

static void mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A PCI function in a fake sysfs: class, and a driver link unless NULL. */
static void fake_pci(const char *sys, const char *addr, const char *cls, const char *driver)
{
    char p[1024], t[1024];
    snprintf(p, sizeof(p), "%s/bus/pci/devices/%s", sys, addr);
    mkdirs(p);
    snprintf(p, sizeof(p), "%s/bus/pci/devices/%s/class", sys, addr);
    put(p, cls);
    if (driver) {
        snprintf(t, sizeof(t), "%s/bus/pci/drivers/%s", sys, driver);
        mkdirs(t);
        snprintf(p, sizeof(p), "%s/bus/pci/devices/%s/driver", sys, addr);
        CHECK(symlink(t, p) == 0);
    }
}

static void test_resolve(void)
{
    char sys[1024], pci[32], err[ERRLEN];
    uint32_t nsid = 0;
    snprintf(sys, sizeof(sys), "%s/sys", fr_test_dir());
    fake_pci(sys, "0000:0a:00.0", "0x010802\n", "uio_pci_generic");
    fake_pci(sys, "0000:0b:00.0", "0x010802\n", "nvme");
    fake_pci(sys, "0000:0c:00.0", "0x010802\n", NULL);
    fake_pci(sys, "0000:0d:00.0", "0x020000\n", "virtio-pci");

    CHECK(fr_xc_resolve(sys, "0000:0a:00.0", pci, sizeof(pci), &nsid, err, ERRLEN) == 0);
    CHECK(strcmp(pci, "0000:0a:00.0") == 0);
    CHECK(fr_xc_resolve(sys, "0A:00.0", pci, sizeof(pci), &nsid, err, ERRLEN) == 0);
    CHECK(strcmp(pci, "0000:0a:00.0") == 0); /* short form, any case */

    CHECK(fr_xc_resolve(sys, "0000:0b:00.0", pci, sizeof(pci), &nsid, err, ERRLEN) == -ENODEV);
    CHECK(contains(err, "0000:0b:00.0") && contains(err, "bound to nvme") &&
          contains(err, "upcie-cuda") && contains(err, "uio_pci_generic"));
    CHECK(fr_xc_resolve(sys, "0000:0c:00.0", pci, sizeof(pci), &nsid, err, ERRLEN) == -ENODEV);
    CHECK(contains(err, "bound to no driver"));
    CHECK(fr_xc_resolve(sys, "0000:0d:00.0", pci, sizeof(pci), &nsid, err, ERRLEN) == -ENODEV);
    CHECK(contains(err, "not an NVMe controller") && contains(err, "0x020000"));
    CHECK(fr_xc_resolve(sys, "0000:0e:00.0", pci, sizeof(pci), &nsid, err, ERRLEN) == -ENODEV);
    CHECK(contains(err, "no PCI device 0000:0e:00.0") && contains(err, "upcie-cuda"));

    const char *junk[] = {"", "nvme0n1", "0000:0a:00", "0000:0a:00.8", "0000:0a:20.0",
                          "00000:0a:00.0", "0000:0a:00.0x", "/dev/sda", "/dev/nvme0", NULL};
    for (size_t i = 0; junk[i]; i++) {
        int rc = fr_xc_resolve(sys, junk[i], pci, sizeof(pci), &nsid, err, ERRLEN);
        if (rc != -EINVAL)
            fprintf(stderr, "'%s' gave %d, not -EINVAL\n", junk[i], rc);
        CHECK(rc == -EINVAL);
    }
    CHECK(fr_xc_resolve(sys, NULL, pci, sizeof(pci), &nsid, err, ERRLEN) == -EINVAL);

    /* A namespace path that does not exist here (no NVMe on this machine;
     * where one exists the kernel driver owns it, which is refused too). */
    struct stat st;
    if (stat("/dev/nvme7n3", &st) != 0) {
        CHECK(fr_xc_resolve(sys, "/dev/nvme7n3", pci, sizeof(pci), &nsid, err, ERRLEN) ==
              -ENODEV);
        CHECK(contains(err, "/dev/nvme7n3") && contains(err, "upcie-cuda"));
        CHECK(nsid == 3);
    }
    /* This machine's own PCI devices: whatever is not an NVMe controller
     * bound to uio_pci_generic is refused, with the reason. */
    DIR *d = opendir("/sys/bus/pci/devices");
    struct dirent *e;
    int seen = 0;
    while (d && (e = readdir(d)) && seen < 8) {
        if (e->d_name[0] == '.')
            continue;
        seen++;
        int rc = fr_xc_resolve(NULL, e->d_name, pci, sizeof(pci), &nsid, err, ERRLEN);
        CHECK(rc == 0 || rc == -ENODEV);
        if (rc)
            CHECK(contains(err, e->d_name) && contains(err, "upcie-cuda"));
    }
    if (d)
        closedir(d);
}

static void test_args(void)
{
    fr_xc_config c;
    char err[ERRLEN];
    fr_xc_config_init(&c);
    CHECK(c.page_bytes == 65536 && c.queues == 0 && c.sysfs == NULL);
    CHECK(fr_xc_parse_args("nsid=2,queues=4,qdepth=128,gpu=1", &c, err, ERRLEN) == 0);
    CHECK(c.nsid == 2 && c.queues == 4 && c.queue_depth == 128 && c.gpu_id == 1);
    CHECK(fr_xc_parse_args("qdepth=100", &c, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "qdepth"));
    CHECK(fr_xc_parse_args("qdepth=2048", &c, err, ERRLEN) == -EINVAL);
    CHECK(fr_xc_parse_args("nsid=0", &c, err, ERRLEN) == -EINVAL);
    CHECK(fr_xc_parse_args("be=upcie", &c, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "unknown engine_args key 'be'"));
    CHECK(fr_xc_parse_args("queues", &c, err, ERRLEN) == -EINVAL);
    CHECK(fr_xc_parse_args("", &c, err, ERRLEN) == 0 && fr_xc_parse_args(NULL, &c, err, ERRLEN) == 0);
}

/* ------------------------------------------- with xNVMe's GPU queues only */

#ifdef FASTREAD_HAVE_XNVME_CUDA
extern const unsigned char fr_xc_fatbin[];
extern const size_t fr_xc_fatbin_len;

static void test_refusal(void)
{
    char sys[1024], err[ERRLEN];
    snprintf(sys, sizeof(sys), "%s/sys", fr_test_dir());
    fr_xc_config cfg;
    fr_xc_config_init(&cfg);
    cfg.rows = 1000;
    cfg.row_bytes = 256;
    cfg.cache_bytes = 1 << 20;
    fr_xc *x = (fr_xc *)&cfg; /* must be reset to NULL on failure */

    /* No such controller: refused before xNVMe or CUDA are touched. */
    cfg.uri = "0000:0e:00.0";
    CHECK(fr_xc_open(&cfg, &x, err, ERRLEN) == -ENODEV && x == NULL);
    CHECK(contains(err, "0000:0e:00.0") && contains(err, "upcie-cuda"));
    cfg.uri = "/dev/nvme7n1";
    x = (fr_xc *)&cfg;
    CHECK(fr_xc_open(&cfg, &x, err, ERRLEN) == -ENODEV && x == NULL);
    CHECK(contains(err, "/dev/nvme7n1"));
    /* The real sysfs: this machine has no NVMe controller on uio_pci_generic. */
    cfg.uri = "0000:00:00.0";
    int rc = fr_xc_open(&cfg, &x, err, ERRLEN);
    CHECK(rc == -ENODEV && x == NULL);
    CHECK(contains(err, "0000:00:00.0") && contains(err, "upcie-cuda"));
    /* A controller that looks right in sysfs gets past the checks to CUDA
     * and xNVMe, which refuse it (no GPU, no such PCI function): still
     * -ENODEV, the device named. */
    cfg.uri = "0000:0a:00.0";
    cfg.sysfs = sys;
    x = (fr_xc *)&cfg;
    rc = fr_xc_open(&cfg, &x, err, ERRLEN);
    fprintf(stderr, "refusal with a uio-bound lookalike: %d: %s\n", rc, err);
    CHECK(rc < 0 && x == NULL);
    CHECK(contains(err, "xnvme-cuda") && contains(err, "0000:0a:00.0 nsid 1"));
    /* Bad settings are refused before any device is touched. */
    cfg.queue_depth = 48;
    CHECK(fr_xc_open(&cfg, &x, err, ERRLEN) == -EINVAL && contains(err, "queue depth 48"));
    fr_xc_close(NULL);
}

static void test_device_compile(void)
{
    CHECK(fr_xc_fatbin_len > 64);
    CHECK(fr_xc_fatbin_len > 4 && memcmp(fr_xc_fatbin, "\x50\xed\x55\xba", 4) == 0);
#ifdef FR_XC_NVCC
    char out[1024], cmd[4096];
    snprintf(out, sizeof(out), "%s/kernels.ptx", fr_test_dir());
    snprintf(cmd, sizeof(cmd), "'%s' %s -arch=sm_80 --ptx -o '%s' '%s/xnvme_cuda_kernels.cu'",
             FR_XC_NVCC, FR_XC_NVCC_FLAGS, out, FR_XC_DEVICE_DIR);
    int rc = system(cmd);
    CHECK(rc == 0);
    FILE *f = fopen(out, "r");
    CHECK(f != NULL);
    int entry = 0;
    char line[4096];
    while (f && fgets(line, sizeof(line), f))
        entry |= strstr(line, ".entry fr_xc_fill_pages") != NULL;
    if (f)
        fclose(f);
    CHECK(entry);
#else
    fprintf(stderr, "nvcc compile check: no xnvme_cuda_build.h\n");
    CHECK(0);
#endif
}
#endif

int main(void)
{
    test_geometry_cases();
    test_geometry_cover();
    test_resolve();
    test_args();

    char why[ERRLEN];
    int rc = fr_xc_probe(why, sizeof(why));
#ifndef FASTREAD_HAVE_XNVME_CUDA
    CHECK(rc == -ENOTSUP && contains(why, "xnvme-cuda"));
    fr_xc_config cfg;
    fr_xc_config_init(&cfg);
    cfg.uri = "0000:01:00.0";
    fr_xc *x = NULL;
    char err[ERRLEN];
    CHECK(fr_xc_open(&cfg, &x, err, ERRLEN) == -ENOTSUP && x == NULL && contains(err, "xnvme-cuda"));
    if (fr_test_failures)
        return fr_test_finish("test_gather_xnvme_cuda");
    fr_test_cleanup();
    printf("skip: %s (mapping, URI and argument checks passed)\n", why);
    return 77;
#else
    if (rc != 0) {
        /* Built with the header, but the loaded libxnvme lacks upcie-cuda. */
        CHECK(rc == -ENOTSUP && contains(why, "xnvme-cuda"));
        test_device_compile();
        if (fr_test_failures)
            return fr_test_finish("test_gather_xnvme_cuda");
        fr_test_cleanup();
        printf("skip: %s\n", why);
        return 77;
    }
    printf("probe: %s\n", why);
    test_refusal();
    test_device_compile();
    return fr_test_finish("test_gather_xnvme_cuda");
#endif
}

/* xnvme-cuda: what runs without an NVMe device or a GPU.
 *
 * Everywhere: pages map to whole-block commands that cover exactly the
 * store's bytes (any geometry, MDTS splits, the last page's tail), layouts
 * GPU commands cannot read are refused with the device named; URIs resolve
 * to a controller or are refused with what is wrong (a fake sysfs tree, and
 * this machine's own PCI devices); engine_args parse.
 * Where fastread was built with xNVMe's GPU queues: the loaded libxnvme has
 * upcie-cuda; the backend's probe and open refuse a device that is not
 * there cleanly, naming the device and the backend; the device half
 * compiles with nvcc (from the headers, and as the generated text the gather
 * core hands NVRTC) and with NVRTC itself where libnvrtc loads. Elsewhere
 * that part is skipped (77) with the reason, after the checks above passed.
 * Not here (no NVMe device with P2P, no GPU): a read. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gather/gather_xnvme_cuda.h"
#include "harness.h"

#ifdef FASTREAD_HAVE_XNVME_CUDA
#include "fastread_gather.h"
#include "gather/gather_backend.h"
#include "xnvme_cuda_build.h"
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
    fr_xc_args a;
    char err[ERRLEN];
    CHECK(fr_xc_parse_args("nsid=2,queues=4", &a, err, ERRLEN) == 0);
    CHECK(a.nsid == 2 && a.queues == 4);
    CHECK(fr_xc_parse_args("queues=2000", &a, err, ERRLEN) == -EINVAL);
    CHECK(contains(err, "queues"));
    CHECK(fr_xc_parse_args("nsid=0", &a, err, ERRLEN) == -EINVAL);
    /* The host engine's keys pass through untouched. */
    CHECK(fr_xc_parse_args("be=linux,nsid=5,async=io_uring", &a, err, ERRLEN) == 0);
    CHECK(a.nsid == 5 && a.queues == 0);
    CHECK(fr_xc_parse_args("queues", &a, err, ERRLEN) == -EINVAL);
    CHECK(fr_xc_parse_args("", &a, err, ERRLEN) == 0 && a.nsid == 0 && a.queues == 0);
    CHECK(fr_xc_parse_args(NULL, &a, err, ERRLEN) == 0);
}

/* ------------------------------------------- with xNVMe's GPU queues only */

#ifdef FASTREAD_HAVE_XNVME_CUDA
static void env_init(fr_backend_env *env, const char *path)
{
    memset(env, 0, sizeof(*env));
    env->path = path;
    env->rows = 1000;
    env->row_bytes = 256;
    env->page_bytes = 65536;
    env->pages = 4;
    env->timeout_ms = 1000;
    env->engine_args = "";
}

static void test_refusal(void)
{
    const fr_gather_backend *b = &fr_gather_backend_xnvme_cuda;
    char sys[1024], err[ERRLEN];
    snprintf(sys, sizeof(sys), "%s/sys", fr_test_dir());
    fr_backend_env env;
    void *st;
    CHECK(strcmp(b->name, "xnvme-cuda") == 0 && strcmp(b->fetch_define, "FR_FETCH_EXTERN") == 0);
    CHECK(b->device_source && b->device_source() == fr_xc_device_source());

    /* No such controller: refused by probe and open before xNVMe or CUDA
     * touch anything, naming the device and the backend. */
    env_init(&env, "0000:0e:00.0");
    CHECK(b->probe(&env, err, ERRLEN) == -ENODEV);
    CHECK(contains(err, "0000:0e:00.0") && contains(err, "upcie-cuda"));
    st = &env;
    CHECK(b->open(&env, &st, err, ERRLEN) == -ENODEV && st == NULL);
    CHECK(contains(err, "no PCI device 0000:0e:00.0") && contains(err, "upcie-cuda"));
    env_init(&env, "/dev/nvme7n1");
    CHECK(b->open(&env, &st, err, ERRLEN) == -ENODEV && st == NULL);
    CHECK(contains(err, "/dev/nvme7n1") && contains(err, "upcie-cuda"));
    /* This machine's first PCI function: not an NVMe controller on
     * uio_pci_generic (this machine has none). */
    env_init(&env, "0000:00:00.0");
    struct stat sb;
    if (stat("/sys/bus/pci/devices/0000:00:00.0", &sb) == 0) {
        CHECK(b->open(&env, &st, err, ERRLEN) == -ENODEV && st == NULL);
        CHECK(contains(err, "0000:00:00.0") && contains(err, "upcie-cuda"));
    }
    /* Bad engine_args are refused before any device is touched. */
    env_init(&env, "0000:0a:00.0");
    env.engine_args = "queues=0";
    CHECK(b->open(&env, &st, err, ERRLEN) == -EINVAL && st == NULL && contains(err, "queues"));
    /* A controller that looks right in sysfs gets past the checks to CUDA
     * and xNVMe, which refuse it here (no GPU; no such PCI function): the
     * device is named either way. */
    env_init(&env, "0000:0a:00.0");
    env.engine_args = "nsid=3";
    int rc = fr_xc_open_at(&env, sys, &st, err, ERRLEN);
    printf("refusal past the sysfs checks: %d: %s\n", rc, err);
    CHECK(rc < 0 && st == NULL);
    CHECK(contains(err, "xnvme-cuda") && contains(err, "0000:0a:00.0 nsid 3"));
}

static char *slurp_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

/* A kernel that calls the fetch the way the gather kernel does. */
static const char KERNEL[] =
    "\nextern \"C\" __global__ void fr_xc_test_fetch(const fr_dev_store *s, uint64_t page,\n"
    "                                              uint8_t *dst, uint32_t len, int *rc)\n"
    "{\n    fr_dev_counts c = {};\n    *rc = fr_dev_fetch_page(s, page, dst, len, &c);\n}\n";

static int ptx_has_entry(const char *ptx)
{
    return ptx && strstr(ptx, ".entry fr_xc_test_fetch") != NULL;
}

static void nvcc_compile(const char *name, const char *body, const char *includes)
{
    char cu[1024], ptx[1024], cmd[4096];
    snprintf(cu, sizeof(cu), "%s/%s.cu", fr_test_dir(), name);
    snprintf(ptx, sizeof(ptx), "%s/%s.ptx", fr_test_dir(), name);
    FILE *f = fopen(cu, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fprintf(f, "%s%s", body, KERNEL);
    fclose(f);
    /* -Werror: the device half must compile warning-free (xNVMe's
     * libxnvme_spec.h has arrays of structs with flexible members, #1717). */
    snprintf(cmd, sizeof(cmd), "'%s' -std=c++17 -DFR_FETCH_EXTERN -I'%s' %s -arch=sm_80 "
             "-diag-suppress 1717 -Werror all-warnings --ptx -o '%s' '%s'", FR_XC_NVCC,
             FR_XC_DEVICE_DIR, includes, ptx, cu);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "nvcc failed: %s\n", cmd);
    CHECK(rc == 0);
    char *text = slurp_text(ptx);
    CHECK(ptx_has_entry(text));
    free(text);
}

typedef int (*nvrtc_create_t)(void **, const char *, const char *, int, const char *const *,
                              const char *const *);
typedef int (*nvrtc_compile_t)(void *, int, const char *const *);
typedef int (*nvrtc_size_t)(void *, size_t *);
typedef int (*nvrtc_get_t)(void *, char *);
typedef int (*nvrtc_destroy_t)(void **);

/* What the gather core does at run time: NVRTC on fastread_device.cuh +
 * device_source() + the kernel, no include path at all. Run in a child
 * process: NVRTC keeps allocations that LeakSanitizer would report as ours.
 * 0 ok, 1 failed, 2 no NVRTC here. */
static int nvrtc_compile_child(const char *src)
{
    const char *lib = getenv("FASTREAD_TEST_NVRTC");
    void *h = dlopen(lib ? lib : "libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("libnvrtc.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return 2;
    nvrtc_create_t create = (nvrtc_create_t)dlsym(h, "nvrtcCreateProgram");
    nvrtc_compile_t compile = (nvrtc_compile_t)dlsym(h, "nvrtcCompileProgram");
    nvrtc_size_t logsize = (nvrtc_size_t)dlsym(h, "nvrtcGetProgramLogSize");
    nvrtc_get_t getlog = (nvrtc_get_t)dlsym(h, "nvrtcGetProgramLog");
    nvrtc_size_t ptxsize = (nvrtc_size_t)dlsym(h, "nvrtcGetPTXSize");
    nvrtc_get_t getptx = (nvrtc_get_t)dlsym(h, "nvrtcGetPTX");
    nvrtc_destroy_t destroy = (nvrtc_destroy_t)dlsym(h, "nvrtcDestroyProgram");
    CHECK(create && compile && logsize && getlog && ptxsize && getptx && destroy);
    void *prog = NULL;
    if (create && create(&prog, src, "fastread_gather.cu", 0, NULL, NULL) == 0) {
        /* The gather core's options (gather_kernel.c), FR_FETCH_EXTERN
         * defined as it does in the source. */
        const char *opts[] = {"--gpu-architecture=compute_80", "--std=c++17", "-default-device"};
        int rc = compile(prog, 3, opts);
        size_t n = 0;
        if (logsize(prog, &n) == 0 && n > 1) {
            char *log = malloc(n);
            if (log && getlog(prog, log) == 0 && strspn(log, " \n") < strlen(log))
                fprintf(stderr, "NVRTC log:\n%s\n", log);
            free(log);
        }
        CHECK(rc == 0);
        if (rc == 0 && ptxsize(prog, &n) == 0) {
            char *ptx = malloc(n);
            CHECK(ptx && getptx(prog, ptx) == 0 && ptx_has_entry(ptx));
            free(ptx);
        }
        destroy(&prog);
    } else {
        CHECK(0);
    }
    return fr_test_failures ? 1 : 0;
}

static void nvrtc_compile(const char *src)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(nvrtc_compile_child(src));
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (rc == 2)
        printf("NVRTC compile check not run: no libnvrtc here (set FASTREAD_TEST_NVRTC)\n");
    else
        printf("NVRTC compile check: %s\n", rc == 0 ? "ok" : "FAILED");
    CHECK(rc == 0 || rc == 2);
}

static void test_device_compile(void)
{
    const char *text = fr_xc_device_source();
    CHECK(text && strstr(text, "fr_backend_fetch_page") && strstr(text, "xnvme_cuda_reap_at_i"));
    CHECK(text && !strstr(text, "\n#include") && !strstr(text, "\n #include"));
    char dev_hdr[1024];
    snprintf(dev_hdr, sizeof(dev_hdr), "%s/fastread_device.cuh", FR_XC_DEVICE_DIR);
    char *fdev = slurp_text(dev_hdr);
    CHECK(fdev != NULL);
    if (FR_XC_NVCC[0]) {
        /* From the installed headers, as an nvcc user would include them. */
        nvcc_compile("from_headers",
                     "#include \"fastread_device.cuh\"\n#include <libxnvme_util.h>\n"
                     "#include <libxnvme_spec.h>\n#include <libxnvme_cuda.h>\n"
                     "#include \"fastread_xnvme_cuda.cuh\"\n",
                     "-I'" FR_XC_XNVME_INCLUDE "'");
        /* The generated text, with no xNVMe include path. */
        size_t n = strlen(text) + 64;
        char *body = malloc(n);
        CHECK(body != NULL);
        if (body) {
            snprintf(body, n, "#include \"fastread_device.cuh\"\n%s", text);
            nvcc_compile("generated", body, "");
            free(body);
        }
    } else {
        printf("nvcc compile checks not run: nvcc was not found at build time\n");
    }
    if (fdev && text) {
        size_t n = strlen(fdev) + strlen(text) + sizeof(KERNEL) + 64;
        char *src = malloc(n);
        CHECK(src != NULL);
        if (src) {
            snprintf(src, n, "#define FR_FETCH_EXTERN 1\n%s%s%s", fdev, text, KERNEL);
            nvrtc_compile(src);
            free(src);
        }
    }
    free(fdev);
}

/* fr_store_open with backend "xnvme-cuda" on a GPU (the tests' mock CUDA
 * driver) and a plain file: the store reaches the backend, which refuses
 * the path with its reason. Runs in a child started with the mock first on
 * LD_LIBRARY_PATH (the real driver, or xNVMe's libcuda, would be found
 * otherwise). */
static int store_child(void)
{
    char *p = fr_test_write("rows.bin", 16 * 64, 7);
    fr_store_config c;
    fr_store_config_init(&c);
    c.path = p;
    c.rows = 16;
    c.row_bytes = 64;
    c.page_bytes = 4096;
    c.backend = "xnvme-cuda";
    c.device_id = 0;
    fr_store *s = NULL;
    char err[ERRLEN] = "";
    int rc = fr_store_open(&c, &s, err, ERRLEN);
    printf("store refusal: %d: %s\n", rc, err);
    CHECK(rc < 0 && s == NULL);
    CHECK(contains(err, "xnvme-cuda") && contains(err, p));
    if (s)
        fr_store_close(s);
    free(p);
    return fr_test_finish("test_gather_xnvme_cuda (store)");
}

static void test_store_refusal(void)
{
    char lib[1024];
    snprintf(lib, sizeof(lib), "%s/libcuda.so.1", FR_XC_MOCK_CUDA_DIR);
    struct stat sb;
    if (stat(lib, &sb) != 0) {
        printf("store-level refusal not run: no mock CUDA driver at %s\n", lib);
        return;
    }
    const char *old = getenv("LD_LIBRARY_PATH");
    char env[4096];
    snprintf(env, sizeof(env), "%s%s%s", FR_XC_MOCK_CUDA_DIR, old ? ":" : "", old ? old : "");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("LD_LIBRARY_PATH", env, 1);
        execl("/proc/self/exe", "test_gather_xnvme_cuda", "store", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
#endif

int main(int argc, char **argv)
{
#ifdef FASTREAD_HAVE_XNVME_CUDA
    if (argc > 1 && strcmp(argv[1], "store") == 0)
        return store_child();
#endif
    (void)argc, (void)argv;
    test_geometry_cases();
    test_geometry_cover();
    test_resolve();
    test_args();

    char why[ERRLEN];
    int rc = fr_xc_probe(why, sizeof(why));
#ifndef FASTREAD_HAVE_XNVME_CUDA
    CHECK(rc == -ENOTSUP && contains(why, "xnvme-cuda"));
    CHECK(fr_xc_device_source() == NULL);
    void *st = (void *)why;
    char err[ERRLEN];
    CHECK(fr_xc_open_at(NULL, NULL, &st, err, ERRLEN) == -ENOTSUP && st == NULL);
    if (fr_test_failures)
        return fr_test_finish("test_gather_xnvme_cuda");
    fr_test_cleanup();
    printf("skip: %s (mapping, URI and argument checks passed)\n", why);
    return 77;
#else
    test_device_compile(); /* needs no device, nor upcie-cuda in the library */
    if (rc != 0) {
        /* Built with the header, but the loaded libxnvme lacks upcie-cuda. */
        CHECK(rc == -ENOTSUP && contains(why, "xnvme-cuda"));
        if (fr_test_failures)
            return fr_test_finish("test_gather_xnvme_cuda");
        fr_test_cleanup();
        printf("skip: %s\n", why);
        return 77;
    }
    printf("probe: %s\n", why);
    test_refusal();
    test_store_refusal();
    return fr_test_finish("test_gather_xnvme_cuda");
#endif
}

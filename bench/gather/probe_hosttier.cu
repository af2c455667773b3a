// probe_hosttier: how fast can GPU threads gather random rows from
// page-locked host memory, by how that memory was allocated?
//
// The question behind it (issue 12): the host tier gathers 98M rows/s from a
// 100 MB table but 32M from an 8 GiB one, as does a naive CuPy gather over a
// cudaHostRegister'ed file. If the GPU's address translation over 4 KiB
// host pages is the limit, memory the GPU maps with large pages should not
// fall off. Allocations compared, each filled with row ids and gathered by
// the same kernel (a warp per 512-byte row, 16-byte loads):
//   hostalloc  cuMemHostAlloc(PORTABLE|DEVICEMAP)         (fastread today)
//   register   aligned_alloc(4 KiB) + cuMemHostRegister
//   thp        mmap + MADV_HUGEPAGE + cuMemHostRegister
//   hugetlb    mmap(MAP_HUGETLB, 2 MiB) + cuMemHostRegister (needs nr_hugepages)
//   vmm        cuMemCreate(HOST_NUMA) mapped with cuMemMap, read by the device
//
// ORDER (environment): random (default), or bucket:K: the ids sorted by
// id >> K (stable), to see whether address locality within a gather helps
// (bucket:0 is a full sort).
//
// Build: nvcc -O2 -arch=sm_90 -o probe_hosttier probe_hosttier.cu
// Run:   probe_hosttier TABLE_BYTES N_IDS MODE...
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                   \
    do {                                                                        \
        CUresult r_ = (x);                                                      \
        if (r_ != CUDA_SUCCESS) {                                               \
            fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x,  \
                    (int)r_);                                                   \
            return 1;                                                           \
        }                                                                       \
    } while (0)


// The driver API through the runtime's entry points: nothing to link
// against but cudart (the build machine may have no libcuda).
template <class F> static F driver_fn(const char *name)
{
    void *p = 0;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess || !p) {
        fprintf(stderr, "no driver function %s\n", name);
        exit(1);
    }
    return (F)p;
}
#define DRV(name) static const auto d_##name = driver_fn<decltype(&name)>(#name)

static const size_t ROW = 512;

__global__ void fill_rows(unsigned long long *base, size_t rows)
{
    size_t words = ROW / 8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * words;
         i += (size_t)gridDim.x * blockDim.x)
        base[i] = (i / words) * 1000003ull + (i % words);
}

// A warp per row: lane L loads bytes [16L, 16L+16) of the row (one 512-byte
// request per warp), UNROLL rows per warp in flight.
template <int UNROLL>
__global__ void gather(const uint4 *src, const long long *ids, size_t n, uint4 *out)
{
    unsigned lane = threadIdx.x & 31;
    size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t r0 = warp * UNROLL; r0 < n; r0 += nwarps * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            if (r0 + u < n)
                v[u] = __ldcg(src + ids[r0 + u] * 32 + lane);
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            if (r0 + u < n)
                out[(r0 + u) * 32 + lane] = v[u];
    }
}

static unsigned long long splitmix(unsigned long long *s)
{
    unsigned long long z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
    DRV(cuInit);
    DRV(cuDeviceGet);
    DRV(cuDevicePrimaryCtxRetain);
    DRV(cuCtxSetCurrent);
    DRV(cuMemHostAlloc);
    DRV(cuMemHostGetDevicePointer);
    DRV(cuMemHostRegister);
    DRV(cuMemGetAllocationGranularity);
    DRV(cuMemCreate);
    DRV(cuMemAddressReserve);
    DRV(cuMemMap);
    DRV(cuMemSetAccess);
    DRV(cuMemFreeHost);
    DRV(cuMemHostUnregister);
    DRV(cuMemUnmap);
    DRV(cuMemAddressFree);
    DRV(cuMemRelease);
    DRV(cuGetErrorString);
    if (argc < 4) {
        fprintf(stderr, "usage: %s TABLE_BYTES N_IDS MODE...\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[1], 0, 0), n = strtoull(argv[2], 0, 0);
    size_t rows = bytes / ROW;
    bytes = rows * ROW;
    CK(d_cuInit(0));
    CUdevice dev;
    CK(d_cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(d_cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(d_cuCtxSetCurrent(ctx));
    std::vector<long long> hid(n);
    unsigned long long seed = 42;
    for (size_t i = 0; i < n; i++)
        hid[i] = (long long)(splitmix(&seed) % rows);
    const char *order = getenv("ORDER");
    if (order && !strncmp(order, "bucket:", 7)) {
        int k = atoi(order + 7);
        std::stable_sort(hid.begin(), hid.end(),
                         [k](long long a, long long b) { return (a >> k) < (b >> k); });
    }
    long long *did;
    uint4 *dout;
    cudaMalloc(&did, n * 8);
    cudaMalloc(&dout, n * ROW);
    cudaMemcpy(did, hid.data(), n * 8, cudaMemcpyHostToDevice);
    std::vector<unsigned long long> check(n * ROW / 8);
    for (int m = 3; m < argc; m++) {
        const char *mode = argv[m];
        void *host = 0;
        CUdeviceptr dptr = 0;
        CUmemGenericAllocationHandle vh = 0;
        size_t vsize = 0;
        int registered = 0;
        if (!strcmp(mode, "hostalloc")) {
            CK(d_cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
            CK(d_cuMemHostGetDevicePointer(&dptr, host, 0));
        } else if (!strcmp(mode, "register") || !strcmp(mode, "thp") || !strcmp(mode, "hugetlb")) {
            size_t len = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
            int flags = MAP_PRIVATE | MAP_ANONYMOUS;
            if (!strcmp(mode, "hugetlb"))
                flags |= MAP_HUGETLB;
            host = mmap(0, len, PROT_READ | PROT_WRITE, flags, -1, 0);
            if (host == MAP_FAILED) {
                perror(mode);
                continue;
            }
            if (!strcmp(mode, "thp") && madvise(host, len, MADV_HUGEPAGE))
                perror("madvise");
            if (!strcmp(mode, "register") && madvise(host, len, MADV_NOHUGEPAGE))
                perror("madvise");
            memset(host, 0, len); // fault it in (huge pages where granted)
            CK(d_cuMemHostRegister(host, len, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
            CK(d_cuMemHostGetDevicePointer(&dptr, host, 0));
            registered = 1;
            vsize = len;
        } else if (!strcmp(mode, "vmm")) {
            CUmemAllocationProp p;
            memset(&p, 0, sizeof p);
            p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
            p.location.id = 0;
            size_t g = 0;
            CK(d_cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
            vsize = (bytes + g - 1) / g * g;
            CK(d_cuMemCreate(&vh, vsize, &p, 0));
            CK(d_cuMemAddressReserve(&dptr, vsize, g, 0, 0));
            CK(d_cuMemMap(dptr, vsize, 0, vh, 0));
            CUmemAccessDesc a[2];
            memset(a, 0, sizeof a);
            a[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            a[0].location.id = 0;
            a[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CK(d_cuMemSetAccess(dptr, vsize, a, 1));
            printf("vmm granularity %zu\n", g);
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            continue;
        }
        fill_rows<<<1024, 256>>>((unsigned long long *)dptr, rows);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "%s: fill failed\n", mode);
            return 1;
        }
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int unroll : {1, 4}) {
            std::vector<float> ms;
            for (int rep = 0; rep < 7; rep++) {
                cudaEventRecord(e0);
                if (unroll == 1)
                    gather<1><<<132 * 8, 256>>>((const uint4 *)dptr, did, n, dout);
                else
                    gather<4><<<132 * 8, 256>>>((const uint4 *)dptr, did, n, dout);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float t;
                cudaEventElapsedTime(&t, e0, e1);
                ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            cudaMemcpy(check.data(), dout, n * ROW, cudaMemcpyDeviceToHost);
            size_t bad = 0;
            for (size_t i = 0; i < n; i += 997)
                for (size_t w = 0; w < ROW / 8; w++)
                    bad += check[i * ROW / 8 + w] != (unsigned long long)hid[i] * 1000003ull + w;
            printf("%-9s %-9s table %6.2f GiB ids %8zu unroll %d: median %8.3f ms  %7.1f M rows/s  %6.1f GB/s  %s\n",
                   mode, order ? order : "random", bytes / 1073741824.0, n, unroll, ms[3], n / (ms[3] * 1e3),
                   n * ROW / (ms[3] * 1e6), bad ? "WRONG ROWS" : "ok");
        }
        if (!strcmp(mode, "hostalloc"))
            d_cuMemFreeHost(host);
        else if (registered) {
            d_cuMemHostUnregister(host);
            munmap(host, vsize);
        } else if (vh) {
            d_cuMemUnmap(dptr, vsize);
            d_cuMemAddressFree(dptr, vsize);
            d_cuMemRelease(vh);
        }
        fflush(stdout);
    }
    return 0;
}

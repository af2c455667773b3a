"""fastread.FeatureStore on a GPU: the host and proxy backends against NumPy,
torch and CuPy in and out, streams, the HBM cache and the host tier seen
through stats(), users' own kernels over the store's device view, and
close() during a gather. Skipped, with the reason, where there is no GPU.

On the GPU machine: `cd tests && python3 -m pytest -q test_features_gpu.py`.
"""
import errno
import os
import threading
import time

import numpy as np
import pytest

import fastread
from fastread.features import FeatureStore, device_include_dir

_ok, _why = fastread._core.gpu_probe(0)
pytestmark = pytest.mark.skipif(not _ok, reason=f"no CUDA device here: {_why}")

try:
    import torch
    if not torch.cuda.is_available():
        torch = None
except ImportError:
    torch = None
try:
    import cupy
except ImportError:
    cupy = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch with CUDA is not installed")
needs_cupy = pytest.mark.skipif(cupy is None, reason="cupy is not installed")

ROWS, COLS = 20_000, 32  # 128-byte rows: 512 to a 64 KiB page


@pytest.fixture(scope="module")
def table(disk_tmp):
    arr = np.random.default_rng(7).standard_normal((ROWS, COLS)).astype(np.float32)
    path = os.path.join(disk_tmp, "gpu-feat.npy")
    np.save(path, arr)
    return arr, path


def open_store(path, backend, **kw):
    try:
        return FeatureStore(path, backend=backend, device_id=0, **kw)
    except RuntimeError as e:
        if "not available in this build" in str(e):
            pytest.skip(f"backend {backend!r}: {e}")
        raise


BACKENDS = ["host", "proxy"]


def host(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.cpu().numpy()
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy.asnumpy(x)
    return np.asarray(x)


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_torch_in_torch_out(table, backend, id_dtype):
    arr, path = table
    rng = np.random.default_rng(1)
    ids_np = rng.integers(0, ROWS, 50_000)  # duplicates, unsorted
    ids = torch.from_numpy(ids_np.astype(id_dtype)).cuda()
    with open_store(path, backend) as s:
        got = s.gather(ids)
        assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.float32
        assert tuple(got.shape) == (50_000, COLS)
        np.testing.assert_array_equal(host(got), arr[ids_np])
        # Again: now (partly) from the cache, same rows.
        np.testing.assert_array_equal(host(s.gather(ids)), arr[ids_np])
        # To the host from device ids.
        np.testing.assert_array_equal(host(s.gather(ids, device="cpu")), arr[ids_np])


@needs_cupy
@pytest.mark.parametrize("backend", BACKENDS)
def test_cupy_in_cupy_out(table, backend):
    arr, path = table
    ids_np = np.random.default_rng(2).integers(0, ROWS, 10_000)
    with open_store(path, backend) as s:
        got = s.gather(cupy.asarray(ids_np, dtype=cupy.int32))
        assert isinstance(got, cupy.ndarray) and got.dtype == cupy.float32
        np.testing.assert_array_equal(cupy.asnumpy(got), arr[ids_np])


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_ids_to_cuda(table, backend):
    if torch is None and cupy is None:
        pytest.skip("neither torch nor cupy is installed")
    arr, path = table
    ids = np.array([[5, 19_999], [5, 0]])
    with open_store(path, backend) as s:
        got = s.gather(ids, device="cuda")
        assert type(got).__module__.split(".")[0] == ("torch" if torch is not None else "cupy")
        np.testing.assert_array_equal(host(got), arr[ids])
        assert s.gather(np.zeros(0, np.int64), device="cuda").shape[0] == 0


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_out_and_errors_on_device(table, backend):
    arr, path = table
    with open_store(path, backend) as s:
        ids = torch.tensor([3, 1, 3], device="cuda")
        out = torch.empty((3, COLS), device="cuda")
        assert s.gather(ids, out=out) is out
        np.testing.assert_array_equal(host(out), arr[[3, 1, 3]])
        with pytest.raises(ValueError, match=r"out has shape \(2, 32\)"):
            s.gather(ids, out=torch.empty((2, COLS), device="cuda"))
        with pytest.raises(TypeError, match="out has dtype torch.float64"):
            s.gather(ids, out=torch.empty((3, COLS), dtype=torch.float64, device="cuda"))
        with pytest.raises(ValueError, match="C-contiguous"):
            s.gather(ids, out=torch.empty((COLS, 3), device="cuda").T)
        with pytest.raises(ValueError, match="out is on cpu"):
            s.gather(ids, out=torch.empty((3, COLS)))
        with pytest.raises(TypeError, match="ids must be int32 or int64, got torch.float32"):
            s.gather(torch.tensor([1.0], device="cuda"))
        bad = torch.tensor([0, 1, ROWS + 5, 2, -3], device="cuda")
        with pytest.raises(IndexError, match=rf"id {ROWS + 5} at position 2 is out of range"):
            s.gather(bad)
        # The store still works after a failed gather.
        np.testing.assert_array_equal(host(s.gather(ids)), arr[[3, 1, 3]])


@needs_torch
def test_ids_on_another_gpu(table):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    arr, path = table
    with open_store(path, "host") as s:
        with pytest.raises(ValueError, match="ids on GPU 1, but feature store .* serves GPU 0"):
            s.gather(torch.tensor([1], device="cuda:1"))


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_streams(table, backend):
    arr, path = table
    ids_np = np.random.default_rng(3).integers(0, ROWS, 30_000)
    with open_store(path, backend) as s:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # torch's current stream by default
            ids = torch.from_numpy(ids_np).cuda()
            got = s.gather(ids)
        side.synchronize()
        np.testing.assert_array_equal(host(got), arr[ids_np])
        other = torch.cuda.Stream()
        ids = torch.from_numpy(ids_np).cuda()
        torch.cuda.current_stream().synchronize()
        got = s.gather(ids, stream=other)  # explicit stream object
        np.testing.assert_array_equal(host(got), arr[ids_np])
        got = s.gather(ids, stream=other.cuda_stream)  # as an address
        np.testing.assert_array_equal(host(got), arr[ids_np])


@needs_torch
@pytest.mark.parametrize("fetch", ["auto", "rows"])
def test_concurrent_gathers_on_streams(table, monkeypatch, fetch):
    # "rows": every row through row lists from 4 threads at once, on a
    # cache of 64 pages of 16 KiB (the device cache's least; the table has 157).
    arr, path = table
    errors = []
    monkeypatch.setenv("FASTREAD_GATHER_FETCH", fetch)
    sizes = dict(cache_bytes=32 << 20) if fetch == "auto" else dict(cache_bytes=1 << 20, page_bytes=16 << 10)
    with open_store(path, "proxy", **sizes) as s:
        def work(seed):
            rng = np.random.default_rng(seed)
            stream = torch.cuda.Stream()
            try:
                with torch.cuda.stream(stream):
                    for _ in range(10):
                        ids_np = rng.integers(0, ROWS, 20_000)
                        got = s.gather(torch.from_numpy(ids_np).cuda())
                        if not np.array_equal(host(got), arr[ids_np]):
                            errors.append(f"thread {seed}: wrong rows")
            except Exception as e:  # reported below
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert s.stats()["gathers"] == 40


@needs_torch
def test_cache_hits_misses_evictions(table):
    arr, path = table
    page = 4096
    rows_per_page = page // (COLS * 4)  # 32
    pages = -(-ROWS // rows_per_page)    # 625
    # 128 pages of cache for a table of 625.
    with open_store(path, "proxy", cache_bytes=128 * page, page_bytes=page) as s:
        assert s.backend == "proxy"
        hot = torch.arange(0, 2 * rows_per_page, device="cuda")  # two pages
        s.gather(hot)
        first = s.stats()
        assert first["misses"] == 2 and first["storage_reads"] >= 2
        assert first["bytes_read"] >= 2 * page
        s.gather(hot)
        second = s.stats()
        assert second["misses"] == 2, "the hot pages were read again"
        assert second["hits"] - first["hits"] == hot.numel()
        everything = torch.arange(ROWS, device="cuda")
        np.testing.assert_array_equal(host(s.gather(everything)), arr)
        st = s.stats()
        assert st["evictions"] > 0 and st["misses"] >= pages
        t = st["tiers"]
        assert t["device_cache"] + t["host_tier"] + t["storage"] == st["rows"]
        m = s.memory()
        assert m["device_cache"] == 128 * page and m["rings"] > 0
        assert m["total"] == sum(v for k, v in m.items() if k != "total")


def test_cache_too_big_for_the_gpu(disk_tmp):
    # The cache is at most the table, so the table must outgrow the GPU: a
    # sparse 1 TiB file (nothing is read at open).
    path = os.path.join(disk_tmp, "gpu-sparse.bin")
    with open(path, "wb") as f:
        f.truncate(1 << 40)
    try:
        with pytest.raises(MemoryError, match=r"cache of \d+ bytes .* does not fit in GPU 0"):
            FeatureStore(path, np.uint8, (-1, 4096), backend="proxy", device_id=0,
                         cache_bytes="1T")
    finally:
        os.unlink(path)


def test_nvrtc_missing_is_named(table, tmp_path, monkeypatch):
    _, path = table
    # NVRTC only (no built-in PTX), an empty kernel cache, NVRTC pointed at nothing.
    monkeypatch.setenv("FASTREAD_KERNEL_SOURCE", "nvrtc")
    monkeypatch.setenv("FASTREAD_NVRTC", str(tmp_path / "none"))
    try:
        s = FeatureStore(path, backend="proxy", device_id=0, nvrtc_path=str(tmp_path / "none"),
                         kernel_cache_dir=str(tmp_path / "kernels"))
    except RuntimeError as e:
        assert "NVRTC" in str(e) and "gpu-feat.npy" in str(e)
        return
    with s:
        pytest.skip(f"the core found NVRTC elsewhere: {s.kernel_source}")


def test_auto_backend_and_row_sizes(disk_tmp):
    # 12-byte rows fit no power-of-two page: "auto" says so and runs the host
    # backend; "proxy" refuses, naming the page and the row.
    path = os.path.join(disk_tmp, "gpu-rows12.npy")
    np.save(path, np.ones((1000, 3), np.float32))
    with FeatureStore(path, device_id=0) as s:
        assert s.backend == "host" and "12 bytes" in s.backend_note
    with pytest.raises(ValueError, match=r"page_bytes=65536 is not a multiple of the row size "
                                         r"\(12 bytes"):
        FeatureStore(path, device_id=0, backend="proxy", page_bytes=65536)


@pytest.mark.parametrize("cols", [128, 1024, 4096])
@pytest.mark.parametrize("mapped", ["1", "0"])
def test_row_fetches_go_as_row_lists(disk_tmp, monkeypatch, cols, mapped):
    # Sparse gathers over a table larger than the cache read rows past it, a
    # warp's rows as ring requests of as many rows as a 64 KiB staging page
    # holds (512-byte rows: 32; 4 KiB: 16, two lists a warp; 16 KiB: 4,
    # eight), served by copies from a mapping of the cached file or by
    # reads (FASTREAD_PROXY_MAPPED=0). Every row is checked, duplicates
    # within a warp included.
    rows = (16 << 20) // (cols * 4)
    arr = np.random.default_rng(cols).standard_normal((rows, cols)).astype(np.float32)
    path = os.path.join(disk_tmp, f"gpu-lists-{cols}.npy")
    np.save(path, arr)
    monkeypatch.setenv("FASTREAD_GATHER_FETCH", "rows")
    monkeypatch.setenv("FASTREAD_PROXY_MAPPED", mapped)
    ids = np.random.default_rng(1).integers(0, rows, 3000)
    ids[40:52] = ids[33]
    # 64 pages of 64 KiB, the device cache's least, a quarter of the table.
    with open_store(path, "proxy", cache_bytes=4 << 20, page_bytes=64 << 10) as s:
        out = host(s.gather(ids, device="cuda"))
        np.testing.assert_array_equal(out, arr[ids])
        st = s.stats()
        assert st["direct_rows"] == len(ids) and st["misses"] == 0
        assert st["storage_reads"] >= len(np.unique(ids))
        assert (st["mapped_reads"] > 0) == (mapped == "1"), st


@needs_torch
def test_host_tier(table):
    arr, path = table
    ids_np = np.random.default_rng(4).integers(0, ROWS, 40_000)
    # The whole file fits the host tier: every row is read from pinned host memory.
    with open_store(path, "proxy", host_bytes="auto") as s:
        got = s.gather(torch.from_numpy(ids_np).cuda())
        np.testing.assert_array_equal(host(got), arr[ids_np])
        st = s.stats()
        assert st["host_tier_rows"] == len(ids_np) and st["tiers"]["storage"] == 0
        assert s.memory()["host_tier"] >= arr.nbytes
    # Only hot rows in a small tier.
    hot = np.arange(0, 1000)
    with open_store(path, "proxy", host_bytes=1000 * COLS * 4, hot_ids=hot) as s:
        got = s.gather(torch.from_numpy(np.r_[hot[:500], [15_000, 15_001]]).cuda())
        np.testing.assert_array_equal(host(got), arr[np.r_[hot[:500], [15_000, 15_001]]])
        assert s.stats()["host_tier_rows"] == 500


@needs_cupy
def test_users_kernel_reads_rows_through_device_view(table):
    arr, path = table
    src = r'''
    #include "fastread_device.cuh"
    extern "C" __global__ void read_rows(const fr_dev_store *s, const long long *ids, int n,
                                         unsigned char *out, int *status)
    {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= n)
            return;
        fr_dev_counts cnt;
        for (int k = 0; k < FR_NCOUNTERS; k++)
            cnt.c[k] = 0;
        int rc = fr_dev_read_row(s, ids[i], out + (unsigned long long)i * s->row_bytes, &cnt);
        if (rc)
            atomicCAS(status, 0, rc);
    }
    '''
    mod = cupy.RawModule(code=src, options=("-I" + device_include_dir(), "--std=c++17"))
    kernel = mod.get_function("read_rows")
    ids_np = np.random.default_rng(5).integers(0, ROWS, 1000)
    ids = cupy.asarray(ids_np, dtype=cupy.int64)

    def launch(view, which, n):
        out = cupy.zeros((n, COLS), dtype=cupy.float32)
        status = cupy.zeros(1, dtype=cupy.int32)
        kernel(((n + 127) // 128,), (128,), (np.uint64(view), which, np.int32(n), out, status))
        cupy.cuda.runtime.deviceSynchronize()
        return out, int(status[0])

    # The proxy's service threads poll only while a gather of the store runs,
    # so a user's kernel reads rows the store holds on the GPU side: here,
    # rows its own gather just brought into the HBM cache ...
    with open_store(path, "proxy") as s:
        assert s.device_view != 0
        s.gather(ids)
        hits = s.stats()["hits"]
        out, status = launch(s.device_view, ids, 1000)
        assert status == 0
        np.testing.assert_array_equal(cupy.asnumpy(out), arr[ids_np])
        assert s.stats()["hits"] == hits  # the user's kernel keeps its own counts
        # An id out of range is the kernel's to report: FR_DEV_ERANGE.
        _, status = launch(s.device_view, cupy.asarray([ROWS], dtype=cupy.int64), 1)
        assert status == -errno.ERANGE
    # ... or every row, from the page-locked host tier.
    with open_store(path, "proxy", host_bytes="auto") as s:
        out, status = launch(s.device_view, ids, 1000)
        assert status == 0
        np.testing.assert_array_equal(cupy.asnumpy(out), arr[ids_np])


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_close_during_gather(disk_tmp, backend):
    path = os.path.join(disk_tmp, "gpu-close.npy")
    arr = np.arange(500_000 * 32, dtype=np.float32).reshape(500_000, 32)
    np.save(path, arr)
    s = open_store(path, backend, cache_bytes=64 << 20)
    ids = torch.randint(0, 500_000, (2_000_000,), device="cuda")
    outcome, started = [], threading.Event()

    def loop():
        try:
            while True:
                started.set()
                s.gather(ids)
        except OSError as e:
            outcome.append(("cancelled", e.errno, str(e)))
        except ValueError as e:
            outcome.append(("closed", None, str(e)))
        except BaseException as e:
            outcome.append(("error", None, repr(e)))

    t = threading.Thread(target=loop)
    t.start()
    started.wait(30)
    time.sleep(0.5)
    s.close()
    t.join(60)
    assert not t.is_alive(), "a gather hung after close()"
    kind, err, msg = outcome[0]
    assert kind in ("cancelled", "closed"), msg
    if kind == "cancelled":
        assert err == errno.ECANCELED


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_failure_is_an_exception(disk_tmp, backend):
    # The file shrinks under an open store: reads of the lost rows fail; the
    # gather raises (never a hung kernel), naming the file.
    path = os.path.join(disk_tmp, "gpu-shrink.bin")
    arr = np.ones((100_000, 32), np.float32)
    arr.tofile(path)
    with open_store(path, backend, dtype=np.float32, shape=(100_000, 32), timeout_ms=5000) as s:
        os.truncate(path, 1 << 20)
        t0 = time.monotonic()
        with pytest.raises(OSError, match="gpu-shrink.bin"):
            s.gather(torch.tensor([99_999, 0], device="cuda"))
        assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("backend", BACKENDS)
def test_dali_gather_on_gpu(table, backend):
    dali = pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed")
    if torch is None and cupy is None:
        pytest.skip("neither torch nor cupy is installed")
    from nvidia.dali import pipeline_def
    from fastread.dali.gather import gather

    arr, path = table
    train = np.random.default_rng(8).choice(ROWS, 1000, replace=False)
    with open_store(path, backend) as s:
        @pipeline_def(batch_size=256, num_threads=2, device_id=0, prefetch_queue_depth=2)
        def pipe():
            return gather(s, train, random_shuffle=True, seed=1)

        p = pipe()
        p.build()
        for epoch in range(2):
            seen = []
            while True:
                try:
                    rows, ids = p.run()
                except StopIteration:
                    p.reset()
                    break
                r = rows.as_cpu().as_array()
                i = ids.as_cpu().as_array().reshape(-1)
                np.testing.assert_array_equal(r, arr[i])
                seen.append(i)
            assert sorted(np.concatenate(seen)) == sorted(train), f"epoch {epoch}"
        del p


@needs_torch
def test_timeout_is_a_timeout_error(table, monkeypatch):
    # The core's fault injection: every proxy read sleeps 300 ms; device-side
    # waits give up after 50 ms. The gather raises, naming timeout_ms, in
    # bounded time; closing that store after it is clean, and a store opened
    # without the delay gathers correctly (the delay is read at open).
    arr, path = table
    monkeypatch.setenv("FASTREAD_PROXY_DELAY_US", "300000")
    with open_store(path, "proxy", timeout_ms=50) as s:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="timeout_ms"):
            s.gather(torch.arange(0, ROWS, 97, device="cuda"))
        assert time.monotonic() - t0 < 30
    monkeypatch.delenv("FASTREAD_PROXY_DELAY_US")
    with open_store(path, "proxy", timeout_ms=5000) as s:
        ids = torch.arange(0, ROWS, 97, device="cuda")
        np.testing.assert_array_equal(host(s.gather(ids)), arr[::97])


# -- hot rows and per-gather routes (issue 31) ---------------------------------

HOT_ROWS = 131_072  # x 512 B = 64 MiB, 1024 pages of 64 KiB; an 8 MiB cache


@pytest.fixture(scope="module")
def big_table(disk_tmp):
    arr = np.random.default_rng(31).standard_normal((HOT_ROWS, 128)).astype(np.float32)
    path = os.path.join(disk_tmp, "gpu-hot.npy")
    np.save(path, arr)
    return arr, path


def hbm_share(before, after, n):
    return ((after["hits"] - before["hits"]) + (after["row_hits"] - before["row_hits"])) / n


def gather_checked(s, arr, ids):
    np.testing.assert_array_equal(host(s.gather(ids, device="cuda")), arr[ids])


def test_repeated_rows_are_admitted_and_hit(big_table, monkeypatch):
    # 1500 rows scattered over the table, each asked 4 times a batch (6000
    # ids, ~6 a page: row fetches). The hot-row cache (a quarter of the
    # 8 MiB cache: 4096 rows, 2048 candidates a gather) has room, so every
    # row goes in at first sight, after the first gather: the second and
    # third are served from HBM, and no row is admitted twice.
    # FASTREAD_GATHER_ADMIT=off: never.
    arr, path = big_table
    rng = np.random.default_rng(5)
    ids = np.repeat(rng.choice(HOT_ROWS, 1500, replace=False), 4)
    rng.shuffle(ids)
    monkeypatch.delenv("FASTREAD_GATHER_ADMIT", raising=False)
    with FeatureStore(path, device_id=0, cache_bytes=8 << 20) as s:
        assert s.backend == "proxy"
        assert s.memory()["device_cache"] == 8 << 20
        gather_checked(s, arr, ids)
        first = s.stats()
        assert first["host_routed"] == 0 and first["route"].startswith("device: warm"), first
        assert first["direct_rows"] > 0.9 * len(ids), first
        assert first["admitted"] >= 0.9 * 1500, first
        gather_checked(s, arr, ids)
        second = s.stats()
        assert hbm_share(first, second, len(ids)) >= 0.9, second
        assert second["admitted"] <= 1500 + 50, second  # about once each
        gather_checked(s, arr, ids)
        third = s.stats()
        assert hbm_share(second, third, len(ids)) >= 0.9, third
        assert third["tiers"]["device_cache"] == third["hits"] + third["row_hits"]
    monkeypatch.setenv("FASTREAD_GATHER_ADMIT", "off")
    with FeatureStore(path, device_id=0, cache_bytes=8 << 20) as s:
        for _ in range(3):
            gather_checked(s, arr, ids)
        st = s.stats()
        assert st["row_hits"] == 0 and st["admitted"] == 0, st
        assert st["direct_rows"] > 0.9 * 3 * len(ids), st


def test_power_law_ids_gathered_twice(big_table, monkeypatch):
    # Zipf(1.2) ids over a shuffled table (the benchmark's "hot"), sparse
    # enough for row fetches: gathered a third time, most rows come from HBM
    # with the admission policy, far fewer without.
    arr, path = big_table
    rng = np.random.default_rng(12)
    perm = rng.permutation(HOT_ROWS)
    ids = perm[(rng.zipf(1.2, 20_000) - 1) % HOT_ROWS]
    shares = {}
    for admit in ("auto", "off"):
        monkeypatch.setenv("FASTREAD_GATHER_ADMIT", admit)
        with FeatureStore(path, device_id=0, cache_bytes=8 << 20) as s:
            gather_checked(s, arr, ids)
            gather_checked(s, arr, ids)
            before = s.stats()
            gather_checked(s, arr, ids)
            after = s.stats()
            shares[admit] = hbm_share(before, after, len(ids))
            if admit == "off":
                assert after["row_hits"] == 0
    assert shares["auto"] >= 0.6, shares
    assert shares["off"] <= shares["auto"] - 0.1, shares


def test_auto_routes_cold_gathers_to_the_host_path(big_table, monkeypatch):
    # Backend "auto": warm gathers stay on the device; with the file out of
    # the page cache (posix_fadvise; where it cannot leave, skipped) a
    # gather of rows not in HBM goes to the host path, rows still right;
    # an explicit backend="proxy" is never routed.
    arr, path = big_table
    monkeypatch.setenv("FASTREAD_PROXY_MAPPED", "0")  # mapped pages would stay cached
    rng = np.random.default_rng(8)

    def drop():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages would stay
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    with FeatureStore(path, device_id=0, cache_bytes=8 << 20) as s:
        gather_checked(s, arr, rng.integers(0, HOT_ROWS, 5000))
        assert s.stats()["route"].startswith("device: warm")
        drop()
        gather_checked(s, arr, rng.integers(0, HOT_ROWS, 5000))
        st = s.stats()
        if st["route"].startswith("device: warm"):
            pytest.skip(f"{path} stays in the page cache here")
        assert st["host_routed"] == 1 and st["route"].startswith("host: cold"), st
        assert "cold" in st["route_rule"]
    with open_store(path, "proxy", cache_bytes=8 << 20) as s:
        drop()
        gather_checked(s, arr, rng.integers(0, HOT_ROWS, 5000))
        st = s.stats()
        assert st["host_routed"] == 0 and st["route"] == "", st

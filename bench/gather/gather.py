"""Row gathers timed: feature rows for batches of ids, from a file to the GPU
(or the host), fastread's FeatureStore against the usual ways. Uses the
installed fastread.

    python3 bench/gather/gather.py --json gather.json --plot gather.png          # GPU machine
    python3 bench/gather/gather.py --device cpu --rows 100000 --states warm       # anywhere (smoke)

The table is ``--rows`` x ``--dim`` float32 (16M x 128, 8 GiB by default),
made once under ``--workdir`` (values encode row and column, so outputs are
checked). Ids come in batches of ``--batches`` (10k, 100k, 1M), drawn
``uniform`` or ``zipf`` (power-law popularity over a random permutation of
the rows, as neighbour sampling gives). States:

* ``warm``: the file in the page cache (read once before); FeatureStores
  start with an empty HBM cache each repeat.
* ``cold``: the page cache dropped before every repeat (``sync; echo 3 >
  /proc/sys/vm/drop_caches``; needs root) and every reader reopened (a live
  mmap keeps its pages).
* ``hot``: FeatureStore proxy modes with the batch's rows already in the
  HBM cache (the same ids gathered once first).

Modes (``--modes``; unavailable ones are reported with the reason):

* ``memmap``: ``np.memmap`` fancy index (+ ``torch pin_memory().cuda()``, or
  the same through CuPy's pinned memory without torch).
* ``uva``: the whole file in page-locked host memory (``cudaHostRegister``),
  gathered by a CuPy kernel reading it over PCIe (DGL's pinned gathers);
  when it fits in RAM.
* ``hbm``: the whole table in GPU memory, CuPy ``arr[ids]``: the ceiling.
* ``kvikio``: ``kvikio.CuFile.pread`` per row into GPU memory (when kvikio
  imports; batches up to ``--kvikio-max`` ids).
* ``host``: FeatureStore, backend "host".
* ``proxy``, ``proxy-hosttier``: FeatureStore, backend "proxy", without and
  with the page-locked host tier (``host_bytes="auto"``).
* ``proxy-hosttier-idorder``: the same with the locality order off
  (``FASTREAD_GATHER_ORDER=off``): rows read in the ids' own order.
* ``proxy-smallcache``: proxy with an HBM cache of ``--small-cache`` (the
  table larger than the cache).
* ``default``: ``FeatureStore(path, device_id=0)``, every other setting its
  default (backend "auto": per-gather routing; a 1 GiB cache with its row
  cache): what a user gets.

Reported per (state, distribution, batch, mode): rows/s and GB/s of the
median of ``--repeat`` timed gathers after ``--warmup`` untimed ones, plus
the machine, the disk's 4 KiB random-read IOPS and 1 MiB sequential ceiling
(measured with fastread's own O_DIRECT range reads), and each FeatureStore's
stats() and memory(). JSON is rewritten after every measurement, so a run cut
short keeps what it measured.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

MODES = ("memmap", "uva", "hbm", "kvikio", "host", "proxy", "proxy-hosttier",
         "proxy-hosttier-idorder", "proxy-smallcache", "default")
GPU_ONLY = {"uva", "hbm", "kvikio", "proxy", "proxy-hosttier", "proxy-hosttier-idorder",
            "proxy-smallcache", "default"}
STORE_MODES = {"host", "proxy", "proxy-hosttier", "proxy-hosttier-idorder", "proxy-smallcache",
               "default"}
# Modes with an HBM cache that a "hot" state can fill.
HOT_MODES = ("proxy", "proxy-hosttier", "proxy-hosttier-idorder", "proxy-smallcache", "default")
DROP_CACHES = "/proc/sys/vm/drop_caches"


class Skip(Exception):
    """A mode that cannot run here; the message says why."""


def parse_count(text):
    text = text.strip().lower()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


# -- the table ----------------------------------------------------------------------

def value_of(rows_idx, dim):
    """The table's content: row r, column c holds (r * dim + c) mod 2**24 (exact in float32)."""
    return ((rows_idx[:, None] * dim + np.arange(dim)) % (1 << 24)).astype(np.float32)


def make_table(path, rows, dim):
    if os.path.exists(path) and os.path.getsize(path) == 128 + rows * dim * 4:
        return
    tmp = path + ".tmp"
    a = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dim))
    step = max(1, (64 << 20) // (dim * 4))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        a[lo:hi] = value_of(np.arange(lo, hi, dtype=np.int64), dim)
    a.flush()
    del a
    os.replace(tmp, path)


def data_offset(path):
    """Where row 0 starts in the .npy table."""
    return np.load(path, mmap_mode="r").offset


def draw_ids(rng, dist, n, rows, perm):
    if dist == "uniform":
        return rng.integers(0, rows, n, dtype=np.int64)
    # Zipf-like: rank k drawn with probability ~ 1/k^1.2, ranks mapped to rows by a
    # fixed random permutation so hot rows are scattered over the file.
    return perm[(rng.zipf(1.2, n) - 1) % rows]


# -- environment ------------------------------------------------------------------------

def drop_caches():
    try:
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("3")
        return None
    except OSError as e:
        return f"cannot drop the page cache ({DROP_CACHES}: {e.strerror or e}; needs root)"


def warm_file(path):
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def disk_of(path):
    """The block device under ``path`` and its model, from /proc/self/mountinfo and sysfs."""
    try:
        dev = os.stat(path).st_dev
        major, minor = os.major(dev), os.minor(dev)
        name = os.path.basename(os.path.realpath(f"/sys/dev/block/{major}:{minor}"))
        model = ""
        for cand in (name, name.rstrip("0123456789").rstrip("p")):
            p = f"/sys/block/{cand}/device/model"
            if os.path.exists(p):
                model = open(p).read().strip()
                break
        return {"device": name, "model": model}
    except OSError as e:
        return {"error": str(e)}


def machine(gpu):
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f
                                if line.startswith("model name")), "")
    except OSError:
        pass
    if gpu is not None:
        info["gpu"] = gpu.name
        info["gpu_mem_bytes"] = gpu.total
    return info


def disk_ceilings(path, seconds, engine):
    """4 KiB random O_DIRECT reads (IOPS) and 1 MiB sequential O_DIRECT reads
    (GB/s) of the file, through fastread's range reads at queue depth 128."""
    from fastread.engine import open_context

    size = os.path.getsize(path)
    out = {"engine": engine, "queue_depth": 128}
    try:
        ctx = open_context(engine, o_direct=True, queue_depth=128)
    except (OSError, ValueError) as e:
        return {"error": f"engine {engine!r}: {e}"}
    rng = np.random.default_rng(1)
    try:
        for name, piece, per_call in (("rand4k", 4096, 8192), ("seq1m", 1 << 20, 256)):
            n = total = 0
            t0 = time.perf_counter()
            pos = 0
            while time.perf_counter() - t0 < seconds:
                if name == "rand4k":
                    offs = rng.integers(0, size // 4096, per_call) * 4096
                else:
                    offs = (pos + np.arange(per_call, dtype=np.int64)) % (size // piece) * piece
                    pos += per_call
                b = ctx.read_ranges(path, offs, np.full(per_call, piece, np.int64))
                if b.failures():
                    raise OSError(b.failures()[0][1], f"{path}: ceiling read failed")
                total += b.nbytes
                n += per_call
                b.release()
            dt = time.perf_counter() - t0
            if name == "rand4k":
                out["rand4k_iops"] = n / dt
                out["rand4k_gb_per_s"] = total / dt / 1e9
            else:
                out["seq1m_gb_per_s"] = total / dt / 1e9
    except OSError as e:
        out["error"] = str(e)
    finally:
        ctx.close()
    return out


class Gpu:
    """The libraries that put rows on the GPU here (torch for outputs, CuPy for kernels)."""

    def __init__(self):
        import fastread
        ok, why = fastread._core.gpu_probe(0)
        if not ok:
            raise Skip(f"no CUDA device: {why}")
        self.torch = self.cupy = None
        try:
            import torch
            if torch.cuda.is_available():
                self.torch = torch
        except ImportError:
            pass
        try:
            import cupy
            self.cupy = cupy
        except ImportError:
            pass
        if self.torch is None and self.cupy is None:
            raise Skip("neither torch (with CUDA) nor CuPy is installed")
        if self.cupy is not None:
            props = self.cupy.cuda.runtime.getDeviceProperties(0)
            self.name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            self.total = self.cupy.cuda.runtime.memGetInfo()[1]
        else:
            self.name = self.torch.cuda.get_device_name(0)
            self.total = self.torch.cuda.get_device_properties(0).total_memory

    def sync(self):
        if self.torch is not None:
            self.torch.cuda.synchronize()
        if self.cupy is not None:
            self.cupy.cuda.runtime.deviceSynchronize()

    def free(self):
        if self.cupy is not None:
            self.cupy.get_default_memory_pool().free_all_blocks()
            return self.cupy.cuda.runtime.memGetInfo()[0]
        self.torch.cuda.empty_cache()
        return self.torch.cuda.mem_get_info()[0]

    def ids(self, host_ids, lib=None):
        """Device ids as ``lib`` ("torch", "cupy"; None: torch if installed)."""
        if lib != "cupy" and self.torch is not None:
            return self.torch.from_numpy(host_ids).cuda()
        return self.cupy.asarray(host_ids)

    def to_host(self, x):
        if self.torch is not None and isinstance(x, self.torch.Tensor):
            return x.cpu().numpy()
        if self.cupy is not None and isinstance(x, self.cupy.ndarray):
            return self.cupy.asnumpy(x)
        return np.asarray(x)


# -- modes --------------------------------------------------------------------------

class Runner:
    """One mode, open: ``run(host_ids, dev_ids)`` gathers a batch and waits for it;
    ``lib`` is the library its device ids come in (made before the clock starts)."""
    store = None
    lib = None

    def close(self):
        if self.store is not None:
            self.store.close()


def open_mode(mode, args, path, gpu):
    if mode in GPU_ONLY and args.device == "cuda" and gpu is None:
        raise Skip("needs a GPU")
    if mode in GPU_ONLY and args.device == "cpu":
        raise Skip("a GPU mode (--device cpu)")
    r = Runner()
    rows, dim = args.rows, args.dim
    if mode == "memmap":
        # Held in a list that close() empties: a cold repeat's drop_caches
        # cannot drop pages a live mapping maps, so the last repeat's mapping
        # must be gone first (it was not: the second cold memmap repeat read
        # half-warm, 0.86 s against 6.9 s, and raised memmap's cold median).
        held = [np.load(path, mmap_mode="r")]
        if args.device == "cpu":
            r.run = lambda h, d: held[0][h]
        elif gpu.torch is not None:
            torch = gpu.torch

            def run(h, d):
                x = torch.from_numpy(held[0][h]).pin_memory().cuda(non_blocking=True)
                torch.cuda.synchronize()
                return x
            r.run = run
        else:  # the same with CuPy: fancy index into page-locked memory, one upload
            import cupyx
            cp = gpu.cupy

            def run(h, d):
                pinned = cupyx.empty_pinned((len(h), dim), np.float32)
                np.take(held[0], h, axis=0, out=pinned)
                x = cp.asarray(pinned)
                cp.cuda.runtime.deviceSynchronize()
                return x
            r.run = run
        r.close = held.clear
        return r
    if mode == "uva":
        cp = gpu.cupy
        if cp is None:
            raise Skip("needs CuPy")
        nbytes = os.path.getsize(path)
        if nbytes > 0.8 * mem_available():
            raise Skip(f"the file ({nbytes / 2**30:.1f} GiB) does not fit in 80% of available RAM")
        import mmap
        buf = mmap.mmap(-1, nbytes)
        host = np.frombuffer(buf, np.uint8)
        with open(path, "rb", buffering=0) as f:
            # One read() returns at most ~2 GiB on Linux: loop, or the rest
            # of a larger table stays zero (seen: 'wrong rows' at 8 GiB).
            view, done = memoryview(buf), 0
            while done < nbytes:
                n = f.readinto(view[done:])
                if not n:
                    raise OSError(f"{path}: ended after {done} of {nbytes} bytes")
                done += n
        ptr = host.ctypes.data
        cp.cuda.runtime.hostRegister(ptr, nbytes, 3)  # portable | mapped
        get_dptr = getattr(cp.cuda.runtime, "hostGetDevicePointer", None)
        dptr = get_dptr(ptr, 0) if get_dptr else ptr  # unified addressing: the same address
        mem = cp.cuda.UnownedMemory(dptr, nbytes, host)
        table = cp.ndarray((rows, dim), cp.float32, cp.cuda.MemoryPointer(mem, data_offset(path)))

        def run(h, d):
            x = table[d]
            cp.cuda.runtime.deviceSynchronize()
            return x

        def close():
            cp.cuda.runtime.hostUnregister(ptr)
        r.run, r.close, r.lib = run, close, "cupy"
        return r
    if mode == "hbm":
        cp = gpu.cupy
        if cp is None:
            raise Skip("needs CuPy")
        need = rows * dim * 4
        if need > 0.8 * gpu.free():
            raise Skip(f"the table ({need / 2**30:.1f} GiB) does not fit in GPU memory")
        mm = np.load(path, mmap_mode="r")
        table = cp.empty((rows, dim), cp.float32)
        step = 1 << 20
        for lo in range(0, rows, step):
            table[lo:lo + step] = cp.asarray(mm[lo:lo + step])
        del mm

        def run(h, d):
            x = table[d]
            cp.cuda.runtime.deviceSynchronize()
            return x
        r.run, r.lib = run, "cupy"
        r.close = lambda: None
        return r
    if mode == "kvikio":
        try:
            import kvikio
        except ImportError as e:
            raise Skip(f"kvikio does not import: {e}")
        cp = gpu.cupy
        if cp is None:
            raise Skip("needs CuPy")
        f = kvikio.CuFile(path, "r")
        row, off = dim * 4, data_offset(path)

        def run(h, d):
            if len(h) > args.kvikio_max:
                raise Skip(f"per-row reads are capped at --kvikio-max {args.kvikio_max} ids")
            out = cp.empty((len(h), dim), cp.float32)
            futs = [f.pread(out[i], row, off + int(h[i]) * row) for i in range(len(h))]
            for fu in futs:
                fu.get()
            cp.cuda.runtime.deviceSynchronize()
            return out
        r.run = run
        r.close = f.close
        return r
    if mode in STORE_MODES:
        from fastread.features import FeatureStore
        kw = {} if mode == "default" else {"backend": "host" if mode == "host" else "proxy"}
        if args.device == "cpu":
            kw["device_id"] = -1
        else:
            kw["device_id"] = 0
            if mode != "default":
                kw["cache_bytes"] = (args.small_cache if mode == "proxy-smallcache"
                                     else args.cache_bytes)
        if mode.startswith("proxy-hosttier"):
            kw["host_bytes"] = "auto"
        order = os.environ.get("FASTREAD_GATHER_ORDER")
        if mode == "proxy-hosttier-idorder":
            os.environ["FASTREAD_GATHER_ORDER"] = "off"  # read when the store opens
        try:
            store = FeatureStore(path, **kw)
        except (RuntimeError, ValueError, MemoryError, OSError) as e:
            raise Skip(f"FeatureStore({kw}): {e}")
        finally:
            if order is None:
                os.environ.pop("FASTREAD_GATHER_ORDER", None)
            else:
                os.environ["FASTREAD_GATHER_ORDER"] = order
        r.store = store
        if args.device == "cpu":
            r.run = lambda h, d: store.gather(h, device="cpu")
        else:
            def run(h, d):
                x = store.gather(d)
                gpu.sync()
                return x
            r.run = run
        return r
    raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")


# -- the matrix ---------------------------------------------------------------------

# Modes slow to open (the whole table loaded or page-locked) that a state's
# measurements share; their stores' stats are reported per measurement.
SHARED = ("uva", "hbm", "proxy-hosttier", "proxy-hosttier-idorder")


def measure(args, path, gpu, mode, state, dist, n, rng, perm, shared):
    """{rows_per_s, gb_per_s, ...} for one cell of the matrix. ``shared``:
    runners of SHARED modes kept open for the state (closed by the caller)."""
    row_bytes = args.dim * 4
    times = []
    runner = None
    info = {}
    reps = args.cold_repeat if state == "cold" else args.repeat
    keep = mode in SHARED and state != "cold"
    try:
        if keep:
            if mode not in shared:
                shared[mode] = open_mode(mode, args, path, gpu)
            runner = shared[mode]
        elif state != "cold":
            runner = open_mode(mode, args, path, gpu)
        before = runner.store.stats() if runner is not None and runner.store is not None else None
        fixed = draw_ids(rng, dist, n, args.rows, perm)  # "hot": the same ids again
        for i in range(args.warmup + reps):
            timed = i >= args.warmup
            if state == "cold":
                if not timed:
                    continue  # a warm-up would warm the cache
                if runner is not None:
                    runner.close()
                    runner = None  # nothing of the last repeat may stay mapped
                why = drop_caches()
                if why:
                    raise Skip(why)
                runner = open_mode(mode, args, path, gpu)
            elif state == "warm" and mode in ("proxy", "proxy-smallcache", "default") and i > 0:
                runner.close()  # an empty HBM cache each time: storage -> GPU, not cache hits
                runner = open_mode(mode, args, path, gpu)
            h = fixed if state == "hot" else draw_ids(rng, dist, n, args.rows, perm)
            d = gpu.ids(h, runner.lib) if gpu is not None and args.device == "cuda" else None
            if gpu is not None and args.device == "cuda":
                gpu.sync()
            t0 = time.perf_counter()
            out = runner.run(h, d)
            dt = time.perf_counter() - t0
            if timed:
                times.append(dt)
            if i == args.warmup:  # check the first timed batch
                k = min(len(h), 20_000)
                got = gpu.to_host(out[:k]) if gpu is not None and args.device == "cuda" else np.asarray(out[:k])
                if not np.array_equal(got, value_of(h[:k], args.dim)):
                    raise AssertionError(f"{mode}: wrong rows for {state}/{dist}/{n}")
            del out
        if runner.store is not None:
            st = runner.store.stats()
            if before is not None:  # this measurement's share of a shared store's counts
                st = {k: v - before[k] if isinstance(v, int) else
                      {t: c - before[k][t] for t, c in v.items()} if isinstance(v, dict) else v
                      for k, v in st.items()}
            info["stats"] = st
            info["memory"] = runner.store.memory()
            info["backend"] = runner.store.backend
    finally:
        if runner is not None and not keep:
            runner.close()
        if gpu is not None and not keep:
            gpu.free()  # CuPy's pool would keep a mode's table from the next mode's cache
    med = statistics.median(times)
    return dict(info, median_s=med, times_s=times, rows_per_s=n / med,
                gb_per_s=n * row_bytes / med / 1e9)


def states_for(mode, states):
    out = []
    for s in states:
        if s == "hot" and mode not in HOT_MODES:
            continue  # only the GPU cache has a "hot"
        if s == "cold" and mode in ("uva", "hbm", "proxy-hosttier", "proxy-hosttier-idorder"):
            continue  # the table is in memory (loaded at open) before the clock starts
        out.append(s)
    return out


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = [r for r in doc["results"] if "rows_per_s" in r]
    order = {s: i for i, s in enumerate(("warm", "cold", "hot"))}
    panels = sorted({(r["state"], r["dist"]) for r in res}, key=lambda k: (order[k[0]], k[1]))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    # One colour per mode in every panel (a panel shows only the modes it has).
    palette = plt.get_cmap("tab10")
    colour = {m: palette(i % 10) for i, m in enumerate(MODES)}
    for ax, (state, dist) in zip(axes[0], panels):
        cell = [r for r in res if (r["state"], r["dist"]) == (state, dist)]
        batches = sorted({r["batch"] for r in cell})
        modes = [m for m in MODES if any(r["mode"] == m for r in cell)]
        w = 0.8 / max(1, len(modes))
        for j, m in enumerate(modes):
            ys = [next((r["rows_per_s"] for r in cell if r["mode"] == m and r["batch"] == b), 0)
                  for b in batches]
            ax.bar([i + j * w for i in range(len(batches))], ys, w, label=m, color=colour[m])
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(batches))])
        ax.set_xticklabels([f"{b:,}" for b in batches])
        ax.set_yscale("log")
        ax.set_title(f"{state}, {dist} ids")
        ax.set_xlabel("ids per batch")
        ax.set_ylabel("rows/s")
        ax.legend(fontsize=7)
    fig.suptitle(f"{doc['config']['rows']:,} x {doc['config']['dim']} float32 rows to "
                 f"{doc['config']['device']} ({doc['machine'].get('gpu', doc['machine'].get('cpu', ''))})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--rows", type=parse_count, default=16 << 20)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batches", default="10k,100k,1M")
    p.add_argument("--dists", default="uniform,zipf")
    p.add_argument("--states", default="warm,hot,cold",
                   help="in this order (cold last: the slowest, first cut by --time-budget)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--cold-repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cache-bytes", default="auto",
                   help="HBM cache of the proxy modes (default: the table's size, so 'hot' fits)")
    p.add_argument("--small-cache", default="1G", help="HBM cache of proxy-smallcache")
    p.add_argument("--kvikio-max", type=parse_count, default=100_000)
    p.add_argument("--workdir", default="/var/tmp")
    p.add_argument("--table", help="an existing table (.npy of float32 made by this script)")
    p.add_argument("--engine", default="auto", help="engine of the disk-ceiling reads")
    p.add_argument("--ceiling-seconds", type=float, default=3.0)
    p.add_argument("--time-budget", type=float, default=0,
                   help="seconds after which no new measurement starts (0: none)")
    p.add_argument("--json", default="gather.json")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    t_start = time.monotonic()

    if args.cache_bytes == "auto":
        args.cache_bytes = max(1 << 30, 1 << (args.rows * args.dim * 4 - 1).bit_length())
    path = args.table or os.path.join(args.workdir, f"gather-{args.rows}x{args.dim}.npy")
    t0 = time.perf_counter()
    make_table(path, args.rows, args.dim)
    print(f"table {path}: {args.rows:,} x {args.dim} float32 "
          f"({os.path.getsize(path) / 2**30:.2f} GiB; ready in {time.perf_counter() - t0:.1f} s)",
          flush=True)
    gpu = None
    if args.device == "cuda":
        try:
            gpu = Gpu()
        except Skip as e:
            sys.exit(f"--device cuda: {e} (use --device cpu)")
    from fastread.engine import resolve
    engine = resolve(None if args.engine == "auto" else args.engine)
    doc = {"argv": sys.argv, "config": {k: v for k, v in vars(args).items()},
           "machine": machine(gpu), "disk": dict(disk_of(path), **disk_ceilings(
               path, args.ceiling_seconds, engine)), "results": []}
    print(f"machine: {doc['machine']}\ndisk: {doc['disk']}", flush=True)

    def save():
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)

    save()
    rng = np.random.default_rng(0)
    perm = rng.permutation(args.rows)
    batches = [parse_count(b) for b in args.batches.split(",") if b.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown modes {unknown}; modes: {', '.join(MODES)}")
    states = [s.strip() for s in args.states.split(",") if s.strip()]
    for s in states:
        if s not in ("warm", "cold", "hot"):
            p.error(f"unknown state {s!r} (warm, cold, hot)")
    dists = [d.strip() for d in args.dists.split(",") if d.strip()]
    for d in dists:
        if d not in ("uniform", "zipf"):
            p.error(f"unknown distribution {d!r} (uniform, zipf)")
    skipped = {}
    for state in states:
        if state == "warm":
            warm_file(path)
        why = drop_caches() if state == "cold" else None
        if why:
            print(f"cold: skipped: {why}", flush=True)
            doc["results"] += [dict(state=state, dist=d, batch=n, mode=m, skipped=why)
                               for m in modes if state in states_for(m, [state])
                               for d in dists for n in batches]
            save()
            continue
        for mode in modes:
            if state not in states_for(mode, [state]):
                continue
            shared = {}
            try:
                for dist in dists:
                    for n in batches:
                        key = dict(state=state, dist=dist, batch=n, mode=mode)
                        if mode in skipped:
                            doc["results"].append(dict(key, skipped=skipped[mode]))
                            continue
                        if args.time_budget and time.monotonic() - t_start > args.time_budget:
                            doc["results"].append(dict(key, skipped="time budget spent"))
                            continue
                        if state == "warm":
                            warm_file(path)  # a cold run may have evicted it
                        label = f"{state:5} {dist:7} {n:>9,} {mode:17}"
                        try:
                            res = measure(args, path, gpu, mode, state, dist, n, rng, perm, shared)
                        except Skip as e:
                            if "capped" not in str(e) and "page cache" not in str(e):
                                skipped[mode] = str(e)
                            doc["results"].append(dict(key, skipped=str(e)))
                            print(f"{label} skipped: {e}", flush=True)
                        except Exception as e:  # recorded; the other modes still run
                            doc["results"].append(dict(key, error=repr(e)))
                            print(f"{label} FAILED: {e!r}", flush=True)
                        else:
                            doc["results"].append(dict(key, **res))
                            print(f"{label} {res['rows_per_s'] / 1e6:9.2f}M rows/s "
                                  f"{res['gb_per_s']:7.2f} GB/s", flush=True)
                        save()
            finally:
                for r in shared.values():
                    r.close()
                if gpu is not None:
                    gpu.free()
    if args.plot:
        plot(doc, args.plot)
    print(f"wrote {args.json}" + (f" and {args.plot}" if args.plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

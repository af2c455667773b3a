"""Issue 40, the second copy: one row group's image column decoded by
Arrow's Parquet reader with ``binary_type`` default (binary: Snappy into a
page, then the values into one BinaryArray value buffer), ``binary_view``
(views into the decoded pages) and ``large_binary``, for the image column
written Snappy-compressed and uncompressed, with and without the stored
Arrow schema (``ARROW:schema``, which overrides ``binary_type``: every file
pyarrow or ``datasets`` writes has it). Warm: the file's bytes are in
memory (a pyarrow buffer), so only the decoding is timed; the variants run
interleaved in one process, each repeated ``--rounds`` times, medians.

    python bench/parquet/binary_view.py JPEG_TREE [--rows 1000] [--rounds 7]
        [--rss] [--out DIR]

Per variant: wall and CPU seconds of ``read_row_group`` (the GIL-free C++
decode, one thread), minor page faults it took, the bytes it left held in
the pool (the decoded column while the table lives), and where the
values' bytes are: the number of data buffers, and for the uncompressed
file how many of them lie inside the file's own buffer (no copy at all) and how many are slices of one page.
Last, the split of such a decode's cost: the values' bytes written into
fresh memory, fresh memory populated without a copy, the copy alone.
``--rss``: each variant once more in a fresh child process, for its peak
RSS (ru_maxrss is a process's high-water mark, so it cannot be measured
interleaved).
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq


def make_files(tree, rows, out_dir):
    """The first ``rows`` JPEGs of ``tree`` as one row group in the
    Hugging Face image layout (what write_image_parquet writes), in four
    variants: {snappy, none} x {schema stored, not}."""
    from fastread.index import scan
    paths, labels = scan(tree)
    paths, labels = paths[:rows], labels[:rows]
    blobs = []
    for p in paths:
        with open(p, "rb") as f:
            blobs.append({"bytes": f.read(), "path": os.path.basename(p)})
    typ = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array(blobs, typ),
                      "label": pa.array([int(x) for x in labels], pa.int64())})
    out = {}
    for comp in ("snappy", "none"):
        for stored in (True, False):
            name = f"{comp}-{'schema' if stored else 'noschema'}"
            path = os.path.join(out_dir, name + ".parquet")
            pq.write_table(table, path, compression=comp, store_schema=stored,
                           use_dictionary=False, row_group_size=rows)
            out[name] = load(path)
    return out, blobs


def load(path):
    with open(path, "rb") as f:
        return pa.py_buffer(f.read())


TYPES = {"binary": None, "view": pa.binary_view(), "large": pa.large_binary()}


def decode(buf, binary_type, pool):
    from pyarrow._parquet import ParquetReader
    reader = ParquetReader(memory_pool=pool)
    reader.open(pa.BufferReader(buf), binary_type=binary_type, pre_buffer=False)
    leaf = [i for i in range(reader.metadata.num_columns)
            if reader.metadata.schema.column(i).path == "image.bytes"]
    return reader.read_row_group(0, column_indices=leaf, use_threads=False)


def where(table, buf):
    """(type, data buffers, of them inside the file's buffer, of them
    right behind the previous one's bytes and a 4-byte length: slices of
    one decoded PLAIN page, as views into the pages would be)."""
    arr = table.column("image").chunks[0].field("bytes")
    bufs = arr.buffers()[2:] if pa.types.is_binary_view(arr.type) else arr.buffers()[2:3]
    lo, hi = buf.address, buf.address + buf.size
    inside = sum(1 for b in bufs if b is not None and lo <= b.address < hi)
    paged = sum(1 for p, b in zip(bufs, bufs[1:]) if b.address == p.address + p.size + 4)
    return str(arr.type), len(bufs), inside, paged


def high_water_mb():
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not carried over
    from the parent across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(buf, binary_type, pool):
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    held0 = pool.bytes_allocated()
    c0, t0 = time.process_time(), time.perf_counter()
    table = decode(buf, binary_type, pool)
    t1, c1 = time.perf_counter(), time.process_time()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    return table, t1 - t0, c1 - c0, ru1.ru_minflt - ru0.ru_minflt, pool.bytes_allocated() - held0


def memory_split(nbytes, pool, rounds):
    """Medians (ms) of writing ``nbytes`` (a row group's values) into fresh
    pool memory (page faults, the kernel's zeroing, the copy), populating
    fresh memory without copying, and the copy alone into memory already
    faulted in: how a decode's time divides between the copy and the
    fresh pages it lands in."""
    import numpy as np
    from fastread import _core
    src = np.frombuffer(np.random.default_rng(0).bytes(nbytes), np.uint8)
    fresh, populate_ms, copy = [], [], []
    for _ in range(rounds):
        buf = pa.allocate_buffer(nbytes, memory_pool=pool)
        dst = np.frombuffer(buf, np.uint8)
        t = time.perf_counter()
        dst[:] = src
        fresh.append(time.perf_counter() - t)
        t = time.perf_counter()
        dst[:] = src
        copy.append(time.perf_counter() - t)
        del dst, buf
        buf = pa.allocate_buffer(nbytes, memory_pool=pool)
        t = time.perf_counter()
        _core.populate_write(memoryview(buf).cast("B"))
        populate_ms.append(time.perf_counter() - t)
        del buf
        time.sleep(0.2)     # past jemalloc's decay: the next buffer is fresh pages
    return [statistics.median(x) * 1e3 for x in (fresh, populate_ms, copy)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rss", action="store_true")
    ap.add_argument("--out", default="/var/tmp/pqview/binary_view",
                    help="where the four one-row-group files are written")
    ap.add_argument("--child", nargs=2, metavar=("FILE", "TYPE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    pool = pa.jemalloc_memory_pool()
    if a.child:   # the one file, the source table dropped: its peak is the decode's
        buf = load(os.path.join(a.out, a.child[0] + ".parquet"))
        base = high_water_mb()
        one(buf, TYPES[a.child[1]], pool)
        print(base, high_water_mb())
        return
    os.makedirs(a.out, exist_ok=True)
    files, blobs = make_files(a.tree, a.rows, a.out)
    want = [b["bytes"] for b in blobs]
    nbytes = sum(len(w) for w in want)
    print(f"pyarrow {pa.__version__}, {a.rows} rows, {nbytes / 1e6:.1f} MB of JPEG, "
          f"load {open('/proc/loadavg').read().split()[:3]}")
    variants = [(f, t) for f in files for t in TYPES]
    res = {v: [] for v in variants}
    info = {}
    for r in range(a.rounds):
        for k in range(len(variants)):
            f, t = variants[(k + r) % len(variants)]
            table, wall, cpu, flt, held = one(files[f], TYPES[t], pool)
            if (f, t) not in info:
                got = table.column("image").chunks[0].field("bytes").to_pylist()
                info[(f, t)] = where(table, files[f]) + (got == want,)
            res[(f, t)].append((wall, cpu, flt, held))
            del table
    print(f"{'file':<16} {'binary_type':<7} {'arrow type':<13} {'wall ms':>8} {'cpu ms':>7} "
          f"{'faults':>7} {'held MB':>8} {'bufs':>5} {'in file':>7} {'paged':>5} exact"
          + ("  peak RSS MB (+decode)" if a.rss else ""))
    for v in variants:
        rows = res[v]
        med = [statistics.median(x[i] for x in rows) for i in range(4)]
        typ, nb, inside, paged, exact = info[v]
        line = (f"{v[0]:<16} {v[1]:<7} {typ:<13} {med[0] * 1e3:8.1f} {med[1] * 1e3:7.1f} "
                f"{med[2]:7.0f} {med[3] / 1e6:8.1f} {nb:5d} {inside:7d} {paged:5d} {exact}")
        if a.rss:
            out = subprocess.run([sys.executable, __file__, a.tree, "--out", a.out,
                                  "--child", v[0], v[1]], check=True, capture_output=True,
                                 text=True).stdout
            base, peak = (float(x) for x in out.split()[-2:])
            line += f"  {peak:5.0f} (+{peak - base:.0f})"
        print(line, flush=True)
    fresh, populate_ms, copy = memory_split(nbytes, pool, a.rounds)
    print(f"{nbytes / 1e6:.1f} MB into fresh pool memory {fresh:.1f} ms, populating fresh "
          f"memory (no copy) {populate_ms:.1f} ms, the copy into faulted memory {copy:.1f} ms")
    print(f"load {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()

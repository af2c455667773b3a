"""One row group's image column decoded by the Parquet source's two routes
(issue 40), interleaved rounds, medians: ``pyarrow`` (Arrow's table reader
driven from Python, values copied into a BinaryArray: ``_decode`` +
``_image_parts``) and ``native`` (the shim over the same libparquet, values
views of the engine's chunk where Arrow leaves them there:
``_parquet_native.decode``). The chunk is read once by the engine (psync)
and kept; each variant's result is dropped before the next, so this is the
decode's own CPU, not the fresh memory a Reader's epoch holds.

    python bench/parquet/native_decode.py DATA [DATA2 ...] [--rounds 9] [--group 0]

DATA: a directory written by write_image_parquet (its first file is read).
"""
import argparse
import resource
import statistics
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--group", type=int, default=0)
    args = ap.parse_args(argv)
    from fastread import _core
    from fastread.formats import Parquet, _parquet_native
    from fastread.formats import _parquet_meta as pm
    from fastread.formats.parquet import _image_parts
    mod, why = _parquet_native.status()
    if mod is None:
        print(f"native route unavailable: {why}")
        return 1
    cases = []
    for data in args.data:
        src = Parquet(data)
        m = src.metas[0]
        g = args.group
        offs, lens = m.chunks[g]
        ctx = _core.Context("psync")
        batch = ctx.read_ranges(m.path, offs, lens)
        chunk = batch.arrays()[0]
        col = m.metadata.row_group(g).column(m.native_column)
        name = f"{data.rstrip('/').split('/')[-1]} ({col.compression}, {lens[0]} B)"

        def arrow(m=m, g=g, offs=offs, chunk=chunk, src=src):
            t = pm._decode(m, g, src._leaves_of(m), [(int(offs[0]), chunk)])
            return _image_parts(src, t.column(src.image))

        def native(m=m, g=g, chunk=chunk, col=col):
            return _parquet_native.decode(m.native, m.native_column, g, chunk, m.rows[g],
                                          int(col.total_uncompressed_size))
        cases += [(name, "pyarrow", arrow), (name, "native", native)]
        # same bytes
        a, n = arrow()[0], native()
        va = [bytes(a[1][b:e]) for b, e in zip(a[2], a[3])]
        vn = [bytes((n[4] if n[5] is not None and n[5][j] else n[0])[n[1][j]:n[2][j]])
              for j in range(len(n[1]))]
        print(f"{name}: values equal {va == vn}, native copied {n[6]} of {len(vn)}")
    res = {(c[0], c[1]): [] for c in cases}
    for rnd in range(args.rounds + 1):
        for name, how, fn in cases:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            c0, t0 = time.thread_time(), time.perf_counter()
            out = fn()
            c1, t1 = time.thread_time(), time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            del out
            if rnd:
                res[(name, how)].append(((c1 - c0) * 1e3, (t1 - t0) * 1e3, r1.ru_minflt - r0.ru_minflt))
    print(f"{'data':<40} {'route':<8} {'cpu ms':>8} {'wall ms':>8} {'faults':>8}  (medians of {args.rounds})")
    for (name, how), v in res.items():
        print(f"{name:<40} {how:<8} {statistics.median(x[0] for x in v):8.1f} "
              f"{statistics.median(x[1] for x in v):8.1f} {statistics.median(x[2] for x in v):8.0f}")
        print("   per round cpu ms: " + " ".join(f"{x[0]:.1f}" for x in v))
    return 0


if __name__ == "__main__":
    sys.exit(main())

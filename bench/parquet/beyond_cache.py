"""A global shuffle with the decoded set beyond ``cache_bytes`` (a data set
larger than memory, issue 40): pyarrow's route reloads whole row groups for
a few rows each (read amplification), the native route's ranges keep 16 B a
row and read only the rows. One epoch of a fresh Reader, in this process.

    python bench/parquet/beyond_cache.py DATA {ranged|held|pyarrow} CACHE_BYTES
"""
import os
import resource
import sys
import time


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[1] not in ("ranged", "held", "pyarrow"):
        print(__doc__)
        return 2
    import fastread
    from fastread.formats import Parquet, _parquet_native
    data, mode, cache = argv[0], argv[1], int(argv[2])
    _parquet_native.ENABLED = mode != "pyarrow"
    src = Parquet(data, cache_bytes=cache, ranged=(mode == "ranged"))
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = 0
    with fastread.Reader(source=src, batch_size=64, random_shuffle=True) as r:
        for arrays, _labels in r:
            n += len(arrays)
        st = r.stats()
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{os.path.basename(data)} {mode:8s} cache_bytes={cache >> 20} MiB: "
          f"{n / (t1 - t0):8.0f} img/s  row group loads {st['row_group_loads']}  "
          f"cpu {r1.ru_utime - r0.ru_utime:.2f} s user {r1.ru_stime - r0.ru_stime:.2f} s sys  "
          f"faults {r1.ru_minflt - r0.ru_minflt}  maxrss {r1.ru_maxrss >> 10} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""In-process A/B of io_uring's two paths for files of unknown size:
read_files() with engine_args unsized=windows (A: size a window, then read
it) and the default (B: read each file as it is sized), alternating per pass
over the list, plus a Reader epoch (size hints) per round. One process, so a
shared machine's load hits A and B alike. Prints medians of files/s and CPU
us/file, and medians of the paired ratios B/A, A/Reader, B/Reader.

    python bench/engines/unsized_ab.py /var/tmp/fastread-bench/engines-4k 256 15 4096
    (set directory, batch, rounds, files)
"""
import os, sys, time, statistics, resource
import fastread
top, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
nfiles = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
paths = []
for d, ds, fs in os.walk(top):
    ds.sort(); paths += [os.path.join(d, f) for f in sorted(fs) if not f.startswith(".")]
paths = paths[:nfiles]
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
def rf(args):
    t, c = time.perf_counter(), cpu()
    for i in range(0, len(paths), batch):
        a = fastread.read_files(paths[i:i+batch], engine="io_uring", engine_args=args)
        sum(x.nbytes for x in a); del a
    return len(paths) / (time.perf_counter() - t), (cpu() - c) / len(paths) * 1e6
reader = fastread.Reader(files=paths, labels=[0]*len(paths), batch_size=batch, engine="io_uring")
for a, _ in reader: del a
def rd():
    t, c = time.perf_counter(), cpu()
    for a, _ in reader: sum(x.nbytes for x in a); del a
    return len(paths) / (time.perf_counter() - t), (cpu() - c) / len(paths) * 1e6
rf("unsized=windows"); rf("")
res = {"A": [], "B": [], "R": []}
for r in range(rounds):
    order = [("A", "unsized=windows"), ("B", "")] if r % 2 == 0 else [("B", ""), ("A", "unsized=windows")]
    for k, args in order:
        res[k].append(rf(args))
    res["R"].append(rd())
reader.close()
med = lambda xs: statistics.median(xs)
print(f"{os.path.basename(top)} b{batch} files {len(paths)} rounds {rounds}: "
      f"A(windows) {med(x[0] for x in res['A']):,.0f}/s {med(x[1] for x in res['A']):.2f}us  "
      f"B(pipelined) {med(x[0] for x in res['B']):,.0f}/s {med(x[1] for x in res['B']):.2f}us  "
      f"Reader {med(x[0] for x in res['R']):,.0f}/s {med(x[1] for x in res['R']):.2f}us | "
      f"B/A {med(b[0]/a[0] for a, b in zip(res['A'], res['B'])):.3f}  "
      f"A/R {med(a[0]/r[0] for a, r in zip(res['A'], res['R'])):.3f}  "
      f"B/R {med(b[0]/r[0] for b, r in zip(res['B'], res['R'])):.3f}")

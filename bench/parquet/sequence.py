"""The `parquet` bench family's modes one epoch each, in the order given, in
one process (``sleepS``: pause S seconds between two): shows what a mode
inherits from the one run before it. Per epoch: img/s, system CPU seconds
and minor page faults of the process (issue 40: a mode straight after a
fastread Parquet mode reuses the pages Arrow's jemalloc pool just freed).

    python bench/parquet/sequence.py DATA parquet-reader parquet-dali-fastread \\
        sleep3 parquet-dali-fastread
"""
import resource
import sys
import time

from fastread.bench import environment
from fastread.bench.families import parquet as fam
from fastread.bench.runners import Config


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    data, steps = sys.argv[1], sys.argv[2:]
    env = environment.probe_environment()
    cfg = Config(env=env, dataset=fam.detect(data), batch_size=64)
    modes = {m.name: m for m in fam.modes(env)}
    n = cfg.dataset.samples
    for step in steps:
        if step.startswith("sleep"):
            time.sleep(float(step[len("sleep"):]))
            continue
        if step not in modes:
            sys.exit(f"no mode {step!r} (modes: {', '.join(modes)})")
        m = modes[step]
        runner = m.build(m, cfg)
        try:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            got = 0
            while got < n:
                got += runner.next()[0]
            dt = time.perf_counter() - t
            r1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            runner.close()
        print(f"{step:24s} {got / dt:9.0f} img/s  sys {r1.ru_stime - r0.ru_stime:5.2f} s  "
              f"{r1.ru_minflt - r0.ru_minflt:8d} page faults", flush=True)


if __name__ == "__main__":
    main()

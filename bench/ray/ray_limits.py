#!/usr/bin/env python3
"""How many read tasks Ray Data runs at once, pass by pass: the global
resource limits its executor works with and the CPUs its read operator
holds, sampled at every budget update of one execution (Ray's internals:
``ResourceManager.get_global_limits``, ``ReservationOpResourceAllocator``;
written against Ray 2.60, it says so where they are missing).

Ray 2.60's executor starts an execution with limits of zero (the
autoscaling coordinator's answer comes asynchronously, the limits are
refreshed once a second), and with a zero budget it runs one task at a
time; a pass shorter than that never runs two. Run it on the machine whose
figures bench_ray.py gives:

    python bench/ray/ray_limits.py /var/tmp/fastread-ray-bench/train --passes 3
"""
import argparse
import os
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--modes", default="fastread,read_binary_files")
    args = p.parse_args(argv)

    import ray
    import ray.data

    import fastread.ray

    try:
        from ray.data._internal.execution import resource_manager as rm
        allocator = rm.ReservationOpResourceAllocator
        allocator.update_budgets  # noqa: B018 - the hook this script needs
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"this Ray ({ray.__version__}) lacks the internals this script reads: {e}")

    samples = []
    original = allocator.update_budgets

    def update_budgets(self, *, limits):
        original(self, limits=limits)
        held = max((self._resource_manager.get_op_usage(op).cpu for op in self._op_budgets),
                   default=0.0)
        samples.append((time.perf_counter(), limits.cpu, held))

    allocator.update_budgets = update_budgets
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    make = {"fastread": lambda: fastread.ray.read_files(args.root),
            "read_binary_files": lambda: ray.data.read_binary_files(args.root,
                                                                    include_paths=True)}
    print(f"Ray {ray.__version__}, num_cpus={args.cpus}, {os.cpu_count()} CPUs")
    for mode in args.modes.split(","):
        for i in range(args.passes + 1):   # the first pass warms the workers, untimed
            samples.clear()
            t0 = time.perf_counter()
            rows = sum(b.num_rows for b in make[mode]().iter_batches(batch_size=256,
                                                                     batch_format="pyarrow"))
            secs = time.perf_counter() - t0
            if i == 0:
                continue
            nonzero = [t - t0 for t, cpu, _ in samples if cpu > 0]
            print(f"{mode:<18} pass {i}: {rows} rows in {secs:.2f} s; limits' CPUs "
                  f"{max((c for _, c, _ in samples), default=0):.0f} at most, nonzero from "
                  + (f"{nonzero[0]:.2f} s" if nonzero else "never")
                  + "; read tasks' CPUs held at once: "
                  f"{max((h for *_, h in samples), default=0):.0f} at most", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

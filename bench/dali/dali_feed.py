"""How fastread hands GPU batches to DALI, timed: one external source fed
from ``fastread.Reader(device="gpu")`` in several ways, alternating, warm
cache, with the time DALI's ``feed_input`` takes per output. Needs a GPU and
DALI.

    python3 bench/dali/dali_feed.py DATA_DIR [--batchsize 256] [--rounds 3]

Ways (``--ways``, comma-separated):

* ``product``: ``fastread.dali.readers.file(device="gpu")`` as shipped
  (DLPack, labels on a private stream, ``use_copy_kernel=True``).
* ``cai``: one ``TensorGPU`` per sample through ``__cuda_array_interface__``;
  labels by ``cupy.asarray`` on CuPy's current stream.
* ``dlpack``: ``TensorListGPU.from_dlpack_list``; labels as for ``cai``.
* ``dlpack-contiguous``: as ``dlpack``, but ``from_dlpack_list`` gathers the
  samples into one contiguous buffer, which DALI then shares.

DALI copies a GPU batch that is not contiguous even with ``no_copy``; all
but ``product`` do it with a ``cudaMemcpyAsync`` per sample.
"""
import argparse
import collections
import time

WAYS = ("product", "cai", "dlpack", "dlpack-contiguous")


def _source(reader, way):
    import cupy
    from nvidia.dali.tensors import TensorGPU, TensorListGPU

    def batches():
        while True:
            for arrays, labels in reader:
                labels = labels.reshape(-1, 1)
                if way == "cai":
                    data = TensorListGPU([TensorGPU(a, "", 0) for a in arrays], "",
                                         contiguous=False)
                else:
                    data = TensorListGPU.from_dlpack_list(
                        arrays, "", contiguous=way == "dlpack-contiguous")
                yield data, cupy.asarray(labels)
    return batches()


def run(data_dir, way, batch_size, threads, iterations):
    from nvidia.dali import fn, pipeline_def

    import fastread
    from fastread.dali import readers

    reader = None

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0)
    def pipe():
        nonlocal reader
        if way == "product":
            return readers.file(file_root=data_dir, device="gpu", name="Reader")
        reader = fastread.Reader(data_dir, batch_size=batch_size, device="gpu", ring_depth=6)
        return tuple(fn.external_source(
            source=_source(reader, way), num_outputs=2, batch=True, no_copy=True,
            device="gpu"))

    p = pipe()
    p.build()
    feed_time = collections.Counter()
    feed = p._feed_input

    def timed_feed(name, data, *args, **kwargs):
        t0 = time.perf_counter()
        feed(name, data, *args, **kwargs)
        feed_time[type(data).__name__] += time.perf_counter() - t0

    p._feed_input = timed_feed
    samples = 0

    def loop(n):
        nonlocal samples
        done = 0
        while done < n:
            try:
                out = p.run()
            except StopIteration:
                p.reset()
                continue
            samples += len(out[1])
            done += 1

    loop(10)
    samples = 0
    feed_time.clear()
    t0 = time.perf_counter()
    loop(iterations)
    seconds = time.perf_counter() - t0
    p = None  # the pipeline goes before its reader closes
    if reader is not None:
        reader.close()
    per_batch = {k: 1e6 * v / iterations for k, v in feed_time.items()}
    return samples / seconds, per_batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir")
    ap.add_argument("--batchsize", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ways", default=",".join(WAYS))
    args = ap.parse_args()
    ways = [w for w in args.ways.split(",") if w]
    bad = set(ways) - set(WAYS)
    if bad:
        ap.error(f"unknown ways {sorted(bad)}; known: {', '.join(WAYS)}")
    results = {w: [] for w in ways}
    feeds = {}
    for _ in range(args.rounds):
        for way in ways:
            try:
                rate, per_batch = run(args.data_dir, way, args.batchsize, args.threads,
                                      args.iterations)
            except Exception as e:  # one way failing must not hide the others
                print(f"{way}: failed: {type(e).__name__}: {e}")
                continue
            results[way].append(rate)
            feeds[way] = per_batch
    print(f"batch {args.batchsize}, {args.iterations} iterations per run")
    for way, vals in results.items():
        if not vals:
            continue
        vals.sort()
        feed = ", ".join(f"{k} {v:.0f} us" for k, v in sorted(feeds[way].items()))
        print(f"{way:>14}: median {vals[len(vals) // 2]:>10,.0f} samples/s  "
              f"(runs {', '.join(f'{v:,.0f}' for v in vals)}); feed_input per batch: {feed}")


if __name__ == "__main__":
    main()

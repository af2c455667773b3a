"""DALI's own decoding rate on the GPU machine, without fastread's pack
decoder around it (issue 39: why the GPU pack decoder's steady rate is the
same with the hardware JPEG decoder as without it).

The tree's first ``--images`` JPEGs are read into memory once; each variant
is one DALI pipeline (``fn.external_source`` over those bytes, batch
``--batch``, ``prefetch_queue_depth`` 2, ``--threads`` threads) timed over
``--passes`` passes after two warm-up iterations, in images/s:

  decode-<up>-hw<L>   fn.decoders.image(device="mixed") alone, pixels left in
                      GPU memory; <up> "fancy" (jpeg_fancy_upsampling=True:
                      libjpeg's chroma interpolation, which the pack needs) or
                      "simple" (nvJPEG's replication: what the hardware decoder
                      does); L the hardware share (hw_decoder_load 1.0 or 0)
  pack-<up>-hw1       the pack's work after it: resize (shorter side 160,
                      linear, antialiased), center crop 160, pixels to the host

Each variant's start and end times are printed (local time, as dmon's), so that a
``nvidia-smi dmon -s u -o T`` beside it (its ``jpg`` column: the hardware
JPEG decoder's load) says which variants used the hardware decoder.

    python bench/decoded/dali_decode_rate.py --tree DIR [--images 5120] [--json OUT]
"""
import argparse
import json
import os
import sys
import time

VARIANTS = ("decode-fancy-hw1", "decode-simple-hw1", "decode-simple-hw0", "decode-fancy-hw0",
            "pack-fancy-hw1", "pack-simple-hw1")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", required=True)
    ap.add_argument("--images", type=int, default=5120)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="gpu", help="cpu: a smoke test of this script alone")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    import fastread

    paths = fastread.scan(args.tree)[0][:args.images]
    files = [np.fromfile(p, np.uint8) for p in paths]
    n = len(files) // args.batch * args.batch
    batches = [files[i:i + args.batch] for i in range(0, n, args.batch)]
    print(f"{n} JPEGs ({sum(len(f) for f in files[:n]) / n / 1e3:.0f} KB each), batch "
          f"{args.batch}, {args.threads} threads", flush=True)

    def source(info):
        return batches[info.iteration % len(batches)]

    results = {}
    print("| variant | img/s | build (s) | start (local time) | end |")
    print("|---|---:|---:|---:|---:|")
    for name in args.variants.split(","):
        stage, up, hw = name.split("-")
        dec = dict(device="mixed" if args.device == "gpu" else "cpu")
        if args.device == "gpu":
            dec.update(jpeg_fancy_upsampling=up == "fancy", hw_decoder_load=float(hw[2:]))

        @pipeline_def(batch_size=args.batch, num_threads=args.threads,
                      device_id=0 if args.device == "gpu" else None,
                      exec_dynamic=True, prefetch_queue_depth=2)
        def pipe():
            raw = fn.external_source(source=source, batch=True, batch_info=True,
                                     dtype=types.UINT8, ndim=1)
            images = fn.decoders.image(raw, output_type=types.RGB, **dec)
            if stage == "pack":
                images = fn.resize(images, resize_shorter=160, interp_type=types.INTERP_LINEAR,
                                   antialias=True)
                images = fn.crop(images, crop=(160, 160))
            return images

        t0 = time.perf_counter()
        p = pipe()
        p.build()
        build = time.perf_counter() - t0
        for _ in range(2):
            p.run()
        start = time.time()
        t0 = time.perf_counter()
        runs = args.passes * len(batches)
        for _ in range(runs):
            out, = p.run()
            if stage == "pack" and args.device == "gpu":
                out.as_cpu()
        if args.device == "gpu":
            out.as_cpu()   # the last run's pixels: the GPU's work done (one stream, in order)
        dt = time.perf_counter() - t0
        end = time.time()
        rate = runs * args.batch / dt
        results[name] = {"img_per_s": rate, "build_s": build, "start": start, "end": end}
        print(f"| {name} | {rate:.0f} | {build:.2f} | {time.strftime('%H:%M:%S', time.localtime(start))} "
              f"| {time.strftime('%H:%M:%S', time.localtime(end))} |", flush=True)
        del p
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"images": n, "batch": args.batch, "threads": args.threads,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

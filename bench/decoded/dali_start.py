"""Where the GPU pack decoder's fixed start goes (issue 39: the first batch
after ~1.7 s, Pillow's whole pack of 5,000 JPEGs in ~2.2 s).

Each variant runs in a fresh process (as a pack does), timing in order:
``import`` (nvidia.dali and fastread.decode_dali), ``cuda`` (a trivial GPU
pipeline, external source + .gpu(), built and run once: the CUDA context
and DALI's device set-up), ``build`` (fastread.decode_dali.DaliDecoder's
pipeline: the decoders' set-up), ``run1`` and ``run2`` (two runs of
``--batch`` JPEGs of the tree, resize 160 crop 160 as the pack bench), and
``build2`` (a second DaliDecoder's pipeline in the same process: what
stays of a build once CUDA is up). Variants: ``fancy`` (one decoder, the
host's upsampling), ``simple`` (one decoder, nvJPEG's upsampling: the
hardware decoder's output as it comes), each with ``--threads`` DALI
threads, and ``fancy-t4`` (4 threads).

    python bench/decoded/dali_start.py --tree DIR [--batch 256] [--threads 16] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {"fancy": dict(), "simple": dict(fancy_upsampling=False), "fancy-t4": dict(threads=4)}


def child(tree, variant, batch, threads, device="gpu"):
    t = {}
    t0 = time.perf_counter()
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    import fastread
    from fastread.decode import Preprocess
    from fastread.decode_dali import DaliDecoder, upright_size
    t["import"] = time.perf_counter() - t0

    t0 = time.perf_counter()

    @pipeline_def(batch_size=1, num_threads=1, device_id=0, exec_dynamic=True)
    def trivial():
        return fn.external_source(name="x", dtype=types.UINT8, ndim=1).gpu()

    if device == "gpu":
        p = trivial()
        p.build()
        p.feed_input("x", [np.zeros(4, np.uint8)])
        p.run()
    t["cuda"] = time.perf_counter() - t0

    paths = fastread.scan(tree)[0][:2 * batch]
    datas = [np.fromfile(q, np.uint8) for q in paths]
    pre = Preprocess(resize=160, crop=160)
    kw = dict(VARIANTS[variant])
    kw.setdefault("threads", threads)
    t0 = time.perf_counter()
    dec = DaliDecoder(pre, device=device, batch_size=batch, **kw)
    dec._pipeline()
    t["build"] = time.perf_counter() - t0
    for k in (1, 2):
        part = datas[(k - 1) * batch:k * batch]
        sizes = [pre.target_size(*upright_size(d)) for d in part]
        t0 = time.perf_counter()
        dec._run(part, sizes)
        t[f"run{k}"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    DaliDecoder(pre, device=device, batch_size=batch, **kw)._pipeline()
    t["build2"] = time.perf_counter() - t0
    assert upright_size(datas[0])
    print(json.dumps(t))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="gpu", help="cpu: a smoke test of this script alone")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.tree, args.child, args.batch, args.threads, args.device)
        return 0
    out = {}
    keys = ("import", "cuda", "build", "run1", "run2", "build2")
    print("| variant | " + " | ".join(f"{k} (s)" for k in keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for v in args.variants.split(","):
        r = subprocess.run([sys.executable, __file__, "--tree", args.tree, "--batch", str(args.batch),
                            "--threads", str(args.threads), "--device", args.device,
                            "--child", v],
                           capture_output=True, text=True, timeout=120)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode or not lines:
            print(f"| {v} | failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:120]} |")
            continue
        t = json.loads(lines[-1])
        out[v] = t
        print(f"| {v} | " + " | ".join(f"{t[k]:.3f}" for k in keys) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

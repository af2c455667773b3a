"""Shards under DDP: run with torchrun, one process per GPU (or CPU rank).

    torchrun --nproc_per_node 2 bench/gpu/ddp_check.py /tmp/fastread-imagenet-20k \
        --image /tmp/fastread-imagenet-20k.img --json results/ddp.json

For every loader (fastread.Reader on the host and to the GPU, ImageLoader,
fastread.dali readers.file and readers.image, each on the host and the GPU
where there is one) and every last-batch policy, each rank reads two epochs
of its shard (shuffled, seed 0, the shards from torchrun's RANK/WORLD_SIZE)
and identifies every sample by its bytes (CRC-32 and length). Rank 0 then
checks, per epoch:

* disjoint: no sample is delivered by two ranks (padding repeats a rank's
  own samples only);
* complete: the ranks together deliver every sample of the set (with
  drop_last, all but fewer than world_size * batch_size);
* equal batch counts on every rank wherever the policy promises them
  (pad_last_batch / DROP; PARTIAL may differ by one batch, which would hang
  a DDP all-reduce: reported, not failed);

and prints per-rank throughput (samples/s, MB/s). The set is the tree's
first --limit samples (an odd count by default, so shards differ in size).
Decoded batches (ImageLoader with decode) are counted, not identified.
Exit status 1 if any check failed.
"""
import argparse
import json
import os
import sys
import time
import zlib

import numpy as np


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="a JPEG tree (fastread make-dataset)")
    p.add_argument("--image", help="a packed image of the same tree (fastread pack)")
    p.add_argument("--limit", type=int, default=4099, help="samples of the tree to use")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", help="write every rank's results here (rank 0)")
    p.add_argument("--loaders", default="all",
                   help="comma-separated subset of: reader,reader-gpu,loader,loader-decode,"
                        "dali-file,dali-file-gpu,dali-image,dali-image-gpu")
    return p.parse_args()


def ident(a):
    """(crc32, length) of one sample on the host or a device."""
    if hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray):
        import torch
        a = torch.as_tensor(a, device="cuda").cpu().numpy()
    a = np.asarray(a)
    return (zlib.crc32(a.tobytes()), int(a.nbytes))


def run_reader(args, files, labels, rank, world, gpu, policy):
    import fastread
    out = []
    kw = dict(pad_last_batch=policy == "FILL", drop_last=policy == "DROP")
    with fastread.Reader(files=files, labels=labels, batch_size=args.batch_size,
                         shard_id=rank, num_shards=world, random_shuffle=True, seed=0,
                         device="gpu" if gpu else "cpu", **kw) as r:
        for epoch in range(args.epochs):
            r.set_epoch(epoch)
            t0, ids, nbytes, batches = time.perf_counter(), [], 0, 0
            for arrays, _ in r:
                batches += 1
                for a in arrays:
                    ids.append(ident(a))
                    nbytes += ids[-1][1]
            out.append(dict(batches=batches, ids=ids, bytes=nbytes,
                            seconds=time.perf_counter() - t0))
    return out


def run_loader(args, files, labels, rank, world, gpu, policy, decode):
    from fastread.torch import ImageLoader
    if policy == "FILL":
        return None  # ImageLoader has no padding policy
    loader = ImageLoader(files=files, labels=labels, batch_size=args.batch_size,
                         device="cuda" if gpu else "cpu", decode=decode, shard_id=rank,
                         num_shards=world, random_shuffle=True, seed=0,
                         drop_last=policy == "DROP", size=64)
    out = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0, ids, nbytes, batches, samples = time.perf_counter(), [], 0, 0, 0
        for images, _ in loader:
            batches += 1
            samples += len(images)
            if not decode:
                for a in images:
                    ids.append(ident(a.cpu().numpy()))
                    nbytes += ids[-1][1]
        out.append(dict(batches=batches, ids=ids if not decode else None, samples=samples,
                        bytes=nbytes, seconds=time.perf_counter() - t0))
    return out


def run_dali(args, kind, files, labels, rank, world, gpu, policy):
    from nvidia.dali import pipeline_def
    from fastread.dali import readers
    device_id = int(os.environ.get("LOCAL_RANK", 0)) if gpu else None

    @pipeline_def(batch_size=args.batch_size, num_threads=4, device_id=device_id)
    def pipe():
        common = dict(shard_id=rank, num_shards=world, random_shuffle=True, seed=0,
                      last_batch_policy=policy, device="gpu" if gpu else "cpu",
                      epoch_end="stop")
        if kind == "file":
            return readers.file(files=files, labels=labels, **common)
        return readers.image(image=args.image, **common)

    p = pipe()
    p.build()
    out = []
    for epoch in range(args.epochs):
        t0, ids, nbytes, batches = time.perf_counter(), [], 0, 0
        try:
            while True:
                data, _ = p.run()
                batches += 1
                host = data.as_cpu() if gpu else data
                for i in range(len(host)):
                    ids.append(ident(np.array(host.at(i))))
                    nbytes += ids[-1][1]
        except StopIteration:
            p.reset()
        out.append(dict(batches=batches, ids=ids, bytes=nbytes,
                        seconds=time.perf_counter() - t0))
    return out


def check(name, policy, per_rank, everything, world, batch_size):
    """Problems with one loader's epochs across ranks ([] if none)."""
    problems = []
    for epoch in range(len(per_rank[0])):
        eps = [r[epoch] for r in per_rank]
        counts = [e["batches"] for e in eps]
        if len(set(counts)) > 1:
            msg = f"{name} {policy} epoch {epoch}: batch counts differ across ranks {counts}"
            if policy == "PARTIAL":
                print(f"note: {msg} (PARTIAL; use pad_last_batch or DROP under DDP)")
            else:
                problems.append(msg)
        if eps[0].get("ids") is None:
            continue
        sets = [set(map(tuple, e["ids"])) for e in eps]
        for a in range(world):
            for b in range(a + 1, world):
                both = sets[a] & sets[b]
                if both:
                    problems.append(f"{name} {policy} epoch {epoch}: ranks {a} and {b} both "
                                    f"delivered {len(both)} samples")
        union = set().union(*sets)
        missing = everything - union
        extra = union - everything
        allowed = world * batch_size if policy == "DROP" else 0
        if len(missing) > allowed or extra:
            problems.append(f"{name} {policy} epoch {epoch}: {len(missing)} samples missing, "
                            f"{len(extra)} not in the set")
    return problems


def main():
    args = parse()
    import torch
    import torch.distributed as dist
    import fastread

    gpu_ok = torch.cuda.is_available()
    if gpu_ok:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if gpu_ok else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    paths, labels = fastread.scan(args.data)
    files, labels = paths[:args.limit], labels[:args.limit]
    everything = {ident(a) for a in fastread.read_files(files)}
    image_set = None
    if args.image:
        img = fastread.PackedImage(args.image)
        image_set = set()
        for s in range(0, len(img), 1024):
            image_set.update(ident(a) for a in img.read(np.arange(s, min(s + 1024, len(img)))))

    try:
        import nvidia.dali  # noqa: F401
        have_dali = True
    except ImportError:
        have_dali = False
    wanted = None if args.loaders == "all" else set(args.loaders.split(","))
    runs = [("reader", False), ("reader-gpu", True), ("loader", False), ("loader-decode", True),
            ("dali-file", False), ("dali-file-gpu", True), ("dali-image", False),
            ("dali-image-gpu", True)]
    results, problems = {}, []
    for name, needs_gpu in runs:
        if wanted is not None and name not in wanted:
            continue
        if needs_gpu and not gpu_ok and name != "loader-decode":
            continue
        if (name.startswith("dali") or name.startswith("loader")) and not have_dali:
            continue
        if name.startswith("dali-image") and not args.image:
            continue
        for policy in ("PARTIAL", "FILL", "DROP"):
            if name == "reader":
                res = run_reader(args, files, labels, rank, world, False, policy)
            elif name == "reader-gpu":
                res = run_reader(args, files, labels, rank, world, True, policy)
            elif name == "loader":
                res = run_loader(args, files, labels, rank, world, gpu_ok, policy, False)
            elif name == "loader-decode":
                res = run_loader(args, files, labels, rank, world, gpu_ok, policy, True)
            else:
                kind = "file" if name.startswith("dali-file") else "image"
                res = run_dali(args, kind, files, labels, rank, world, name.endswith("gpu"),
                               policy)
            if res is None:
                continue
            gathered = [None] * world
            dist.all_gather_object(gathered, res)
            if rank == 0:
                base = image_set if name.startswith("dali-image") else everything
                problems += check(name, policy, gathered, base, world, args.batch_size)
                for r, eps in enumerate(gathered):
                    e = eps[-1]
                    n = len(e["ids"]) if e.get("ids") is not None else e["samples"]
                    print(f"{name:15s} {policy:8s} rank {r}: {e['batches']:5d} batches "
                          f"{n:6d} samples {n / e['seconds']:10.0f} samples/s "
                          f"{e['bytes'] / e['seconds'] / 1e6:8.1f} MB/s (epoch {len(eps) - 1})")
                results[f"{name}/{policy}"] = [[{k: v for k, v in e.items() if k != "ids"}
                                               for e in eps] for eps in gathered]
            dist.barrier()
    if rank == 0:
        for p in problems:
            print("FAIL:", p)
        print("ddp_check:", "ok" if not problems else f"{len(problems)} problems",
              f"(world {world}, {len(files)} samples, batch {args.batch_size})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world": world, "samples": len(files), "batch_size": args.batch_size,
                           "problems": problems, "results": results}, f, indent=1)
    status = torch.tensor([len(problems)], device="cuda" if gpu_ok else "cpu")
    dist.broadcast(status, 0)
    dist.destroy_process_group()
    sys.exit(1 if int(status) else 0)


if __name__ == "__main__":
    main()

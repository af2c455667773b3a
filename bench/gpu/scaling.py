"""Decoded training input across GPUs (issue 32, benchmark b and c): run
under torchrun with 1, 2 (and 4) ranks, one per GPU, on the same JPEG tree.

    torchrun --standalone --nproc_per_node 2 bench/gpu/scaling.py /tmp/fastread-imagenet-20k \
        --loaders imageloader,dali --json results/scaling-2.json

Per rank, per loader, shuffled epochs of its shard (the shards from
torchrun's RANK/WORLD_SIZE; LOCAL_RANK picks the GPU):

* imageloader: ``fastread.torch.ImageLoader(device="cuda")``: fastread reads,
  DALI's mixed decoder decodes, resized and normalized float32 NCHW on the GPU;
* dali: ``fastread.dali.readers.file`` + ``fn.decoders.image(device="mixed")``
  + ``fn.random_resized_crop`` + ``fn.crop_mirror_normalize``, a DALI pipeline
  per rank.

The first epoch warms up (pipelines built, the tree in the page cache) and
is not timed; every later epoch is. Each batch is on the GPU and synchronized
before the clock stops. Rank 0 prints img/s per rank and in total (the
ranks' images over the slowest rank's time) and writes the JSON.
"""
import argparse
import json
import os
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="a JPEG tree (fastread make-dataset)")
    p.add_argument("--loaders", default="imageloader,dali")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader, the first untimed")
    p.add_argument("--threads", type=int, default=8, help="DALI CPU threads per rank")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--hw-decoder-load", type=float, default=None,
                   help="the mixed decoder's hw_decoder_load, both loaders (default: DALI's)")
    p.add_argument("--json")
    return p.parse_args()


def imageloader_epochs(args, rank, world, device_id):
    import torch
    from fastread.torch import ImageLoader
    loader = ImageLoader(args.data, args.batch_size, device="cuda", decode=True, size=args.size,
                         random_shuffle=True, seed=0, num_threads=args.threads,
                         device_id=device_id, shard_id=rank, num_shards=world,
                         hw_decoder_load=args.hw_decoder_load)
    out = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0, n = time.perf_counter(), 0
        for images, _labels in loader:
            n += images.shape[0]
        torch.cuda.synchronize(device_id)
        out.append((n, time.perf_counter() - t0))
    return out


def dali_epochs(args, rank, world, device_id):
    import fastread
    from nvidia.dali import fn, pipeline_def, types
    from fastread.dali import readers

    total = len(fastread.scan(args.data)[0])
    # The shard this rank reads (DALI's arithmetic: floor(total*r/world)..).
    shard = total * (rank + 1) // world - total * rank // world
    batches = -(-shard // args.batch_size)

    @pipeline_def(batch_size=args.batch_size, num_threads=args.threads, device_id=device_id,
                  prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = readers.file(file_root=args.data, shard_id=rank, num_shards=world,
                                     random_shuffle=True, seed=0, name="Reader")
        hw = {} if args.hw_decoder_load is None else {"hw_decoder_load": args.hw_decoder_load}
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, **hw)
        images = fn.random_resized_crop(images, size=args.size)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                          std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels.gpu()

    p = pipe()
    p.build()
    out = []
    for _epoch in range(args.epochs):
        t0, n = time.perf_counter(), 0
        for _ in range(batches):
            images, _labels = p.run()
            images.as_tensor()          # the batch is complete on the GPU
            n += len(images)
        out.append((n, time.perf_counter() - t0))
    return out


def main():
    args = parse()
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device_id = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(device_id)
    dist.init_process_group("gloo")
    results = {}
    for loader in args.loaders.split(","):
        dist.barrier()
        fn = {"imageloader": imageloader_epochs, "dali": dali_epochs}[loader]
        try:
            epochs = fn(args, rank, world, device_id)
            timed = epochs[1:] or epochs
            mine = {"images": sum(n for n, _ in timed), "seconds": sum(s for _, s in timed)}
        except Exception as e:  # reported by rank 0, the other loaders still run
            mine = {"error": f"{type(e).__name__}: {e}"}
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        results[loader] = gathered
    if rank == 0:
        report = {"world_size": world, "gpus": torch.cuda.device_count(),
                  "gpu": torch.cuda.get_device_name(0), "batch_size": args.batch_size,
                  "epochs_timed": max(args.epochs - 1, 1), "data": args.data, "loaders": {}}
        for loader, ranks in results.items():
            errors = [r["error"] for r in ranks if "error" in r]
            if errors:
                print(f"{loader}: {world} rank(s): failed: {errors[0]}")
                report["loaders"][loader] = {"error": errors[0]}
                continue
            per = [r["images"] / r["seconds"] for r in ranks]
            total = sum(r["images"] for r in ranks) / max(r["seconds"] for r in ranks)
            print(f"{loader}: {world} rank(s): {total:,.0f} img/s in all; per rank "
                  + ", ".join(f"{x:,.0f}" for x in per))
            report["loaders"][loader] = {"total_img_s": total, "per_rank_img_s": per,
                                         "ranks": ranks}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

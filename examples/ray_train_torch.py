"""Ray Train with samples read by fastread: one Ray Data dataset, split
among the training workers, each worker's batches on its GPU.

    python examples/ray_train_torch.py DATA_ROOT                 # 2 workers, GPUs if any
    python examples/ray_train_torch.py s3://bucket/train --workers 8 --gpu
    python examples/ray_train_torch.py DATA_ROOT --address auto  # an existing cluster

``fastread.ray.read_files`` lists DATA_ROOT (a class-per-directory tree, or
an ``s3://`` prefix) on the driver and reads each batch of files in one
native call on Ray's CPU workers, decoded there (``--decode``) or as bytes.
``TorchTrainer`` hands every worker its ``streaming_split`` shard
(``ray.train.get_dataset_shard``); each worker moves its batches to its GPU
(or keeps them on the CPU where it has none) and runs a step. The model is
a stand-in (a linear layer over image statistics): the point is the data
path. Each worker writes the paths it trained on; the driver prints each
rank's count (together: the dataset's size times the epochs).
"""
import argparse
import sys


def train_loop(config):
    """The loop every Ray Train worker runs."""
    import numpy as np
    import ray.train
    import torch

    device = ray.train.torch.get_device()   # the worker's GPU, or the CPU without one
    model = torch.nn.Linear(3, config["classes"]).to(device)
    model = ray.train.torch.prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    shard = ray.train.get_dataset_shard("train")
    seen, paths = 0, []
    for epoch in range(config["epochs"]):
        for batch in shard.iter_batches(batch_size=config["batch_size"], batch_format="numpy"):
            labels = torch.as_tensor(batch["label"].astype(np.int64), device=device)
            if "image" in batch:
                # Decoded on Ray's CPU workers: per-image channel means as features.
                feats = np.stack([np.asarray(im, np.float32).reshape(-1, 3).mean(0)
                                  for im in batch["image"]])
            else:
                # Bytes for the GPU side to decode (DALI, nvImageCodec): here,
                # byte statistics as stand-in features.
                feats = np.stack([np.frombuffer(b, np.uint8)[:3 * 64].astype(np.float32)
                                  .reshape(-1, 3).mean(0) if len(b) >= 3 else np.zeros(3, np.float32)
                                  for b in batch["bytes"]])
            x = torch.as_tensor(feats, device=device) / 255.0
            loss = torch.nn.functional.cross_entropy(model(x), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(labels)
            paths.extend(batch["path"].tolist())
        ray.train.report({"epoch": epoch, "samples": seen})
    if config.get("record_dir"):
        rank = ray.train.get_context().get_world_rank()
        with open(f"{config['record_dir']}/rank{rank}.txt", "w") as f:
            f.write("".join(p + "\n" for p in paths))


def run(root, *, workers=2, gpu=False, epochs=1, batch_size=64, decode=False, s3=None,
        storage_path=None, record_dir=None):
    """Trains over ``root``; returns Ray Train's Result (rank 0's last
    report). ``record_dir``: each worker also writes the paths it trained on
    there, one file per rank (``rank<N>.txt``), to check the split."""
    import fastread
    import fastread.ray
    import ray.train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    files = fastread.FileList.scan(root, s3=s3)   # listed once, on the driver
    ds = fastread.ray.read_files(files, batch_size=batch_size, shuffle=True, decode=decode, s3=s3)
    classes = int(files.labels.max()) + 1

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"epochs": epochs, "batch_size": batch_size, "classes": classes,
                           "record_dir": record_dir},
        # CPU workers take half a CPU each so that Ray Data's read tasks
        # still find CPUs on a small machine.
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpu,
                                     resources_per_worker=None if gpu else {"CPU": 0.5}),
        datasets={"train": ds},
        run_config=RunConfig(storage_path=storage_path),
    )
    return trainer.fit()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a class-per-directory tree or an s3:// prefix")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--decode", action="store_true", help="decode on Ray's CPU workers")
    p.add_argument("--address", help="an existing Ray cluster (default: start a local one)")
    p.add_argument("--storage-path", help="where Ray Train keeps results (shared storage "
                                          "on a multi-node cluster)")
    args = p.parse_args(argv)
    import os
    import tempfile

    import ray
    ray.init(address=args.address)
    # Where the workers write what they trained on: a local folder is enough
    # on one machine; on a cluster, give a shared one (--storage-path's).
    record_dir = tempfile.mkdtemp(prefix="fastread-ray-",
                                  dir=args.storage_path if args.storage_path else None)
    run(args.root, workers=args.workers, gpu=args.gpu, epochs=args.epochs,
        batch_size=args.batch_size, decode=args.decode, storage_path=args.storage_path,
        record_dir=record_dir)
    for name in sorted(os.listdir(record_dir)):
        with open(os.path.join(record_dir, name)) as f:
            print(f"{name[:-4]}: trained on {sum(1 for _ in f)} samples in {args.epochs} epoch(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ray Data feeding one DALI pipeline per Ray Train worker: fastread reads
the encoded files on Ray's CPU workers, DALI decodes them on each worker's
GPU.

    python examples/ray_dali.py DATA_ROOT                   # 2 workers, CPU decoding
    python examples/ray_dali.py s3://bucket/train --workers 8 --gpu

``fastread.ray.read_files`` (bytes, no decoding) is split among the workers
(``streaming_split`` through ``ray.train.get_dataset_shard``). Each worker
builds a DALI pipeline whose ``fn.external_source`` takes its shard's
batches (the files' bytes and labels) and decodes them with
``fn.decoders.image(device="mixed")`` on its GPU (on the CPU without one),
then resizes them to one size: the batches a model would take. Each worker
writes the paths it decoded (``--record-dir``), one file per rank.
"""
import argparse
import sys


def dali_loop(config):
    """What each Ray Train worker runs: its shard through its DALI pipeline."""
    import numpy as np
    import ray.train
    from nvidia.dali import fn, pipeline_def, types

    gpu = config["gpu"]
    device_id = ray.train.torch.get_device().index if gpu else None
    shard = ray.train.get_dataset_shard("train")
    batch_size = config["batch_size"]
    paths = []

    def batches():
        # The shard's rows, batch_size at a time (the last one may be short:
        # external_source takes batches of any size up to the pipeline's).
        for b in shard.iter_batches(batch_size=batch_size, batch_format="numpy"):
            paths.extend(b["path"].tolist())
            yield ([np.frombuffer(x, np.uint8) for x in b["bytes"]],
                   [np.array([v], np.int32) for v in b["label"]])

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=device_id,
                  prefetch_queue_depth=1)
    def pipe():
        jpegs, labels = fn.external_source(source=batches(), num_outputs=2, batch=True,
                                           dtype=[types.UINT8, types.INT32])
        images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu",
                                   output_type=types.RGB)
        images = fn.resize(images, resize_x=config["size"], resize_y=config["size"])
        return images, labels

    p = pipe()
    p.build()
    samples = 0
    try:
        while True:
            images, labels = p.run()
            samples += len(labels)   # a training step would take images here
    except StopIteration:
        pass
    ray.train.report({"samples": samples})
    if config.get("record_dir"):
        rank = ray.train.get_context().get_world_rank()
        with open(f"{config['record_dir']}/rank{rank}.txt", "w") as f:
            f.write("".join(q + "\n" for q in paths))


def run(root, *, workers=2, gpu=False, batch_size=32, size=64, s3=None, storage_path=None,
        record_dir=None):
    import fastread.ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ds = fastread.ray.read_files(root, batch_size=256, shuffle=True, s3=s3)
    trainer = TorchTrainer(
        dali_loop,
        train_loop_config={"gpu": gpu, "batch_size": batch_size, "size": size,
                           "record_dir": record_dir},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpu,
                                     resources_per_worker=None if gpu else {"CPU": 0.5}),
        datasets={"train": ds},
        run_config=RunConfig(storage_path=storage_path),
    )
    return trainer.fit()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a class-per-directory tree of images, or an s3:// prefix")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker; decode there")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--address", help="an existing Ray cluster (default: start a local one)")
    p.add_argument("--storage-path", help="Ray Train's results (shared storage on a cluster)")
    p.add_argument("--record-dir", help="write each rank's decoded paths here")
    args = p.parse_args(argv)
    import ray
    ray.init(address=args.address)
    run(args.root, workers=args.workers, gpu=args.gpu, batch_size=args.batch_size,
        storage_path=args.storage_path, record_dir=args.record_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

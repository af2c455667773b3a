"""fastread's decoded packs against FFCV in its matching mode, on the CPU
(issue 33: "at or above FFCV's rate in its matching mode where FFCV builds").

The same JPEG tree is written twice, each library's way, as raw pixels with
the longer side at most MAX (FFCV: ``RGBImageField(write_mode="raw",
max_resolution=MAX)``; fastread: ``fastread.pack(..., decode=True,
max_side=MAX)``), then read by a training pipeline that ends in the same
tensors: RandomResizedCrop to SIZE x SIZE, a horizontal flip, normalization
to float32 NCHW, labels as int64, one torch batch at a time:

- ffcv: ``Loader(order=RANDOM, os_cache=True)`` with
  ``RandomResizedCropRGBImageDecoder``, ``RandomHorizontalFlip``,
  ``NormalizeImage``, ``ToTensor``, ``ToTorchImage`` (FFCV's ImageNet
  example's pipeline, on the CPU);
- fastread: ``fastread.dali.readers.image(decoded=True, random_shuffle=True)``
  + ``fn.random_resized_crop`` + ``fn.crop_mirror_normalize`` (DALI on the
  CPU), through DALI's PyTorch iterator; "fastread-noaa" the same with
  ``antialias=False`` (DALI antialiases by default, FFCV resizes with
  OpenCV's INTER_AREA); "fastread-fused": ``ImageLoader(image=..., device="cpu",
  augment=True)`` on a pack of one shape (shorter side MAX, center-cropped
  MAX x MAX), the C core's fused crop/flip/normalize, no DALI.

Both use WORKERS threads or processes and batch BATCH; each round times
EPOCHS full epochs after an untimed one, the libraries alternating.

    flock /tmp/fastread-bench.lock python bench/decoded/ffcv_compare.py \
        [--tree /var/tmp/fastread-decoded/train] [--max-side 160] [--size 128] \
        [--batch 64] [--workers 2] [--epochs 2] [--rounds 3] [--json OUT]

Needs ``ffcv`` (it builds against the system's OpenCV and libjpeg-turbo:
``apt-get install libopencv-dev libturbojpeg0-dev``, then ``pip install
numba opencv-python-headless ffcv``) and DALI.
"""
import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406]) * 255
STD = np.array([0.229, 0.224, 0.225]) * 255


def write_ffcv(tree, out, max_side, workers):
    """The tree as an FFCV .beton of raw pixels (once; reused after)."""
    if os.path.exists(out):
        return
    from PIL import Image
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    import fastread
    paths, labels = fastread.scan(tree)

    class Tree:
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            return Image.open(paths[i]).convert("RGB"), int(labels[i])

    tmp = out + ".tmp"
    DatasetWriter(tmp, {"image": RGBImageField(write_mode="raw", max_resolution=max_side),
                        "label": IntField()}, num_workers=workers).from_indexed_dataset(Tree())
    os.replace(tmp, out)


def ffcv_epochs(beton, args):
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor,
                                 ToTorchImage)

    loader = Loader(beton, batch_size=args.batch, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False, seed=0,
                    pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((args.size, args.size)),
                                  RandomHorizontalFlip(), NormalizeImage(MEAN, STD, np.float32),
                                  ToTensor(), ToTorchImage()],
                        "label": [IntDecoder(), ToTensor(), Squeeze()]})

    return lambda: count_epoch(loader, args)


def count_epoch(batches, args):
    """Images in one pass over (images, labels) torch batches, each checked
    to be float32 (N, 3, SIZE, SIZE)."""
    import torch
    n = 0
    for images, _labels in batches:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, args.size, args.size)
        n += images.shape[0]
    return n


def fastread_epochs(pack, args, antialias=True):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from fastread.dali import readers

    @pipeline_def(batch_size=args.batch, num_threads=args.workers, device_id=None, seed=0)
    def pipe():
        images, labels = readers.image(image=pack, decoded=True, random_shuffle=True,
                                       name="Reader")
        images = fn.random_resized_crop(images, size=(args.size, args.size), antialias=antialias)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mirror=fn.random.coin_flip(), mean=MEAN.tolist(),
                                          std=STD.tolist())
        return images, labels

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["images", "labels"], reader_name="Reader",
                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    return lambda: count_epoch(((out[0]["images"], out[0]["labels"]) for out in it), args)


def fused_epochs(pack, args):
    """ImageLoader on a raw pack of one shape (center-cropped at pack time):
    the C core's fused crop/flip/normalize on the CPU, no DALI."""
    from fastread.torch import ImageLoader

    loader = ImageLoader(image=pack, batch_size=args.batch, device="cpu", size=args.size,
                         augment=True, random_shuffle=True, seed=0, num_threads=args.workers)

    return lambda: count_epoch(loader, args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default="/var/tmp/fastread-decoded/train")
    ap.add_argument("--max-side", type=int, default=160)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    import fastread
    base = os.path.join(os.path.dirname(os.path.abspath(args.tree)),
                        f"{os.path.basename(args.tree)}.max{args.max_side}")
    beton, pack = base + ".beton", base + ".img"
    t0 = time.perf_counter()
    write_ffcv(args.tree, beton, args.max_side, args.workers)
    t_ffcv = time.perf_counter() - t0
    t0 = time.perf_counter()
    if not os.path.exists(pack):
        fastread.pack(args.tree, pack, decode=True, max_side=args.max_side, progress=False)
    t_fr = time.perf_counter() - t0
    images = len(fastread.PackedImage(pack).labels)
    # The fused path needs one shape: shorter side MAX, center-cropped MAX x MAX.
    square = base + f".crop{args.max_side}.img"
    if not os.path.exists(square):
        fastread.pack(args.tree, square, decode=True, resize=args.max_side, crop=args.max_side,
                      progress=False)

    # fastread: DALI's resize antialiased (its default) and not; FFCV's
    # decoder resizes with OpenCV's INTER_AREA.
    runs = {"ffcv": ffcv_epochs(beton, args), "fastread": fastread_epochs(pack, args),
            "fastread-noaa": fastread_epochs(pack, args, antialias=False),
            "fastread-fused": fused_epochs(square, args)}
    for run in runs.values():
        assert run() == images  # untimed: caches, compilation (numba), pools
    rates = {name: [] for name in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            t0 = time.perf_counter()
            n = sum(runs[name]() for _ in range(args.epochs))
            rates[name].append(n / (time.perf_counter() - t0))
            print(f"round {r} {name:14} {rates[name][-1]:10,.0f} img/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n{images} images, raw, longer side <= {args.max_side}; RandomResizedCrop {args.size}, "
          f"flip, normalize to float32 NCHW; batch {args.batch}, {args.workers} workers; "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})")
    print(f"{'library':14} {'img/s (median)':>15} {'vs ffcv':>8}  bytes/image  written in")
    for name, path, secs in (("ffcv", beton, t_ffcv), ("fastread", pack, t_fr),
                             ("fastread-noaa", pack, t_fr), ("fastread-fused", square, 0)):
        print(f"{name:14} {med[name]:15,.0f} {med[name] / med['ffcv']:7.2f}x  "
              f"{os.path.getsize(path) / images:11,.0f}  {secs:.1f} s (0: reused)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "images": images, "rates": rates, "median": med,
                       "cpus": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()

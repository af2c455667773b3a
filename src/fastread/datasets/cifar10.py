"""A synthetic CIFAR-10 in the distribution's own layouts.

:func:`make_cifar10` writes ``root/cifar-10-batches-bin/`` (``data_batch_1.bin``
.. ``_5.bin``, ``test_batch.bin``, ``batches.meta.txt``: 3073-byte records,
a label byte then the image's red, green and blue 32x32 planes) and/or
``root/cifar-10-batches-py/`` (``data_batch_1`` .. ``_5``, ``test_batch``:
pickled dicts with ``data``, an N x 3072 uint8 array, ``labels``,
``filenames`` and ``batch_label``; ``batches.meta``: a pickled dict with
``label_names``, ``num_cases_per_batch`` and ``num_vis``, as the real set
has), the files ``torchvision.datasets.CIFAR10`` and the CIFAR-10 binary
readers read. torchvision also checks each file's MD5 against the real
archive's, which a synthetic set cannot match: open it with that check
bypassed (``fastread.bench.families.formats.torchvision_cifar10``).

Images are random (seeded) with a per-class tint so that classes differ;
labels are balanced and shuffled. The real sets have 5,000 train and 1,000
test images per class (``train_per_class=5000, test_per_class=1000``, the
default). Reusable like the other generators: a complete dataset made with
the same parameters (``root/.fastread-dataset.json``, written last) that
still has all its files is returned at once; files are written under
temporary names and renamed.
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from fastread.datasets._shared import MARKER_NAME, DatasetInfo, reuse_marked, atomic_write, \
    check_int, write_json

__all__ = ["make_cifar10"]

_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
            "truck")
_IMAGE = 3072
_FORMAT = "cifar10"
_VERSION = 1


def make_cifar10(root, *, train_per_class=5000, test_per_class=1000, layouts=("bin", "py"),
                 seed=0, progress=False) -> DatasetInfo:
    """Writes (or reuses) a synthetic CIFAR-10 under ``root`` in the given
    ``layouts`` (``"bin"``, ``"py"``). Returns a DatasetInfo (``files``
    counts images, train and test; ``total_bytes`` the batch files)."""
    root = os.path.abspath(os.fspath(root))
    train_per_class = check_int("train_per_class", train_per_class, 5)
    test_per_class = check_int("test_per_class", test_per_class, 1)
    layouts = tuple(sorted(set(layouts)))
    if not layouts or set(layouts) - {"bin", "py"}:
        raise ValueError(f"layouts must be a non-empty subset of ('bin', 'py'), got {layouts!r}")
    params = {"format": _FORMAT, "version": _VERSION, "train_per_class": train_per_class,
              "test_per_class": test_per_class, "layouts": list(layouts), "seed": int(seed)}
    marker = os.path.join(root, MARKER_NAME)
    done = reuse_marked(root, params, required=_files(layouts))
    if done is not None:
        return done
    rng = np.random.default_rng([seed, 0xC1FA])
    sets = [(f"data_batch_{i + 1}", train_per_class * 10 // 5, i + 1) for i in range(5)]
    sets.append(("test_batch", test_per_class * 10, 0))
    # Balanced labels over the train set (shuffled across its five files) and the test set.
    train_labels = rng.permutation(np.repeat(np.arange(10, dtype=np.uint8), train_per_class))
    test_labels = rng.permutation(np.repeat(np.arange(10, dtype=np.uint8), test_per_class))
    tints = rng.integers(0, 128, size=(10, 3), dtype=np.uint8)
    total = 0
    start = 0
    bar = _progress(progress, len(sets))
    for name, n, number in sets:
        if number:
            labels, start = train_labels[start:start + n], start + n
        else:
            labels = test_labels
        noise = rng.integers(0, 128, size=(n, 3, 1024), dtype=np.uint8)
        data = (noise + tints[labels][:, :, None]).reshape(n, _IMAGE)
        batch_label = (f"training batch {number} of 5" if number else "testing batch 1 of 1")
        if "bin" in layouts:
            d = os.path.join(root, "cifar-10-batches-bin")
            os.makedirs(d, exist_ok=True)
            records = np.empty((n, 1 + _IMAGE), np.uint8)
            records[:, 0] = labels
            records[:, 1:] = data
            total += _write(d, f"{name}.bin", records.tobytes())
        if "py" in layouts:
            d = os.path.join(root, "cifar-10-batches-py")
            os.makedirs(d, exist_ok=True)
            entry = {"batch_label": batch_label, "labels": labels.astype(int).tolist(),
                     "data": data,
                     "filenames": [f"synthetic_{number}_{i}.png" for i in range(n)]}
            total += _write(d, name, pickle.dumps(entry, protocol=4))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if "bin" in layouts:
        _write(os.path.join(root, "cifar-10-batches-bin"), "batches.meta.txt",
               ("\n".join(_CLASSES) + "\n").encode())
    if "py" in layouts:
        _write(os.path.join(root, "cifar-10-batches-py"), "batches.meta",
               pickle.dumps({"label_names": list(_CLASSES), "num_cases_per_batch": sets[0][1],
                             "num_vis": _IMAGE}, protocol=4))
    images = sum(n for _, n, _ in sets)
    info = DatasetInfo(root=root, classes=10, per_class=train_per_class + test_per_class,
                       files=images, total_bytes=total, mean_bytes=float(_IMAGE))
    write_json(marker, {"params": params, "info": info.__dict__})
    return info


def _files(layouts):
    """Every file make_cifar10 writes for these layouts, relative to root."""
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    files = []
    if "bin" in layouts:
        files += [f"cifar-10-batches-bin/{n}.bin" for n in names]
        files.append("cifar-10-batches-bin/batches.meta.txt")
    if "py" in layouts:
        files += [f"cifar-10-batches-py/{n}" for n in names]
        # torchvision's CIFAR10 reads the class names from it (_load_meta).
        files.append("cifar-10-batches-py/batches.meta")
    return files


def _write(d, name, data):
    path = os.path.join(d, name)
    atomic_write(f"{path}.{os.getpid()}.tmp", path, data)
    return len(data)


def _progress(enabled, total):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="file", desc="cifar10")

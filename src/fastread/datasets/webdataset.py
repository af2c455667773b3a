"""Synthetic WebDataset shards: tar files of JPEG images with their labels.

:func:`make_webdataset` writes ``root/shard-000000.tar`` .. (``.tar.gz`` with
``compress=True``), each holding ``per_shard`` samples ``<key>.jpg`` (a
baseline JPEG of smooth seeded noise, ``width`` x ``height``), ``<key>.cls``
(the label as decimal text) and ``<key>.json`` (``{"label": ..}``), keys
``s<shard>_<i>``, as the webdataset library's ``TarWriter`` lays samples
out. Reusable like the other generators (``root/.fastread-dataset.json``,
written last); shards are written under temporary names and renamed.
"""
from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np

from fastread.datasets._shared import MARKER_NAME, DatasetInfo, reuse_marked, check_int, write_json

__all__ = ["make_webdataset"]

_VERSION = 1


def _jpeg(rng, width, height, quality=90):
    from PIL import Image

    small = rng.integers(0, 256, size=(max(2, height // 16), max(2, width // 16), 3),
                         dtype=np.uint8)
    img = Image.fromarray(small).resize((width, height), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_webdataset(root, *, shards=4, per_shard=1000, classes=10, width=160, height=120,
                    compress=False, seed=0, progress=False) -> DatasetInfo:
    """Writes (or reuses) ``shards`` WebDataset tar shards of ``per_shard``
    samples (jpg, cls, json) under ``root``. Returns a DatasetInfo
    (``files`` counts samples, ``total_bytes`` the shards' bytes)."""
    root = os.path.abspath(os.fspath(root))
    shards = check_int("shards", shards, 1)
    per_shard = check_int("per_shard", per_shard, 1)
    classes = check_int("classes", classes, 1)
    width, height = check_int("width", width, 8), check_int("height", height, 8)
    params = {"format": "webdataset", "version": _VERSION, "shards": shards,
              "per_shard": per_shard, "classes": classes, "width": width, "height": height,
              "compress": bool(compress), "seed": int(seed)}
    marker = os.path.join(root, MARKER_NAME)
    done = reuse_marked(root, params, stale=lambda name: name.startswith("shard-")
                        and name.endswith((".tar", ".tar.gz")))
    if done is not None:
        return done
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=shards, unit="shard", desc="webdataset")
        except ImportError:
            pass
    total = 0
    ext = ".tar.gz" if compress else ".tar"
    for s in range(shards):
        rng = np.random.default_rng([seed, 0x3DA7A, s])
        path = os.path.join(root, f"shard-{s:06d}{ext}")
        tmp = f"{path}.{os.getpid()}.tmp"
        with tarfile.open(tmp, "w:gz" if compress else "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(per_shard):
                key = f"s{s:06d}_{i:06d}"
                label = int(rng.integers(0, classes))
                for e, data in (("jpg", _jpeg(rng, width, height)),
                                ("cls", str(label).encode()),
                                ("json", json.dumps({"label": label}).encode())):
                    info = tarfile.TarInfo(f"{key}.{e}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, path)
        total += os.path.getsize(path)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    n = shards * per_shard
    info = DatasetInfo(root=root, classes=classes, per_class=0, files=n, total_bytes=total,
                       mean_bytes=total / n)
    write_json(marker, {"params": params, "info": info.__dict__})
    return info

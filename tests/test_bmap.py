"""bmap: FIEMAP extent maps of real files here (checked against the bytes on
the block device when it can be read), multi-extent files made by
interleaved appends, the CLI, and loading the seed's bmap.json as it is."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastread
from fastread.bmap import build_bmap, fiemap, load_bmap, write_bmap


def _fiemap_or_skip(path):
    try:
        return fiemap(path)
    except OSError as e:
        pytest.skip(f"no FIEMAP on this file system: {e}")


def _device_of(path):
    """/dev node of the block device holding path, if readable here."""
    st = os.stat(path)
    try:
        with open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/uevent") as f:
            name = dict(line.strip().split("=", 1) for line in f if "=" in line).get("DEVNAME")
    except OSError:
        return None
    dev = f"/dev/{name}" if name else None
    try:  # containers often list the node but refuse opening it (EPERM)
        with open(dev, "rb", buffering=0):
            return dev
    except (OSError, TypeError):
        return None


def _bytes_from_device(dev, entry):
    out = bytearray()
    with open(dev, "rb", buffering=0) as f:
        for x in entry["extents"]:
            f.seek(x["physical"])
            out += f.read(x["length"])
    return bytes(out)


def _check_entry(entry, size):
    assert entry["size"] == size
    ext = entry["extents"]
    if size == 0:
        assert ext == [] and entry["endblock"] == entry["startblock"] - 1
        return
    # Extents cover the file in order, without gaps, and add up to its size.
    assert ext[0]["logical"] == 0
    for a, b in zip(ext, ext[1:]):
        assert b["logical"] == a["logical"] + a["length"]
    assert sum(x["length"] for x in ext) == size
    lba = entry["lba_size"]
    for x in ext:
        assert x["startblock"] == x["physical"] // lba
        assert x["endblock"] == (x["physical"] + x["length"] - 1) // lba
    assert entry["startblock"] == ext[0]["startblock"]
    assert entry["endblock"] == ext[-1]["endblock"]


def test_bmap_of_a_tree(edge_tree):
    root, content = edge_tree
    _fiemap_or_skip(next(iter(content)))
    bm = build_bmap(root, progress=False)
    paths, _labels = fastread.scan(root)
    prefix = os.path.basename(root)
    assert list(bm) == [f"{prefix}/{os.path.relpath(p, root)}" for p in paths]
    dev = _device_of(root)
    for key, p in zip(bm, paths):
        entry = bm[key]
        _check_entry(entry, len(content[p]))
        assert not {"delalloc", "unknown"} & {f for x in entry["extents"] for f in x["flags"]}
        if dev and entry["extents"] and not any(x["flags"] for x in entry["extents"]):
            assert _bytes_from_device(dev, entry) == content[p], key


def test_multi_extent_files_from_interleaved_appends(tmp_path_factory, disk_tmp):
    root = os.path.join(disk_tmp, "interleaved")
    cls = os.path.join(root, "train_class")
    os.makedirs(cls)
    rng = np.random.default_rng(5)
    names = ["a.jpg", "b.jpg"]
    data = {n: bytearray() for n in names}
    files = {n: open(os.path.join(cls, n), "wb") for n in names}
    try:
        for _ in range(8):  # each append allocated on its own, the two files alternating
            for n in names:
                chunk = rng.integers(0, 256, 4096 + 100, dtype=np.uint8).tobytes()
                files[n].write(chunk)
                files[n].flush()
                os.fsync(files[n].fileno())
                data[n] += chunk
    finally:
        for f in files.values():
            f.close()
    extents = [len(_fiemap_or_skip(os.path.join(cls, n))) for n in names]
    if max(extents) < 2:
        pytest.skip("this file system kept interleaved appends contiguous")
    bm = build_bmap(root, prefix="train", lba_size=4096, progress=False)
    assert sorted(bm) == ["train/train_class/a.jpg", "train/train_class/b.jpg"]
    dev = _device_of(root)
    for n in names:
        entry = bm[f"train/train_class/{n}"]
        _check_entry(entry, len(data[n]))
        assert entry["lba_size"] == 4096
        if len(entry["extents"]) > 1:
            assert entry["contiguous"] is False
        if dev:
            assert _bytes_from_device(dev, entry) == bytes(data[n])
    # Round trip through the file, and the CLI writes the same map.
    out = str(tmp_path_factory.mktemp("bm") / "bmap.json")
    write_bmap(bm, out)
    assert load_bmap(out) == {k: dict(v) for k, v in bm.items()}
    cli_out = out + ".cli"
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bmap", root, "-o", cli_out,
                        "--prefix", "train", "--lba-size", "4096", "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "not contiguous (more than one extent" in r.stdout
    assert load_bmap(cli_out) == load_bmap(out)


SEED_BMAP = {
    "train/n01440764/n01440764_10026.JPEG": {"startblock": 34078720, "endblock": 34078747},
    "train/n01440764/n01440764_10027.JPEG": {"startblock": "34078748", "endblock": "34078790"},
    "train/n01443537/n01443537_10007.JPEG": {"endblock": 35000001, "startblock": 35000000},
}


def test_load_seed_bmap(tmp_path):
    p = tmp_path / "bmap.json"
    p.write_text(json.dumps(SEED_BMAP, indent=4))
    bm = load_bmap(str(p))
    assert list(bm) == list(SEED_BMAP)
    e = bm["train/n01440764/n01440764_10027.JPEG"]
    assert (e["startblock"], e["endblock"]) == (34078748, 34078790)
    assert e["extents"] is None and e["size"] is None and e["lba_size"] is None
    assert bm["train/n01443537/n01443537_10007.JPEG"]["startblock"] == 35000000
    assert fastread.load_bmap is load_bmap


@pytest.mark.parametrize("doc, match", [
    ([1, 2], "JSON object"),
    ({"train/a/x": {"startblock": 1}}, "lacks startblock/endblock"),
    ({"train/a/x": {"startblock": "one", "endblock": 2}}, "not an integer"),
    ({"train/a/x": {"startblock": 9, "endblock": 2}}, "startblock 9"),
])
def test_load_bmap_rejects_malformed(tmp_path, doc, match):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=match):
        load_bmap(str(p))


def test_load_bmap_not_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_bmap(str(p))


def test_extents_placed_backwards_load(tmp_path):
    # The allocator may put a file's later extent at a lower address.
    entry = {"startblock": 100, "endblock": 10, "size": 8192, "lba_size": 4096,
             "extents": [{"logical": 0, "physical": 409600, "length": 4096},
                         {"logical": 4096, "physical": 40960, "length": 4096}]}
    p = tmp_path / "bmap.json"
    p.write_text(json.dumps({"train/c/x.jpg": entry}))
    assert load_bmap(str(p))["train/c/x.jpg"]["endblock"] == 10
    p.write_text(json.dumps({"train/c/y.jpg": {"startblock": 100, "endblock": 10}}))
    with pytest.raises(ValueError, match="endblock"):
        load_bmap(str(p))


def test_holes_and_preallocated_extents(disk_tmp, tmp_path):
    """A trailing hole (one extent [0, 8192) of a 65536-byte file) was
    reported contiguous, with an endblock for byte 8191; fallocated
    ('unwritten') extents, whose raw blocks hold stale data, were not
    counted as unmappable."""
    from fastread.bmap import UNMAPPABLE
    root = os.path.join(disk_tmp, "holes")
    cls = os.path.join(root, "c")
    os.makedirs(cls)
    holey = os.path.join(cls, "holey.jpg")
    with open(holey, "wb") as f:
        f.write(os.urandom(8192))
        f.truncate(65536)
        os.fsync(f.fileno())
    ext = _fiemap_or_skip(holey)
    if sum(length for _l, _p, length, _f in ext) >= 65536:
        pytest.skip("this file system allocated the hole")
    prealloc = os.path.join(cls, "prealloc.jpg")
    fd = os.open(prealloc, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, 65536)
        os.fsync(fd)
    finally:
        os.close(fd)
    whole = os.path.join(cls, "whole.jpg")
    with open(whole, "wb") as f:
        f.write(os.urandom(8192))
        os.fsync(f.fileno())
    bm = build_bmap(root, prefix="t", progress=False)
    assert bm["t/c/holey.jpg"]["contiguous"] is False
    assert bm["t/c/holey.jpg"]["size"] == 65536
    assert bm["t/c/whole.jpg"]["contiguous"] is True
    assert "unwritten" in UNMAPPABLE
    flags = {f for x in bm["t/c/prealloc.jpg"]["extents"] for f in x["flags"]}
    out = str(tmp_path / "b.json")
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bmap", root, "-o", out,
                        "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1 not contiguous" in r.stdout
    if "unwritten" in flags:
        assert "1 with extents not addressable" in r.stdout
    assert load_bmap(out)["holes/c/holey.jpg"]["contiguous"] is False


def test_missing_output_directory_is_named(edge_tree, tmp_path):
    """The error named the temporary (b.json.tmp-...) after mapping the tree."""
    root, _content = edge_tree
    out = str(tmp_path / "nodir" / "b.json")
    with pytest.raises(FileNotFoundError) as e:
        write_bmap({}, out)
    assert out in str(e.value) and ".tmp-" not in str(e.value)
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bmap", root, "-o", out,
                        "--quiet"], capture_output=True, text=True)
    assert r.returncode == 1 and "nodir/b.json" in r.stderr and ".tmp-" not in r.stderr

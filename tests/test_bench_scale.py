"""The scale benchmark family (fastread bench --family scale, issue 37): its
generators make what they say, and its smallest run goes end to end with
rows that carry every field (no timing is asserted: benchmarks are not
timed tests)."""
import json
import os
import subprocess
import sys
import tarfile
import zlib

import numpy as np
import pytest

import fastread

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALE = os.path.join(REPO, "bench", "scale")
sys.path.insert(0, SCALE)

import generate  # noqa: E402  (bench/scale/generate.py)

from fastread.bench.families import scale  # noqa: E402


def sample_id(data):
    return int.from_bytes(bytes(data[:8]), "little")


def test_files_tree(tmp_path):
    root = generate.make_files(str(tmp_path / "f"), 250)
    paths, labels = fastread.scan(root)
    assert len(paths) == 250 and len(set(labels)) == generate.folders_for(250) == 2
    ids = sorted(sample_id(open(p, "rb").read()) for p in paths)
    assert ids == list(range(250))
    assert open(paths[7], "rb").read() == generate.sample_bytes(7)
    mtime = os.stat(paths[0]).st_mtime_ns
    generate.make_files(root, 250)          # the marker matches: reused, not rewritten
    assert os.stat(paths[0]).st_mtime_ns == mtime


@pytest.mark.parametrize("sparse", [False, True])
def test_packed_image(tmp_path, sparse):
    img = fastread.PackedImage(generate.make_image(str(tmp_path / "i"), 300, sparse=sparse))
    assert len(img) == 300 and img.alignment == generate.ALIGNMENT
    data = [a.tobytes() for a in img.read(np.arange(300))]
    for i, d in enumerate(data):
        want = bytes(generate.SAMPLE_BYTES) if sparse else generate.sample_bytes(i)
        assert d == want and zlib.crc32(d) == int(img.checksums[i])
    if sparse:   # holes: the image's blocks are (almost) all unallocated
        st = os.stat(img.path)
        assert st.st_blocks * 512 < st.st_size // 4
    assert fastread.verify(img.path) == []   # no sample fails its CRC


def test_webdataset_shards_and_wds2idx(tmp_path):
    shards = generate.make_wds(str(tmp_path / "w"), 25, per_shard=10)
    assert [os.path.basename(s) for s in shards] == [
        "shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    with tarfile.open(shards[2]) as t:
        names = t.getnames()
        assert names == [f"{i:09d}.{e}" for i in range(20, 25) for e in ("jpg", "cls")]
        assert t.extractfile("000000021.jpg").read() == generate.sample_bytes(21)
        assert t.extractfile("000000021.cls").read() == b"21"
    # DALI's wds2idx v1.2: "v1.2 N", then per sample "ext offset size name ..."
    lines = open(generate.index_path_of(shards[1])).read().splitlines()
    assert lines[0] == "v1.2 10" and len(lines) == 11
    raw = open(shards[1], "rb").read()
    for j, line in enumerate(lines[1:]):
        f = line.split()
        assert f[0] == "jpg" and f[4] == "cls" and f[3] == f"{10 + j:09d}.jpg"
        off, size = int(f[1]), int(f[2])
        assert raw[off:off + size] == generate.sample_bytes(10 + j)
        assert raw[int(f[5]):int(f[5]) + int(f[6])] == str(10 + j).encode()
    src = fastread.WebDataset(shards, ["jpg", "cls"])
    assert len(src) == 25


def test_squirrel_store(tmp_path):
    pytest.importorskip("msgpack")
    root = generate.make_squirrel(str(tmp_path / "s"), 45, per_shard=20)
    assert sorted(os.listdir(root)) == [".scale-dataset.json", "shard_00000.gz",
                                        "shard_00001.gz", "shard_00002.gz"]
    src = fastread.SquirrelStore(root, keys=("image", "label"), cache_dir=str(tmp_path / "c"))
    images, labels = src.fields(src.read(np.arange(45)), np.arange(45))
    assert [sample_id(a.tobytes()) for a in images] == list(range(45))
    assert [int(x) for x in labels] == list(range(45))


def test_child_measures_peaks(tmp_path):
    root = generate.make_files(str(tmp_path / "f"), 120)
    spec = {"impl": "fastread", "kind": "files", "n": 120, "data": {"root": root},
            "batch_size": 32, "workers": None, "nofile": 256, "max_batches": None,
            "verify": True, "variant": {}}
    row = scale.run_child(sys.executable, os.path.join(SCALE, "case.py"), spec, 120, 4000)
    assert row["status"] == "ok" and row["verified"] and row["samples"] == 120
    assert row["nofile"] == 256
    assert row["peak_threads"] >= 1 and row["peak_fds"] >= 3
    assert row["peak_rss_mb"] >= row["base_rss_mb"] > 0


def test_child_reports_a_failure(tmp_path):
    spec = {"impl": "fastread", "kind": "files", "n": 5,
            "data": {"root": str(tmp_path / "missing")}, "batch_size": 4, "verify": False}
    row = scale.run_child(sys.executable, os.path.join(SCALE, "case.py"), spec, 60, 4000)
    assert row["status"] == "failed" and "missing" in row["error"]


def test_smallest_run_end_to_end(tmp_path):
    out = tmp_path / "scale.json"
    rc = scale.main(["--data-dir", str(tmp_path / "d"), "--sizes", "300",
                     "--many-sizes", "300", "--cases", "files,image,wds,wds-many,squirrel",
                     "--no-peers", "--verify", "--batch-size", "64", "--repo", REPO,
                     "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["machine"]["nproc"] and set(doc["features"]) >= {"WebDataset(index_paths=)",
                                                                 "Reader(shuffle=)"}
    rows = doc["rows"]
    cases = {(r["case"], json.dumps(r["variant"], sort_keys=True)) for r in rows}
    assert ("files", "{}") in cases and ("wds-many", "{}") in cases
    assert ("wds", '{"index_files": true}') in cases
    for r in rows:
        assert r["status"] in ("ok", "unsupported", "failed"), r
        assert {"impl", "case", "n", "path", "peak_rss_mb", "peak_threads", "peak_fds",
                "nofile"} <= set(r)
        if r["status"] == "unsupported":
            assert "not in this fastread" in r["error"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["case"] for r in ok} == {"files", "image", "wds", "wds-many", "squirrel"}
    for r in ok:
        assert r["verified"] and r["samples"] == 300
        assert r["startup_s"] > 0 and r["samples_per_s"] > 0 and r["rss_per_sample_b"] >= 0
    wds_many = next(r for r in ok if r["case"] == "wds-many" and not r["variant"])
    assert wds_many["shards"] == 30


def test_cli_family_errors():
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bench", "--family", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--family nope" in r.stderr and "scale" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bench", "--family", "files"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no run of its own" in r.stderr

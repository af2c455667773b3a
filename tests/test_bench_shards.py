"""bench/s3/bench_shards.py end to end on a small tree against a real server:
the tree becomes tar shards whose samples are the tree's files, and every
reader that needs no optional peer (fastread's, boto3, curl) reads each
pass whole, at 0 ms (direct) and 5 ms (through the delay proxy); a reader
whose peer is missing is skipped with the reason, never an error."""

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "bench", "s3")
sys.path.insert(0, BENCH)


def make_tree(tree):
    from fastread.cli import main as fastread_cli
    saved = sys.argv
    try:
        sys.argv = ["fastread", "make-dataset", str(tree), "--classes", "2", "--per-class", "12",
                    "--seed", "0", "--quiet"]
        fastread_cli()
    finally:
        sys.argv = saved


def test_write_wds_holds_every_file_of_the_tree_once(tmp_path):
    import bench_shards
    tree = tmp_path / "tree"
    make_tree(tree)
    samples = bench_shards.tree_samples(str(tree))
    assert len(samples) == 24 and [s[2] for s in samples] == [0] * 12 + [1] * 12
    out = tmp_path / "wds"
    out.mkdir()
    bench_shards.write_wds(samples, str(out), shard_bytes=300_000)
    shards = sorted(os.listdir(out))
    assert len(shards) > 1
    members = {}
    for name in shards:
        with tarfile.open(out / name) as tar:
            for m in tar.getmembers():
                members[m.name] = tar.extractfile(m).read()
    for key, path, label in samples:
        with open(path, "rb") as f:
            assert members.pop(f"{key}.jpg") == f.read()
        assert members.pop(f"{key}.cls") == str(label).encode()
    assert not members


def test_bench_reads_every_pass_whole(tmp_path, s3_server):
    # s3_server: the skip when there is no weed (the bench starts its own).
    tree = tmp_path / "tree"
    make_tree(tree)
    out = tmp_path / "report.json"
    readers = "read_files,fastread-wds,boto3,curl,curl-ranges"
    cmd = [sys.executable, os.path.join(BENCH, "bench_shards.py"), "--dataset", str(tree),
           "--classes", "2", "--per-class", "12", "--shard-mb", "1",
           "--workdir", str(tmp_path / "work"), "--rounds", "1", "--passes", "2",
           "--delays", "0,5", "--readers", readers, "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    wds = report["dataset"]["formats"]["wds"]
    shard_bytes = sum(os.path.getsize(os.path.join(tmp_path, "work", "formats", "wds", n))
                      for n in os.listdir(tmp_path / "work" / "formats" / "wds")
                      if n.endswith(".tar"))
    assert report["dataset"]["samples"] == 24 and wds["bytes"] == shard_bytes and wds["objects"] > 1
    got = {(m["reader"], m["delay_ms"]): m for m in report["measurements"]}
    for reader in readers.split(","):
        for delay, via in ((0, "direct"), (5, "proxy")):
            if f"{reader}@{delay}" in report["skipped"]:   # fastread without its s3 engine
                assert reader in ("read_files", "fastread-wds")
                assert "s3" in report["skipped"][f"{reader}@{delay}"]
                continue
            m = got[(reader, delay)]
            assert "error" not in m, m
            assert m["via"] == via
            # Two passes: every sample and every shard byte twice.
            assert (m["objects"], m["bytes"]) == (48, 2 * shard_bytes), m
            assert m["cpu_s"] >= 0 and m["seconds"] > 0
    if ("read_files", 0) in got:
        # Each shard one GET or two (a probe, then the rest), several in flight.
        assert got[("read_files", 0)]["s3_requests"] >= wds["objects"]
        assert got[("read_files", 0)]["inflight_max"] >= 2
    assert "| curl | 0 |" in r.stdout and "| boto3 | 5 |" in r.stdout


def test_a_short_pass_is_an_error_unless_stopped_at_the_time_bound():
    import bench_shards

    class Short(bench_shards.Reader):
        def one_pass(self, deadline):
            return self.samples - 1, {}

    cfg = {"endpoint": "http://127.0.0.1:1", "keys": {"wds": ["k"]}, "samples": 5,
           "format_bytes": {"wds": 10}}
    with pytest.raises(RuntimeError, match="4 samples, not 5"):
        Short(cfg).measure(passes=1, seconds=60)
    # Past the bound: what it read, the bytes in proportion, marked partial.
    assert Short(cfg).measure(passes=3, seconds=1e-9) == (4, 8, {"partial": True})


def test_tar_samples_groups_members_by_key():
    pytest.importorskip("webdataset")
    import bench_shards
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key in ("a", "b"):
            for ext, data in (("jpg", b"x" * (3 if key == "a" else 5)), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    shards = [{"url": "s3://b/s.tar", "stream": buf}]
    assert list(bench_shards._TarSamples(shards)) == [3, 5]

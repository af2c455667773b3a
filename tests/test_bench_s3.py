"""bench/s3/bench_s3.py end to end on a small tree against a real server:
the readers that need no fastread S3 engine (boto3, curl) measure every
object, at 0 ms (direct) and 5 ms (through the delay proxy); fastread's rows
are measured or skipped with the reason, never an error."""

import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "bench", "s3")
sys.path.insert(0, BENCH)


def test_tree_cpu_counts_a_busy_descendant():
    import bench_s3
    before = bench_s3.tree_cpu(os.getpid())
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.6: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        while bench_s3.tree_cpu(os.getpid()) - before < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bench_s3.tree_cpu(os.getpid()) - before >= 0.5
    finally:
        child.kill()
        child.wait()


def test_bench_measures_boto3_and_curl_and_reports_fastread(tmp_path, s3_server):
    # s3_server: the skip when there is no weed (the bench starts its own).
    from fastread.cli import main as fastread_cli
    tree = tmp_path / "tree"
    saved = sys.argv
    try:
        sys.argv = ["fastread", "make-dataset", str(tree), "--classes", "2", "--per-class", "10",
                    "--seed", "0", "--quiet"]
        fastread_cli()
    finally:
        sys.argv = saved
    sizes = [os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(tree) for f in fs
             if not f.startswith(".")]
    assert len(sizes) == 20
    out = tmp_path / "report.json"
    cmd = [sys.executable, os.path.join(BENCH, "bench_s3.py"), "--dataset", str(tree),
           "--classes", "2", "--per-class", "10", "--workdir", str(tmp_path / "work"),
           "--objects", "20", "--seconds", "5", "--rounds", "1", "--delays", "0,5",
           "--readers", "boto3,curl,fastread", "--latency", "proxy", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dataset"]["objects"] == 20
    got = {(m["reader"], m["delay_ms"]): m for m in report["measurements"]}
    for reader in ("boto3", "curl"):
        for delay, via in ((0, "direct"), (5, "proxy")):
            m = got[(reader, delay)]
            assert "error" not in m, m
            assert m["via"] == via
            # 20 objects = the whole tree: every byte of it, once.
            assert (m["objects"], m["bytes"]) == (20, sum(sizes)), m
            assert m["seconds"] >= delay / 1000.0 and m["cpu_s"] > 0
    for delay in (0, 5):
        if f"fastread@{delay}" in report["skipped"]:
            assert "s3" in report["skipped"][f"fastread@{delay}"]
        else:
            assert (got[("fastread", delay)]["objects"], got[("fastread", delay)]["bytes"]) == (20, sum(sizes))
    assert "| boto3 | 5 |" in r.stdout and "| curl | 0 |" in r.stdout

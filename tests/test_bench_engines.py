"""bench/engines/engines.py and bench/gpu/gpu_delivery.py (the GPU machine's `gpu.sh
engines` and `gpu.sh delivery`) run end to end on a tiny tree: the JSON has
every cell or mode that can run here, a time budget stops the matrix early
and still reports, and modes that need a GPU are skipped with the reason.
Speeds are not checked (they are measurements)."""
import json
import os
import statistics
import subprocess
import sys

import pytest

import fastread
from conftest import write_class_tree

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")


@pytest.fixture()
def tree(tmp_path):
    return write_class_tree(tmp_path / "tree", [10] * 4, seed=5, min_size=1000,
                            max_size=2500)[0]


def needs_bench(script):
    return pytest.mark.skipif(not os.path.exists(os.path.join(BENCH, script)),
                              reason="needs the checkout's bench/")


def run(script, *args, timeout=240):
    p = subprocess.run([sys.executable, os.path.join(BENCH, script), *args],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@needs_bench("engines/engines.py")
def test_engine_matrix_warm_cells(tree, tmp_path):
    out = tmp_path / "engines.json"
    run("engines/engines.py", "--data-92k", tree, "--data-root", str(tmp_path), "--sizes", "92k",
        "--caches", "warm", "--batches", "8,16", "--engines", "psync,auto", "--rounds", "2",
        "--min-time", "0.05", "--out", str(out), "--plot", str(tmp_path / "engines.png"))
    res = json.loads(out.read_text())
    cells = {(c["batch"], c["engine"], c["api"]): c for c in res["cells"]}
    assert set(cells) == {(b, e, a) for b in (8, 16) for e in ("psync", "auto")
                          for a in ("read_files", "reader")}
    for c in cells.values():
        assert c["files"] == 40 and len(c["rounds_files_per_s"]) == 2 and c["files_per_s"] > 0
        # Whole passes over the set, as many as fill --min-time.
        assert all(n >= 40 and n % 40 == 0 for n in c["rounds_files_read"])
    assert "stopped_early" not in res
    # The ratios: read_files against Reader (same engine), auto against the best
    # named engine of its cell; read_files cells say who served the calls.
    for (b, e, a), c in cells.items():
        if a == "read_files":
            reader = cells[(b, e, "reader")]
            assert c["of_reader"] == pytest.approx(c["files_per_s"] / reader["files_per_s"])
            pool = c["pool"]
            assert pool["helpers_per_phase"] >= 0 and 0 <= pool["alone_share"] <= 1
        if e == "auto":
            assert c["best_engine"] == "psync"
            assert c["auto_of_best"] == pytest.approx(
                c["files_per_s"] / cells[(b, "psync", a)]["files_per_s"])
            ps = cells[(b, "psync", a)]["rounds_files_per_s"]
            assert c["auto_of_best_paired"] == pytest.approx(
                statistics.median(x / y for x, y in zip(c["rounds_files_per_s"], ps)))
    assert any(line.startswith("auto/best") for line in res["derived"])
    assert any(line.startswith("read_files/Reader") for line in res["derived"])
    auto_rf = cells[(8, "auto", "read_files")]["pool"]
    if fastread.engines()["io_uring"].files is True:  # auto's batches, counted by engine
        assert auto_rf["auto_uring_batches"] + auto_rf["auto_psync_batches"] == auto_rf["calls"]
        assert auto_rf["calls"] % (40 // 8) == 0 and auto_rf["calls"] >= 40 // 8


@needs_bench("engines/engines.py")
def test_engine_matrix_time_budget_reports_what_ran(tree, tmp_path):
    out = tmp_path / "engines.json"
    run("engines/engines.py", "--data-92k", tree, "--data-root", str(tmp_path), "--sizes", "92k",
        "--caches", "warm", "--batches", "8", "--engines", "psync", "--rounds", "50",
        "--time-budget", "0.000001", "--out", str(out), "--plot", str(tmp_path / "e.png"))
    res = json.loads(out.read_text())
    assert "time budget" in res["stopped_early"]
    assert len(res["cells"]) <= 2
    assert all(len(c["rounds_files_per_s"]) < 50 for c in res["cells"])


@needs_bench("gpu/gpu_delivery.py")
def test_gpu_delivery_runs_host_modes_and_says_why_gpu_ones_did_not(tree, tmp_path):
    out = tmp_path / "delivery.json"
    text = run("gpu/gpu_delivery.py", tree, "--batch", "8", "--rounds", "2", "--epochs", "1",
               "--engine", "psync", "--workers", "2", "--json", str(out))
    res = json.loads(out.read_text())
    assert len(res["rounds_img_per_s"]["host"]) == 2 and res["img_per_s"]["host"] > 0
    gpu_ok = fastread.engines()["cufile"].files is True  # a CUDA driver loads here
    if not gpu_ok:
        for mode in ("host-pinned", "gpu", "gpu-w2"):
            assert mode in res["skipped"] and res["skipped"][mode], res["skipped"]
        assert "skipped" in text


@needs_bench("engines/cold_diagnose.py")
def test_cold_diagnose_reports_the_block_layer(tmp_path):
    import tempfile
    base = tempfile.mkdtemp(dir="/var/tmp") if os.path.isdir("/var/tmp") else str(tmp_path)
    try:
        root = os.path.join(base, "tree")
        os.makedirs(os.path.join(root, "c0"))
        for i in range(20):
            with open(os.path.join(root, "c0", f"{i}.bin"), "wb") as f:
                f.write(os.urandom(20000))
        st = os.stat(root)
        if not os.path.exists(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"):
            pytest.skip(f"{root} is on no block device (tmpfs, overlay)")
        if fastread.engines()["io_uring"].files is not True:
            pytest.skip("io_uring is not available here")
        out = tmp_path / "cd.json"
        run("engines/cold_diagnose.py", root, "--rounds", "2", "--batch", "8", "--json", str(out))
        res = json.loads(out.read_text())
        for mode in ("buffered", "o_direct"):
            assert len(res["rounds"][mode]) == 2
            m = res["median"][mode]
            assert m["files_per_s"] > 0 and m["iou_wrk_max"] >= 0 and m["reads_in_flight"] >= 0
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)

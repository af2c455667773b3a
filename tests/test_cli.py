"""Smoke tests of the ``fastread`` command line (make-dataset, info, bench).

Most tests call ``fastread.cli.main(argv)`` in-process (DALI is imported
once); a few run ``python -m fastread.cli`` to check the real entry point.
Everything runs on a 2-class x 5-image dataset, so the module takes seconds.
"""
import json
import os
import subprocess
import sys

import pytest

import fastread
from fastread.cli import _env, bench, main
from fastread.cli.baselines import FileInputIterator, python_loop

HAVE_DALI = _env.try_import("nvidia.dali")[0] is not None
HAVE_FASTREAD_DALI = _env.try_import("fastread.dali")[0] is not None
needs_dali = pytest.mark.skipif(not HAVE_DALI, reason="DALI is not installed")


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fastread.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def usage_error(capsys, argv):
    """Runs main(argv) expecting an argparse error; returns its stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "error:" in err
    return err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """2 classes x 5 JPEGs, made through the CLI."""
    root = tmp_path_factory.mktemp("cli") / "tiny"
    assert main(["make-dataset", str(root), "--classes", "2", "--per-class", "5",
                 "--seed", "3", "--workers", "1", "--quiet"]) == 0
    return str(root)


def sizes_of(root):
    paths, _ = fastread.scan(root)
    return [os.path.getsize(p) for p in paths]


# -- entry point ---------------------------------------------------------------
def test_module_entry_point_help():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    for cmd in ("make-dataset", "info", "bench"):
        assert cmd in r.stdout


def test_no_command_is_a_usage_error(capsys):
    err = usage_error(capsys, [])
    assert "COMMAND" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert fastread.__version__ in capsys.readouterr().out


# -- make-dataset ------------------------------------------------------------------
def test_make_dataset_summary_and_reuse(tiny, capsys):
    assert len(sizes_of(tiny)) == 10
    assert main(["make-dataset", tiny, "--classes", "2", "--per-class", "5", "--seed", "3",
                 "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    line = out[0]
    assert "10 files" in line and "GB total" in line and "mean" in line and "KB" in line
    assert "(reused)" in line


def test_make_dataset_progress_goes_to_stderr(tmp_path, capsys):
    assert main(["make-dataset", str(tmp_path / "d"), "--classes", "1", "--per-class", "2",
                 "--workers", "1", "--mean-kb", "40"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1 and "2 files" in captured.out


def test_make_dataset_refuses_foreign_directory(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("not a dataset")
    assert main(["make-dataset", str(tmp_path), "--classes", "1", "--per-class", "2",
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "fastread make-dataset: error:" in err and "not empty" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    (["--classes", "0", "--per-class", "5"], "--classes"),
    (["--classes", "2"], "--per-class"),
    (["--classes", "two", "--per-class", "5"], "positive integer"),
    (["--classes", "2", "--per-class", "5", "--mean-kb", "-3"], "--mean-kb"),
    (["--classes", "2", "--per-class", "5", "--seed", "-1"], "--seed"),
])
def test_make_dataset_bad_arguments(tmp_path, capsys, argv, needle):
    err = usage_error(capsys, ["make-dataset", str(tmp_path / "x"), *argv])
    assert needle in err
    assert not (tmp_path / "x").exists()


def test_make_dataset_npy(tmp_path, capsys):
    import numpy as np

    from fastread.npy import NpyIndex

    root = str(tmp_path / "npy")
    argv = ["make-dataset", root, "--format", "npy", "--classes", "2", "--per-class", "3",
            "--shape", "2,3,4", "--dtype", "float32", "--seed", "5", "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "6 files in 2 classes" in out[0]
    assert "arrays of shape (2, 3, 4) float32" in out[0] and "(reused)" not in out[0]
    paths, labels = fastread.scan(root, file_filters=["*.npy"])
    assert len(paths) == 6 and sorted(labels) == [0, 0, 0, 1, 1, 1]
    idx = NpyIndex.build(paths)
    assert idx.uniform() == ((2, 3, 4), np.dtype("float32"))
    assert not np.array_equal(np.load(paths[0]), np.load(paths[1]))
    assert main(argv) == 0
    assert "(reused)" in capsys.readouterr().out


def test_make_dataset_npy_array_bytes(tmp_path, capsys):
    import numpy as np

    root = tmp_path / "big"
    assert main(["make-dataset", str(root), "--format", "npy", "--classes", "1",
                 "--per-class", "2", "--array-bytes", "64KiB", "--quiet"]) == 0
    assert "arrays of shape (65536,) uint8" in capsys.readouterr().out
    files = sorted((root / "n10000000").iterdir())
    assert [f.stat().st_size for f in files] == [65536 + 128] * 2
    a = np.load(files[0])
    assert a.shape == (65536,) and a.dtype == np.uint8


@pytest.mark.parametrize("argv, needle", [
    (["--format", "npy", "--width", "5"], "--width applies to --format jpeg"),
    (["--format", "npy", "--mean-kb", "5"], "--mean-kb applies to --format jpeg"),
    (["--shape", "3,4"], "--shape applies to --format npy"),
    (["--array-bytes", "4MiB"], "--array-bytes applies to --format npy"),
    (["--format", "npy", "--shape", "3,4", "--array-bytes", "4MiB"], "not both"),
    (["--format", "npy", "--array-bytes", "6", "--dtype", "float32"], "multiple"),
    (["--format", "npy", "--array-bytes", "4XB"], "--array-bytes"),
    (["--format", "npy", "--shape", "3,-4"], "--shape"),
    (["--format", "npy", "--dtype", "object"], "--dtype"),
    (["--format", "npy", "--dtype", "nonsense"], "--dtype"),
    (["--format", "tiff"], "--format"),
])
def test_make_dataset_npy_bad_arguments(tmp_path, capsys, argv, needle):
    err = usage_error(capsys, ["make-dataset", str(tmp_path / "x"), "--classes", "1",
                               "--per-class", "1", *argv])
    assert needle in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("text, value", [
    ("4MiB", 4 << 20), ("4 MiB", 4 << 20), ("4mib", 4 << 20), ("4MB", 4_000_000),
    ("4M", 4_000_000), ("92kB", 92_000), ("1KiB", 1024), ("150528", 150528), ("7B", 7),
    ("1GiB", 1 << 30), ("0", 0),
])
def test_byte_size_parsing(text, value):
    from fastread.cli.make_dataset import byte_size
    assert byte_size(text) == value


# -- info ----------------------------------------------------------------------------
def test_info_subprocess():
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"fastread {fastread.__version__}" in out
    for name in fastread.engines():
        assert name in out
    for label in ("numpy", "DALI", "torch", "cupy", "CUDA devices:", "FASTREAD_QUEUE_DEPTH",
                  "FASTREAD_ENGINE", "queue_depth"):
        assert label in out
    assert "Traceback" not in r.stderr


def test_info_json_and_missing_packages(monkeypatch, capsys):
    # A package that is absent reads "not installed", never a traceback.
    monkeypatch.setitem(_env._imports, "cupy", (None, "not installed"))
    monkeypatch.setenv("FASTREAD_QUEUE_DEPTH", "32")
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fastread"] == fastread.__version__
    assert set(data["engines"]) == set(fastread.engines())
    assert data["packages"]["cupy"] == "not installed"
    assert data["defaults"]["queue_depth"] == {"value": 32, "env": "FASTREAD_QUEUE_DEPTH",
                                               "from_env": True}
    if not data["cuda_devices"]:
        assert data["cuda_reason"]
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cupy" in out and "not installed" in out
    assert "FASTREAD_QUEUE_DEPTH (set)" in out


def test_info_bad_environment_variable(monkeypatch, capsys):
    monkeypatch.setenv("FASTREAD_THREADS", "many")
    assert main(["info"]) == 1
    err = capsys.readouterr().err
    assert "FASTREAD_THREADS" in err and "Traceback" not in err


# -- baselines -------------------------------------------------------------------------
def test_file_input_iterator_cycles_like_the_seed(tiny):
    paths, labels = fastread.scan(tiny)
    it = iter(FileInputIterator(tiny, batch_size=4))
    seen = []
    for _ in range(3):  # 12 samples over a 10-sample dataset: wraps around
        arrays, labs = next(it)
        assert len(arrays) == 4 and all(a.dtype.name == "uint8" for a in arrays)
        assert all(lab.shape == (1,) and lab.dtype.name == "int32" for lab in labs)
        seen += list(zip(arrays, labs))
    for k, (arr, lab) in enumerate(seen):
        with open(paths[k % 10], "rb") as f:
            assert arr.tobytes() == f.read()
        assert int(lab[0]) == labels[k % 10]
    batches = list(python_loop(paths, labels, 4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]


# -- bench -------------------------------------------------------------------------------
@needs_dali
def test_bench_modes_json_plot(tiny, tmp_path, capsys):
    modes = ["dali", "python-file", "read_files-psync", "python-loop"]
    if HAVE_FASTREAD_DALI:
        modes.append("fastread-psync")
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["bench", tiny, "--modes", ",".join(modes), "--batches", "2", "--batchsize", "4",
               "--warmup", "0", "--threads", "1", "--json", str(out_json),
               "--plot", str(out_png), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured
    doc = json.loads(out_json.read_text())
    assert [r["mode"] for r in doc["results"]] == modes
    first8 = sum(sizes_of(tiny)[:8])
    for r in doc["results"]:
        assert r["samples"] == 8 and r["batches"] == 2, r
        assert r["bytes"] == first8, r["mode"]  # same samples, counted from the outputs
        assert r["img_per_s"] > 0 and r["gb_per_s"] > 0 and r["seconds"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The table: one header, one rule, one row per mode; ratios against dali.
    lines = captured.out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["mode", "img/s"])
    assert lines[head].split() == ["mode", "img/s", "GB/s", "batches", "seconds", "vs", "dali"]
    rows = lines[head + 2:head + 2 + len(modes)]
    assert [row.split()[0] for row in rows] == modes
    assert rows[0].split()[-1] == "1.00x"
    assert "Traceback" not in captured.err


def test_bench_image_modes_against_the_ceiling(tiny, disk_tmp, monkeypatch, capsys):
    # Block-level reads of a packed image, and the disk's ceiling: the whole
    # image in 1 MiB O_DIRECT pieces, each mode shown as a share of it.
    image = os.path.join(disk_tmp, "tiny-bench.img")
    fastread.pack(tiny, image)
    monkeypatch.setenv("FASTREAD_BENCH_IMAGE", image)
    out_json = os.path.join(disk_tmp, "image-bench.json")
    rc = main(["bench", tiny, "--modes", "ceiling-psync,image-psync", "--batches", "2",
               "--batchsize", "4", "--warmup", "0", "--threads", "1", "--json", out_json,
               "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured
    ceiling, image_run = json.load(open(out_json))["results"]
    assert (ceiling["kind"], image_run["kind"]) == ("ceiling", "image")
    size = os.path.getsize(image)
    piece = min(1 << 20, size - size % 4096)  # 1 MiB, or all of a small image
    assert ceiling["bytes"] == 2 * min(32, size // piece) * piece  # whole pieces, wrapping

    assert image_run["bytes"] == sum(sizes_of(tiny)[:8])  # true lengths, not blocks
    lines = captured.out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["mode", "img/s"])
    assert lines[head].split()[-2:] == ["of", "ceiling"]
    assert lines[head + 2].split()[0] == "ceiling-psync" and lines[head + 2].endswith("100%")


@needs_dali
def test_bench_decode(tiny, capsys):
    rc = main(["bench", tiny, "--modes", "dali", "--decode", "--batches", "1",
               "--batchsize", "2", "--warmup", "0", "--threads", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "mode dali:" in out and "decode" in out


def test_bench_unavailable_mode_is_one_line(tiny, capsys):
    rc = main(["bench", tiny, "--modes", "python-loop,xnvme-bam", "--batches", "2",
               "--batchsize", "4", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0
    lines = [line for line in captured.out.splitlines() if "xnvme-bam" in line]
    assert len(lines) == 1
    assert lines[0].startswith("mode xnvme-bam: not available: ")
    assert "python-loop" in captured.out.split("\n\n")[-1]  # it still ran
    assert "Traceback" not in captured.out + captured.err


def test_bench_gpu_without_cuda_skips(tiny, capsys):
    devices, _ = _env.cuda_devices(quick=True)
    if devices:
        pytest.skip("this machine has a CUDA device")
    rc = main(["bench", tiny, "--device", "gpu", "--modes", "dali,python-loop",
               "--batches", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert sum(line.startswith("mode dali: not available") for line in out.splitlines()) == 1
    assert "no mode ran" in out


def test_bench_cold_not_permitted_runs_warm(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "DROP_CACHES", str(tmp_path / "missing" / "drop_caches"))
    rc = main(["bench", tiny, "--cold", "--modes", "python-loop,read_files-psync",
               "--repeat", "2", "--batches", "1", "--batchsize", "4", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert sum(line.startswith("--cold: cannot drop the page cache") for line in
               out.splitlines()) == 1
    assert "running warm" in out


def test_bench_rss_over_epochs(tiny, tmp_path, capsys):
    out_json = tmp_path / "rss.json"
    rc = main(["bench", tiny, "--modes", "read_files-psync", "--epochs", "4", "--rss",
               "--batchsize", "4", "--json", str(out_json), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "max RSS MiB" in out and "RSS growth MiB" in out
    r = json.loads(out_json.read_text())["results"][0]
    assert r["batches"] == 12 and r["samples"] == 40  # 4 epochs of 4+4+2
    assert len(r["runs"][0]["rss"]) == 4
    assert r["rss_max"] > 0 and r["rss_growth"] is not None


def test_bench_list_modes(capsys):
    assert main(["bench", "--list-modes"]) == 0
    out = capsys.readouterr().out
    for name in ["dali", "python-file", "python-loop", "xnvme-file", "xnvme-gds", "xnvme-bam"]:
        assert any(line.split()[0] == name for line in out.splitlines())
    for e in fastread.engines():
        assert f"fastread-{e}" in out and f"read_files-{e}" in out


@pytest.mark.parametrize("argv, needle", [
    (["--modes", "dali,nope"], "unknown mode nope"),
    (["--modes", ","], "no mode given"),
    (["--batches", "0"], "--batches"),
    (["--batches", "2", "--epochs", "2"], "not allowed with"),
    (["--device", "tpu"], "invalid choice"),
    (["--engine-option", "colour=blue"], "unknown option 'colour'"),
    (["--engine-option", "queue_depth"], "KEY=VALUE"),
    (["--engine-option", "queue_depth=0"], "queue_depth"),
    (["--repeat", "-1"], "--repeat"),
])
def test_bench_bad_arguments(tiny, capsys, argv, needle):
    err = usage_error(capsys, ["bench", tiny, *argv])
    assert needle in err


def test_bench_bad_data_dir(tmp_path, capsys):
    err = usage_error(capsys, ["bench", str(tmp_path / "absent")])
    assert "is not a directory" in err
    err = usage_error(capsys, ["bench", str(tmp_path)])
    assert "No files found" in err or "holds no samples" in err
    err = usage_error(capsys, ["bench"])
    assert "DATA_DIR" in err


def test_bench_subprocess_exit_status(tiny):
    r = run_cli("bench", tiny, "--modes", "python-loop,xnvme-gds", "--batches", "1",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "mode xnvme-gds: not available" in r.stdout
    r = run_cli("bench", tiny, "--modes", "bogus")
    assert r.returncode == 2 and "unknown mode bogus" in r.stderr

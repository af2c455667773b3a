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
from fastread.bench import environment as _env
from fastread.bench import runners
from fastread.bench.baselines import FileInputIterator, python_loop
from fastread.cli import main

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
    assert data["engine_auto"] in [n for n, st in fastread.engines().items() if st.files is True]
    for name, st in fastread.engines().items():  # one shape for every engine
        assert data["engines"][name] == {"files": st.files, "ranges": st.ranges}
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cupy" in out and "not installed" in out
    assert "FASTREAD_QUEUE_DEPTH (set)" in out
    assert f"engines (engine='auto' picks {data['engine_auto']}):" in out


def test_info_engine_reasons_wrapped_and_shared():
    from fastread.cli.info import format_engines

    reason = "not built: " + "the library was not found when fastread was built " * 3
    both = lambda v: {"files": v, "ranges": v}  # noqa: E731
    data = {"engines": {"io_uring": both(True), "psync": both(True), "a": both(reason),
                        "b": both(reason), "c": both("no CUDA driver"),
                        "r": {"files": "read_files is not supported: ranges only",
                              "ranges": True}},
            "engine_auto": "io_uring"}
    lines = format_engines(data, width=70)
    assert lines[0] == "engines (engine='auto' picks io_uring):"
    assert lines[1].split() == ["available:", "io_uring,", "psync"]
    assert all(len(line) <= 70 for line in lines)
    text = " ".join(" ".join(lines).split())
    assert text.count("the library was not found") == 3  # one reason for both engines
    assert "a, b: not built:" in text and "c: no CUDA driver" in text
    assert "r byte ranges only; files: read_files is not supported" in text
    data["engine_auto"], data["engine_auto_reason"] = None, "no engine can read files here"
    assert format_engines(data)[0] == \
        "engines (engine='auto' fails: no engine can read files here):"


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
# Small runs (a few batches of 4): these check what runs and what is printed,
# never how fast.
QUICK = ["--batches", "2", "--batchsize", "4", "--warmup", "0", "--warmup-runs", "0",
         "--threads", "1", "--no-progress"]


def auto_engine():
    from fastread.bench.environment import probe_environment
    from fastread.bench.registry import default_engine
    return default_engine(probe_environment())


def table_rows(out, n):
    """The first table's header and its n rows, split on whitespace."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["mode", "img/s"])
    return lines[head].split(), [line.split() for line in lines[head + 2:head + 2 + n]]


@pytest.fixture
def no_drop(monkeypatch, tmp_path):
    """The page cache cannot be dropped (the path does not exist)."""
    monkeypatch.setattr(runners, "DROP_CACHES", str(tmp_path / "missing" / "drop_caches"))


@pytest.fixture
def fake_drop(monkeypatch, tmp_path):
    """Dropping the page cache writes to a plain file instead."""
    path = tmp_path / "drop_caches"
    path.write_text("")
    monkeypatch.setattr(runners, "DROP_CACHES", str(path))
    return path


@needs_dali
def test_bench_modes_json_plot(tiny, tmp_path, capsys):
    modes = ["dali", "python-file", "reader-psync", "read_files-psync", "python-loop"]
    if HAVE_FASTREAD_DALI:
        modes.append("fastread-psync")
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["bench", tiny, "--modes", ",".join(modes), "--cache", "warm", *QUICK,
               "--json", str(out_json), "--plot", str(out_png)])
    captured = capsys.readouterr()
    assert rc == 0, captured
    doc = json.loads(out_json.read_text())
    assert [r["mode"] for r in doc["results"]] == modes
    first8 = sum(sizes_of(tiny)[:8])
    for r in doc["results"]:
        assert r["samples"] == 8 and r["batches"] == 2 and r["cache"] == "warm", r
        assert r["bytes"] == first8, r["mode"]  # same samples, counted from the outputs
        assert r["img_per_s"] > 0 and r["gb_per_s"] > 0 and r["seconds"] > 0
    assert {r["mode"]: r["what"] for r in doc["results"]}["read_files-psync"] == \
        "fastread.read_files(engine='psync')"
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    head, rows = table_rows(captured.out, len(modes))
    assert head[:7] == ["mode", "img/s", "GB/s", "batches", "seconds", "vs", "dali"]
    assert [row[0] for row in rows] == modes
    # then the client's CPU seconds per GB, then what ran
    assert head[7:9] == ["CPU", "s/GB"] and float(rows[0][6]) > 0
    assert rows[0][5] == "1.00x" and rows[0][7] == "fn.readers.file"
    verdicts = [line for line in captured.out.splitlines() if line.startswith("verdict (")]
    assert len(verdicts) == 1 and verdicts == doc["verdicts"]
    assert "fn.readers.file" in verdicts[0] and "python-file" in verdicts[0]
    assert "Traceback" not in captured.err


@needs_dali
def test_bench_default_run_is_the_headline(tiny, no_drop, tmp_path, capsys):
    # No --modes: DALI's reader, the Python external source and fastread (in
    # DALI and without) on this tree; nothing for other kinds of dataset.
    out_json = tmp_path / "d.json"
    rc = main(["bench", tiny, "--device", "cpu", *QUICK, "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out_json.read_text())
    e = auto_engine()
    want = ["dali", "python-file"] + ([f"fastread-{e}"] if HAVE_FASTREAD_DALI else []) + \
        [f"reader-{e}"]
    assert [r["mode"] for r in doc["results"]] == want
    assert doc["not_applicable"] == {} and doc["failed"] == {}
    assert not any(line.startswith(("mode numpy-", "mode image-", "mode ceiling-"))
                   for line in out.splitlines())
    assert "cold: not measured: cannot drop the page cache" in out
    # The modes left out: one line, not one per mode.
    assert sum("--modes all" in line for line in out.splitlines()) == 1
    assert sum(line.startswith("verdict (") for line in out.splitlines()) == 1


@needs_dali
def test_bench_default_run_warm_and_cold(tiny, fake_drop, tmp_path, capsys):
    out_json = tmp_path / "wc.json"
    rc = main(["bench", tiny, "--device", "cpu", "--modes", "dali,python-loop", *QUICK,
               "--cache", "auto", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out_json.read_text())
    got = [(r["mode"], r["cache"]) for r in doc["results"]]
    assert got == [("dali", "warm"), ("python-loop", "warm"), ("dali", "cold"),
                   ("python-loop", "cold")]
    assert fake_drop.read_text() == "3"
    assert "-- cold cache" in out and "mode dali [cold]:" in out
    assert sum(line.startswith("verdict (") for line in out.splitlines()) == 2


@needs_dali
def test_bench_npy_tree_gets_npy_modes(tmp_path, no_drop, capsys):
    root = str(tmp_path / "npy")
    assert main(["make-dataset", root, "--format", "npy", "--classes", "2", "--per-class", "4",
                 "--shape", "8,8", "--quiet"]) == 0
    capsys.readouterr()
    out_json = tmp_path / "n.json"
    rc = main(["bench", root, "--device", "cpu", *QUICK, "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    modes = [r["mode"] for r in json.loads(out_json.read_text())["results"]]
    want = ["numpy-dali"] + ([f"numpy-fastread-{auto_engine()}"] if HAVE_FASTREAD_DALI else [])
    assert modes == want
    assert ".npy tree" in out and "failed" not in out
    for r in json.loads(out_json.read_text())["results"]:
        assert r["bytes"] == 8 * 64  # 2 batches of 4 arrays of 8x8 uint8


def test_bench_mode_for_another_dataset_is_not_attempted(tiny, capsys):
    rc = main(["bench", tiny, "--modes", "python-loop,numpy-dali,image-psync", "--cache",
               "warm", *QUICK])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "mode numpy-dali: does not apply to" in out and ".npy arrays" in out
    assert "mode image-psync: does not apply to" in out
    assert "no packed image at" in out  # why the image modes do not apply
    assert "failed" not in out
    assert "mode python-loop:" in out


def test_bench_unavailable_mode_is_one_line(tiny, capsys):
    rc = main(["bench", tiny, "--device", "cpu", "--modes", "python-loop,fastread-gpu-psync",
               "--cache", "warm", *QUICK])
    captured = capsys.readouterr()
    assert rc == 0
    lines = [line for line in captured.out.splitlines() if "fastread-gpu-psync" in line]
    assert lines == ["mode fastread-gpu-psync: not available: GPU output: run it with "
                     "--device gpu"]
    assert any(line.startswith("python-loop ") for line in captured.out.splitlines())
    assert "Traceback" not in captured.out + captured.err


def test_bench_failed_mode_exit_status(tiny, tmp_path, capsys):
    # A sample that is a symlink to a directory: indexed as fn.readers.file
    # does, but reading it fails (EISDIR), so every mode fails at run time
    # and the exit status is 1.
    import shutil

    root = tmp_path / "broken"
    shutil.copytree(tiny, root)
    cls = sorted(p for p in root.iterdir() if p.is_dir())[0]
    os.symlink(tmp_path, cls / "0000-dir.jpg")
    rc = main(["bench", str(root), "--modes", "reader-psync,python-loop,fastread-gpu-psync",
               "--device", "cpu", "--cache", "warm", *QUICK])
    captured = capsys.readouterr()
    assert rc == 1, captured.out
    lines = captured.out.splitlines()
    assert sum(line.startswith("mode reader-psync: failed: ") for line in lines) == 1
    assert sum(line.startswith("mode python-loop: failed: ") for line in lines) == 1
    assert "0000-dir.jpg" in captured.out
    assert "Traceback" not in captured.out + captured.err
    # Only unavailable modes asked for, nothing failed: 0.
    rc = main(["bench", str(root), "--modes", "fastread-gpu-psync", "--device", "cpu",
               "--cache", "warm", *QUICK])
    assert rc == 0 and "no mode ran" in capsys.readouterr().out


def test_bench_gpu_without_cuda_skips(tiny, capsys):
    devices, _ = _env.cuda_devices(quick=True)
    if devices:
        pytest.skip("this machine has a CUDA device")
    rc = main(["bench", tiny, "--device", "gpu", "--modes", "dali,python-loop", *QUICK])
    out = capsys.readouterr().out
    assert rc == 0
    assert sum(line.startswith("mode dali: not available") for line in out.splitlines()) == 1
    assert "no mode ran" in out


def test_bench_device_auto_without_cuda_is_cpu(tiny, capsys):
    devices, _ = _env.cuda_devices(quick=True)
    if devices:
        pytest.skip("this machine has a CUDA device")
    rc = main(["bench", tiny, "--modes", "python-loop", "--cache", "warm", *QUICK])
    out = capsys.readouterr().out
    assert rc == 0 and "device cpu (no CUDA device" in out


def test_bench_cold_not_permitted_runs_warm(tiny, no_drop, tmp_path, capsys):
    out_json = tmp_path / "c.json"
    rc = main(["bench", tiny, "--cold", "--modes", "python-loop,reader-psync",
               "--repeat", "2", *QUICK, "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    assert sum(line.startswith("--cold: cannot drop the page cache") for line in
               out.splitlines()) == 1
    assert "running warm" in out
    assert {r["cache"] for r in json.loads(out_json.read_text())["results"]} == {"warm"}


def test_bench_rss_over_epochs(tiny, tmp_path, capsys):
    out_json = tmp_path / "rss.json"
    rc = main(["bench", tiny, "--modes", "reader-psync", "--epochs", "4", "--rss",
               "--batchsize", "4", "--cache", "warm", "--json", str(out_json), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "max RSS MiB" in out and "RSS growth MiB" in out
    r = json.loads(out_json.read_text())["results"][0]
    assert r["batches"] == 12 and r["samples"] == 40  # 4 epochs of 4+4+2
    assert len(r["runs"][0]["rss"]) == 4
    assert r["rss_max"] > 0 and r["rss_growth"] is not None


def test_bench_image_modes_against_the_ceiling(tiny, disk_tmp, capsys):
    # Block-level reads of a packed image, and the disk's ceiling: the whole
    # image in 1 MiB O_DIRECT pieces, each mode shown as a share of it.
    image = os.path.join(disk_tmp, "tiny-bench.img")
    fastread.pack(tiny, image)
    out_json = os.path.join(disk_tmp, "image-bench.json")
    rc = main(["bench", tiny, "--image", image, "--modes", "ceiling-psync,image-psync",
               "--cache", "warm", *QUICK, "--json", out_json])
    captured = capsys.readouterr()
    assert rc == 0, captured
    ceiling, image_run = json.load(open(out_json))["results"]
    assert (ceiling["mode"], image_run["mode"]) == ("ceiling-psync", "image-psync")
    size = os.path.getsize(image)
    piece = min(1 << 20, size - size % 4096)  # 1 MiB, or all of a small image
    assert ceiling["bytes"] == 2 * min(32, size // piece) * piece  # whole pieces, wrapping
    assert image_run["bytes"] == sum(sizes_of(tiny)[:8])  # true lengths, not blocks
    head, rows = table_rows(captured.out, 2)
    assert head[-6:-2] == ["of", "ceiling", "CPU", "s/GB"]
    assert rows[0][0] == "ceiling-psync" and "100%" in rows[0]


def test_bench_packed_image_as_data(tiny, disk_tmp, capsys):
    image = os.path.join(disk_tmp, "tiny-data.img")
    fastread.pack(tiny, image)
    rc = main(["bench", image, "--modes", "image-psync,python-loop", "--cache", "warm", *QUICK])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "packed image, 10 samples" in out
    assert "mode python-loop: does not apply" in out
    assert any(line.startswith("image-psync ") for line in out.splitlines())


@needs_dali
def test_bench_decode(tiny, capsys):
    rc = main(["bench", tiny, "--modes", "dali", "--decode", "--cache", "warm", "--batches",
               "1", "--batchsize", "2", "--warmup", "0", "--threads", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "mode dali:" in out and "decode" in out


def test_bench_list_modes(capsys):
    assert main(["bench", "--list-modes"]) == 0
    out = capsys.readouterr().out
    names = {line.split()[1] if line.startswith("*") else line.split()[0]
             for line in out.splitlines() if line.startswith(("* ", "  "))}
    for name in ["dali", "python-file", "python-loop", "memory", "xnvme-ctypes", "xnvme-gds",
                 "numpy-dali"]:
        assert name in names
    for e in fastread.engines():
        for prefix in ("fastread-", "reader-", "read_files-", "image-", "ceiling-"):
            assert prefix + e in names
    for family in ("[files]", "[image]", "[npy]", "[xnvme]"):
        assert family in out.splitlines()


def test_bench_list_modes_for_a_dataset(tiny, capsys):
    assert main(["bench", "--list-modes", tiny, "--device", "cpu"]) == 0
    lines = {(line[2:].split() or [""])[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith(("* ", "  "))}
    assert "does not apply (reads a .npy tree)" in lines["numpy-dali"]
    assert "does not apply (reads a packed image)" in lines["image-psync"]
    assert lines["dali"].startswith("* ") and lines["python-file"].startswith("* ")
    assert lines["python-loop"].startswith("  ")
    assert "not available: GPU output" in lines["fastread-gpu-psync"]


@pytest.mark.parametrize("argv, needle", [
    (["--modes", "dali,nope"], "unknown mode nope"),
    (["--modes", "nope-*"], "unknown mode nope-*"),
    (["--modes", ","], "no mode given"),
    (["--batches", "0"], "--batches"),
    (["--batches", "2", "--epochs", "2"], "not allowed with"),
    (["--device", "tpu"], "invalid choice"),
    (["--cache", "lukewarm"], "invalid choice"),
    (["--cold", "--cache", "warm"], "not allowed with"),
    (["--engine-option", "colour=blue"], "unknown option 'colour'"),
    (["--engine-option", "queue_depth"], "KEY=VALUE"),
    (["--engine-option", "queue_depth=0"], "queue_depth"),
    (["--engine-option", "workers=0"], "workers=0"),
    (["--repeat", "-1"], "--repeat"),
    (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json"),
    (["--image", "/nonexistent.img"], "/nonexistent.img"),
])
def test_bench_bad_arguments(tiny, capsys, argv, needle):
    err = usage_error(capsys, ["bench", tiny, *argv])
    assert needle in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_bench_bad_data(tmp_path, capsys):
    err = usage_error(capsys, ["bench", str(tmp_path / "absent")])
    assert "absent" in err and "does not exist" in err
    err = usage_error(capsys, ["bench", str(tmp_path)])
    assert "holds no samples" in err and str(tmp_path) in err
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not an image")
    err = usage_error(capsys, ["bench", str(junk)])
    assert "junk.bin" in err and "neither a directory nor a packed image" in err
    err = usage_error(capsys, ["bench"])
    assert "DATA" in err


def test_bench_subprocess_exit_status(tiny):
    r = run_cli("bench", tiny, "--modes", "python-loop,fastread-gpu-psync", "--device", "cpu",
                "--cache", "warm", "--batches", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "mode fastread-gpu-psync: not available" in r.stdout
    r = run_cli("bench", tiny, "--modes", "bogus")
    assert r.returncode == 2 and "unknown mode bogus" in r.stderr
    assert "Traceback" not in r.stderr

"""The registry of fastread bench modes: family discovery, datasets, selection,
the verdict. No timings: the results fed to the report are made up here."""
import os
import textwrap

import pytest

import fastread
from fastread.bench import registry, report
from fastread.bench.environment import NOT_BUILT, Environment, probe_environment
from fastread.bench.registry import BenchError, Mode
from fastread.bench.runners import Config


@pytest.fixture(scope="module")
def env():
    return probe_environment()


@pytest.fixture(scope="module")
def modes(env):
    return registry.all_modes(env)


@pytest.fixture(scope="module")
def jpeg_tree(tmp_path_factory):
    from fastread.cli import main
    root = tmp_path_factory.mktemp("reg") / "jpegs"
    assert main(["make-dataset", str(root), "--classes", "2", "--per-class", "3", "--seed", "1",
                 "--workers", "1", "--quiet"]) == 0
    return str(root)


@pytest.fixture(scope="module")
def npy_tree(tmp_path_factory):
    from fastread.cli import main
    root = tmp_path_factory.mktemp("reg") / "arrays"
    assert main(["make-dataset", str(root), "--format", "npy", "--classes", "2",
                 "--per-class", "2", "--shape", "4", "--quiet"]) == 0
    return str(root)


def test_families_are_found(modes):
    fams = registry.families()
    assert list(fams)[:4] == ["files", "image", "npy", "xnvme"]
    assert registry.broken_families() == {}
    names = [m.name for m in modes]
    assert len(names) == len(set(names))
    # Every family has modes, but one that is a run of its own (main: the
    # scale family, `fastread bench --family scale`).
    assert {m.family for m in modes} == {n for n, f in fams.items() if not hasattr(f, "main")}
    assert callable(registry.family_main("scale"))
    for m in modes:
        assert m.dataset in registry.DATASET_KINDS and m.what and m.help
    for e in fastread.engines():
        for prefix in ("fastread-", "fastread-gpu-", "reader-", "read_files-", "image-",
                       "image-dali-", "ceiling-", "numpy-fastread-"):
            assert prefix + e in names


def _family_package(tmp_path, monkeypatch, files):
    name = f"fakefams_{tmp_path.name}"  # a fresh package per test
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for module, text in files.items():
        (pkg / f"{module}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


GOOD = """
    from fastread.bench.registry import Mode
    NAME = "gather"
    ORDER = 5

    def _check(mode, cfg):
        return None if cfg.device == "gpu" else "needs --device gpu"

    def modes(env):
        yield Mode("gather-demo", NAME, "files", "a gather", "a family in its own module",
                   check=_check, build=None)
"""


def test_a_new_family_is_one_module(tmp_path, monkeypatch, env):
    package = _family_package(tmp_path, monkeypatch, {
        "gather": GOOD, "broken": "raise ImportError('needs libfoo')\n"})
    fams = registry.families(package)
    assert list(fams) == ["gather"]
    assert "needs libfoo" in registry.broken_families(package)["broken"]
    (m,) = registry.all_modes(env, package)
    assert (m.name, m.family, m.dataset) == ("gather-demo", "gather", "files")
    assert m.unavailable(Config(env=env, device="cpu")) == "needs --device gpu"
    assert m.unavailable(Config(env=env, device="gpu")) is None


def test_duplicate_mode_names_are_an_error(tmp_path, monkeypatch, env):
    package = _family_package(tmp_path, monkeypatch, {
        "one": GOOD, "two": GOOD.replace('NAME = "gather"', 'NAME = "other"')})
    with pytest.raises(RuntimeError, match="gather-demo.*gather and other"):
        registry.all_modes(env, package)


def test_mode_checks_its_fields():
    with pytest.raises(ValueError, match="unknown dataset kind 'tar'"):
        Mode("x", "f", "tar", "w", "h", check=None, build=None)
    with pytest.raises(ValueError, match="unknown role"):
        Mode("x", "f", "files", "w", "h", check=None, build=None, role="star")


def test_detect_jpeg_tree(jpeg_tree, monkeypatch):
    monkeypatch.delenv("FASTREAD_BENCH_IMAGE", raising=False)
    ds = registry.detect_dataset(jpeg_tree)
    assert (ds.primary, ds.kinds, ds.samples) == ("files", ("files",), 6)
    assert ds.nbytes == sum(os.path.getsize(p) for p in ds.paths)
    assert any("no packed image" in n for n in ds.notes)


def test_detect_tree_with_its_image(jpeg_tree, tmp_path, monkeypatch):
    image = str(tmp_path / "t.img")
    fastread.pack(jpeg_tree, image)
    monkeypatch.setenv("FASTREAD_BENCH_IMAGE", image)
    ds = registry.detect_dataset(jpeg_tree)
    assert ds.kinds == ("files", "image") and ds.image == image
    alone = registry.detect_dataset(image)
    assert (alone.primary, alone.kinds, alone.samples) == ("image", ("image",), 6)
    assert alone.nbytes == ds.nbytes
    # An image of other samples: an error when named, a note when found.
    other = str(tmp_path / "other")
    os.makedirs(os.path.join(other, "a"))
    with open(os.path.join(other, "a", "x.jpg"), "wb") as f:
        f.write(b"\xff\xd8")
    fastread.pack(other, other + ".img")
    with pytest.raises(BenchError, match="holds 1 samples"):
        registry.detect_dataset(jpeg_tree, image=other + ".img")
    monkeypatch.delenv("FASTREAD_BENCH_IMAGE")
    os.symlink(other + ".img", jpeg_tree + ".img")
    os.symlink(other + ".img.index", jpeg_tree + ".img.index")
    try:
        ds = registry.detect_dataset(jpeg_tree)
        assert ds.kinds == ("files",) and any("pack it again" in n for n in ds.notes)
    finally:
        os.unlink(jpeg_tree + ".img")
        os.unlink(jpeg_tree + ".img.index")


def test_detect_npy_tree(npy_tree):
    ds = registry.detect_dataset(npy_tree)
    assert (ds.primary, ds.kinds, ds.samples) == ("npy", ("npy",), 4)


def test_detect_bad_data(tmp_path):
    with pytest.raises(BenchError, match="does not exist"):
        registry.detect_dataset(str(tmp_path / "nope"))
    with pytest.raises(BenchError, match="holds no samples"):
        registry.detect_dataset(str(tmp_path))
    os.makedirs(tmp_path / "c")
    os.symlink(tmp_path / "missing", tmp_path / "c" / "gone.jpg")
    with pytest.raises(BenchError, match="gone.jpg"):
        registry.detect_dataset(str(tmp_path))


def _names(ms):
    return [m.name for m in ms]


def test_default_selection_follows_dataset_and_device(modes, env, jpeg_tree, npy_tree):
    e = registry.default_engine(env)
    files = registry.detect_dataset(jpeg_tree)
    npy = registry.detect_dataset(npy_tree)
    sel, explicit = registry.select(None, modes, files, "cpu")
    assert not explicit
    assert _names(sel) == ["dali", "python-file", f"fastread-{e}", f"reader-{e}"]
    sel, _ = registry.select(None, modes, files, "gpu")
    assert _names(sel) == ["dali", "python-file", f"fastread-gpu-{e}", f"reader-{e}"]
    sel, _ = registry.select(None, modes, npy, "cpu")
    assert _names(sel) == ["numpy-dali", f"numpy-fastread-{e}"]
    # all: every mode that reads this kind of dataset, none that does not.
    sel, explicit = registry.select("all", modes, files, "cpu")
    assert not explicit and sel and all(m.dataset == "files" for m in sel)
    assert len(sel) == sum(m.dataset == "files" for m in modes)


def test_explicit_selection(modes, jpeg_tree):
    files = registry.detect_dataset(jpeg_tree)
    sel, explicit = registry.select("python-loop, reader-*,dali,python-loop", modes, files,
                                    "cpu")
    assert explicit
    names = _names(sel)
    assert names[0] == "python-loop" and names[-1] == "dali"
    assert set(names[1:-1]) == {m.name for m in modes if m.name.startswith("reader-")}
    with pytest.raises(BenchError, match="unknown modes nope, zap-\\*"):
        registry.select("dali,nope,zap-*", modes, files, "cpu")
    with pytest.raises(BenchError, match="no mode given"):
        registry.select(" , ", modes, files, "cpu")


def test_checks_say_why(modes, env, jpeg_tree):
    files = registry.detect_dataset(jpeg_tree)
    by = {m.name: m for m in modes}
    cpu = Config(env=env, dataset=files, device="cpu")
    assert "--device gpu" in by["fastread-gpu-psync"].unavailable(cpu)
    assert "--mem" in by["xnvme-gds"].unavailable(cpu)
    decode = Config(env=env, dataset=files, device="cpu", decode=True)
    assert "does not decode" in by["python-loop"].unavailable(decode)
    assert "does not decode" in by["read_files-psync"].unavailable(decode)
    fake = Environment(engines={"psync": True, "io_uring": "kernel says no"},
                       dali_error="DALI not installed")
    fake._cuda = ["none here"]
    cfg = Config(env=fake, dataset=files, device="cpu")
    assert by["reader-io_uring"].unavailable(cfg) == "kernel says no"
    assert by["dali"].unavailable(cfg) == "DALI not installed"
    assert by["reader-psync"].unavailable(cfg) is None
    assert fake.engine_error("warp-drive") == NOT_BUILT
    gpu = Config(env=fake, dataset=files, device="gpu")
    assert "needs a CUDA device; none here" in by["reader-psync"].unavailable(gpu)


def _result(mode, what, role, dali, runs):
    med = sorted(runs)[(len(runs) - 1) // 2]
    return {"mode": mode, "what": what, "role": role, "dali": dali, "img_per_s": med,
            "gb_per_s": med / 1e3, "batches": 10, "seconds": 1.0,
            "runs": [{"img_per_s": r} for r in runs]}


def test_verdict_and_table():
    results = [_result("dali", "fn.readers.file", "baseline", True, [100, 110, 105]),
               _result("python-file", "external_source(np.fromfile loop)", "python", True,
                       [80, 82, 81]),
               _result("python-loop", "np.fromfile loop", "python", False, [300, 300, 300]),
               _result("fastread-io_uring", "readers.file", "fastread", True, [200, 210, 190]),
               _result("reader-io_uring", "fastread.Reader", "fastread", False, [400, 400, 400])]
    v = report.verdict(results, "2 CPUs, cpu, warm cache")
    assert v.startswith("verdict (2 CPUs, cpu, warm cache): fastread in DALI "
                        "(fastread-io_uring) reads 1.90x as fast as fn.readers.file "
                        "(200 vs 105 img/s)")
    assert "without DALI (reader-io_uring) 3.81x" in v
    assert "(python-file) 0.77x" in v  # the external source, not the loop without DALI
    assert "spread" not in v
    close = [_result("dali", "fn.readers.file", "baseline", True, [100, 120]),
             _result("fastread-psync", "readers.file", "fastread", True, [110, 115])]
    assert "(within run-to-run spread)" in report.verdict(close, "x")
    assert "no baseline ran" in report.verdict(results[1:], "x")
    table = report.format_table(results).splitlines()
    assert table[0].split() == ["mode", "img/s", "GB/s", "batches", "seconds", "spread", "vs",
                                "dali", "what", "ran"]
    assert table[2].split()[:7] == ["dali", "105", "0.105", "10", "1.000", "±5%", "1.00x"]


def test_dataset_kinds_are_registered_once():
    registry.add_dataset_kind("files", registry.DATASET_KINDS["files"])  # the same: fine
    with pytest.raises(ValueError, match="already registered"):
        registry.add_dataset_kind("files", "something else")

"""The benchmark harness over a family of its own: the warm-up run, warm and
cold passes, the one-line summary of modes left out, exit status. The
family (written here as a module, as a real one would be) reads its own
kind of dataset, so this also shows a new family and dataset kind added as
one module. Nothing here asserts a speed."""
import json
import textwrap

import pytest

from fastread.bench import registry, runners
from fastread.cli import main

FAMILY = '''
    import os

    from fastread.bench.registry import Dataset, Mode, add_dataset_kind

    NAME = "fake"
    ORDER = 1
    add_dataset_kind("records", "a directory of .rec files")
    BUILDS = []


    def detect(path):
        if not os.path.isdir(path):
            return None
        recs = sorted(f for f in os.listdir(path) if f.endswith(".rec"))
        if not recs:
            return None
        paths = [os.path.join(path, f) for f in recs]
        return Dataset(root=path, primary="records", kinds=("records",), paths=paths,
                       labels=[0] * len(paths), samples=len(paths),
                       nbytes=sum(os.path.getsize(p) for p in paths))


    class Runner:
        def __init__(self, cfg, fail):
            self.cfg, self.fail, self.i = cfg, fail, 0

        def next(self):
            if self.fail:
                raise OSError(5, "disk on fire")
            n = 0
            for _ in range(self.cfg.batch_size):
                with open(self.cfg.paths[self.i % len(self.cfg.paths)], "rb") as f:
                    n += len(f.read())
                self.i += 1
            return self.cfg.batch_size, n

        def close(self):
            pass


    def _build(mode, cfg):
        BUILDS.append(mode.name)
        return Runner(cfg, mode.param("fail", False))


    def _ok(mode, cfg):
        return None


    def modes(env):
        yield Mode("rec-base", NAME, "records", "records, the usual way", "the baseline",
                   check=_ok, build=_build, role="baseline", dali=True, default=("cpu", "gpu"))
        yield Mode("rec-fast", NAME, "records", "records, fast", "the new way",
                   check=_ok, build=_build, role="fastread", dali=True, default=("cpu", "gpu"))
        yield Mode("rec-broken", NAME, "records", "records, broken", "fails at run time",
                   check=_ok, build=_build, params=(("fail", True),))
        yield Mode("rec-never", NAME, "records", "never here", "cannot run here",
                   check=lambda m, c: "needs a warp drive", build=_build)
        yield Mode("tree-only", NAME, "files", "a file tree", "another kind of dataset",
                   check=_ok, build=_build)
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(the family module, a records dataset, the stand-in drop_caches file)."""
    name = f"fakebench_{tmp_path.name}"
    pkg = tmp_path / "pkgs" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "records.py").write_text(textwrap.dedent(FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setattr(registry, "FAMILY_PACKAGE", name)
    data = tmp_path / "recs"
    data.mkdir()
    for i in range(6):
        (data / f"{i}.rec").write_bytes(bytes(100 + i))
    drop = tmp_path / "drop_caches"
    drop.write_text("")
    monkeypatch.setattr(runners, "DROP_CACHES", str(drop))
    mod = registry.families()["fake"]
    mod.BUILDS.clear()
    return mod, str(data), drop


ARGS = ["--batchsize", "2", "--batches", "2", "--warmup", "0", "--no-progress",
        "--device", "cpu"]


def test_default_run_warms_up_then_times_warm_and_cold(fake, tmp_path, capsys):
    mod, data, drop = fake
    out_json = tmp_path / "r.json"
    assert main(["bench", data, *ARGS, "--repeat", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    # One untimed warm-up run per mode, then 2 timed runs warm and 2 cold:
    # the warm-up is not repeated for the cold pass.
    assert mod.BUILDS == ["rec-base"] * 3 + ["rec-fast"] * 3 + ["rec-base"] * 2 + \
        ["rec-fast"] * 2
    assert drop.read_text() == "3"
    assert "a directory of .rec files, 6 samples" in out
    doc = json.loads(out_json.read_text())
    assert [(r["mode"], r["cache"], len(r["runs"])) for r in doc["results"]] == [
        ("rec-base", "warm", 2), ("rec-fast", "warm", 2), ("rec-base", "cold", 2),
        ("rec-fast", "cold", 2)]
    for r in doc["results"]:
        assert r["samples"] == 4 and r["bytes"] == 100 + 101 + 102 + 103
    summary = [line for line in out.splitlines() if "--modes all" in line]
    assert summary == ["2 more modes apply to this dataset (--modes all runs them); 1 of them "
                       "cannot run here (rec-never: --list-modes says why)"]
    assert "tree-only" not in out
    verdicts = [line for line in out.splitlines() if line.startswith("verdict (")]
    assert len(verdicts) == 2 and "warm cache" in verdicts[0] and "cold cache" in verdicts[1]
    assert "fastread in DALI (rec-fast)" in verdicts[0] and "records, the usual way" in verdicts[0]


def test_all_modes_a_failure_is_exit_status_1(fake, capsys):
    mod, data, _ = fake
    assert main(["bench", data, *ARGS, "--modes", "all", "--cache", "both",
                 "--warmup-runs", "0"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "mode rec-never: not available: needs a warp drive" in out
    assert sum(line.startswith("mode rec-broken: failed: OSError: [Errno 5] disk on fire")
               for line in out) == 1  # not tried again cold
    assert not any("tree-only" in line for line in out)
    assert mod.BUILDS == ["rec-base", "rec-fast", "rec-broken", "rec-base", "rec-fast"]


def test_modes_that_cannot_run_are_not_a_failure(fake, capsys):
    mod, data, _ = fake
    assert main(["bench", data, *ARGS, "--modes", "rec-never,tree-only"]) == 0
    out = capsys.readouterr().out
    assert "mode tree-only: does not apply to" in out and "(it reads a tree of sample" in out
    assert "mode rec-never: not available: needs a warp drive" in out
    assert "no mode ran" in out and mod.BUILDS == []


def test_list_modes_shows_the_family(fake, capsys):
    _, data, _ = fake
    assert main(["bench", "--list-modes", data, "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "[fake]" in out
    rows = {line[2:].split()[0]: line for line in out if line.startswith(("* ", "  "))}
    assert rows["rec-base"].startswith("* ") and rows["rec-broken"].startswith("  ")
    assert "not available: needs a warp drive" in rows["rec-never"]
    assert "does not apply (reads a file tree)" in rows["tree-only"]


def test_sweep_runs_modes_per_queue_depth(fake, capsys):
    from fastread.bench import sweep

    _, data, _ = fake
    assert sweep.main([data, "--modes", "rec-base,rec-never", "--batches", "1",
                       "--batchsize", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "rec-never: not available: needs a warp drive" in out
    assert any(line.startswith("rec-base ") for line in out.splitlines())


def test_cold_drops_the_page_cache_before_every_timed_epoch(fake, tmp_path, monkeypatch):
    """Cold means cold: a run longer than an epoch is timed one epoch at a
    time, each after its own drop and with a runner built after it, so no
    timed batch reads a file already read since the last drop. Counted with
    a stand-in drop function, not timed."""
    mod, data, _ = fake
    events = mod.BUILDS  # builds and drops, in order

    def drop():
        events.append("DROP")
        return None
    monkeypatch.setattr(runners.PageCache, "_drop", staticmethod(drop))
    out_json = tmp_path / "r.json"
    # 6 samples, batch 2: 3 batches an epoch; 1 warm-up batch each epoch, so
    # 2 timed ones; 7 timed batches -> epochs of 2, 2, 2 and 1 timed batches.
    assert main(["bench", data, "--batchsize", "2", "--batches", "7", "--warmup", "1",
                 "--no-progress", "--device", "cpu", "--cold", "--repeat", "2",
                 "--warmup-runs", "0", "--modes", "rec-base", "--json", str(out_json)]) == 0
    events.remove("DROP")  # can_drop()'s one probe, before any run
    assert events == ["DROP", "rec-base"] * 8  # 2 runs x 4 epochs, a drop before each
    doc = json.loads(out_json.read_text())
    assert doc["config"]["cold_drops"] == "every timed epoch"
    assert doc["config"]["cold_note"] is None
    (res,) = doc["results"]
    for run in res["runs"]:
        assert run["drops"] == 4 and len(run["epochs_img_per_s"]) == 4
        assert run["batches"] == 7 and run["samples"] == 14


def test_cold_segments_never_time_a_sample_twice_after_a_drop():
    from fastread.bench.harness import cold_segments
    for batches in range(1, 30):
        for epoch in range(1, 8):
            for warmup in range(0, 4):
                segs = cold_segments(batches, epoch, warmup)
                assert sum(n for _, n in segs) == batches
                assert all(w + n <= epoch or (w == 0 and n == 1) for w, n in segs)
    assert cold_segments(9, 3, 0) == [(0, 3)] * 3          # --epochs 3: one drop an epoch
    assert cold_segments(2, 3, 0) == [(0, 2)]              # less than an epoch: one drop


def test_cold_that_cannot_drop_says_so_in_the_json(fake, tmp_path, monkeypatch):
    mod, data, _ = fake
    monkeypatch.setattr(runners, "DROP_CACHES", str(tmp_path / "missing" / "drop_caches"))
    out_json = tmp_path / "r.json"
    assert main(["bench", data, *ARGS, "--cold", "--modes", "rec-base",
                 "--json", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert doc["config"]["cold"] is False and doc["config"]["cache"] == ["warm"]
    assert doc["config"]["cold_note"].startswith("--cold: cannot drop the page cache")

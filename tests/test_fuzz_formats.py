"""A bounded, seeded fuzz run of every parser of user files, in CI
(tests/fuzz_targets.py: the targets, mutations and limits).

Per target, a few hundred mutants of valid inputs, each read for one full
epoch in a forked child with an address-space limit and a time limit: no
crash, no hang, peak resident memory under fuzz_targets.RSS_BOUND (256 MiB),
and every error a ValueError or OSError (FormatError, NpyError, ImageError,
ReadError, ...) whose message names the mutated file. About 5 s a target
on the 2-core VM. ``FASTREAD_FUZZ_CASES`` and ``FASTREAD_FUZZ_SEED``
change the run (docs/untrusted.md: longer and coverage-guided runs).
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("msgpack")

import fuzz_targets  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = int(os.environ.get("FASTREAD_FUZZ_CASES", "250"))
SEED = int(os.environ.get("FASTREAD_FUZZ_SEED", "43"))


def fuzz(target, tmp_path, *args):
    out = tmp_path / "results.json"
    p = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_targets.py"), "--target",
                        target, "--seed", str(SEED), "--dir", str(tmp_path / "work"),
                        "--json", str(out), *args],
                       capture_output=True, text=True, timeout=600)
    assert out.exists(), p.stdout + p.stderr
    doc = json.loads(out.read_text())
    return p, doc["summary"], doc["results"]


@pytest.mark.parametrize("target", sorted(fuzz_targets.TARGETS))
def test_fuzz(target, tmp_path):
    p, s, results = fuzz(target, tmp_path, "--cases", str(CASES))
    bad = [(c, r) for _, c, r in results if r["outcome"] not in ("ok", "clean")]
    assert not bad, (f"{len(bad)} of {s['cases']} cases failed (reproduce one with "
                     f"python tests/fuzz_targets.py --target {target} --seed {SEED} "
                     f"--case N --show):\n" + "\n".join(
                         f"case {c}: {r['outcome']}: {r.get('type', '')} {r.get('error', '')}\n"
                         f"{r.get('traceback', '')}" for c, r in bad[:5]))
    assert s["peak_rss_max"] <= fuzz_targets.RSS_BOUND, s
    assert p.returncode == 0, p.stdout + p.stderr
    # The run exercised something: some mutants read, most failed cleanly.
    assert s["ok"] >= 1 and s["clean"] >= CASES // 4, s
    print(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", sorted(fuzz_targets.TARGETS))
def test_seeds_read(target, tmp_path):
    p, s, results = fuzz(target, tmp_path, "--seeds")
    assert p.returncode == 0 and s["ok"] == s["cases"] >= 1, results

"""The gather bench family: a 2-D .npy file is a feature matrix, its modes
run through the harness, and the GPU-only mode says why it cannot run."""
import json
import subprocess
import sys

import numpy as np
import pytest

from fastread.bench.families import gather


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    path = tmp_path_factory.mktemp("feat") / "features.npy"
    np.save(path, np.arange(4000 * 16, dtype=np.float32).reshape(4000, 16))
    return str(path)


def fastread_bench(*args):
    return subprocess.run([sys.executable, "-m", "fastread.cli", "bench", *args],
                          capture_output=True, text=True, timeout=300)


def test_detect_takes_2d_npy_only(features, tmp_path):
    ds = gather.detect(features)
    assert ds.primary == "features" and ds.samples == 4000 and ds.nbytes == 4000 * 16 * 4
    one_d = tmp_path / "v.npy"
    np.save(one_d, np.arange(10))
    assert gather.detect(str(one_d)) is None
    assert gather.detect(str(tmp_path)) is None
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not an array")
    assert gather.detect(str(junk)) is None


def test_gather_modes_run_and_report(features, tmp_path):
    out = tmp_path / "r.json"
    r = fastread_bench(features, "--device", "cpu", "--cache", "warm", "--batchsize", "500",
                       "--batches", "4", "--repeat", "1", "--no-progress",
                       "--modes", "gather-memmap,gather-host", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())
    text = json.dumps(results)
    assert "gather-memmap" in text and "gather-host" in text
    assert "features" in r.stdout


def test_gpu_only_mode_says_why(features):
    r = fastread_bench("--list-modes", features)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if "xnvme-bam" in l)
    try:
        import fastread
        fastread.FeatureStore(features, backend="proxy", device_id=0).close()
        gpu = True
    except Exception:
        gpu = False
    if not gpu:
        # The reason is a footnote shared by the modes that have it.
        assert "not available" in line and "needs a CUDA device" in r.stdout, r.stdout

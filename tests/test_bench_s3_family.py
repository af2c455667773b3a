"""The `fastread bench` family s3 (src/fastread/bench/families/s3.py) against
a real S3 server (SeaweedFS, the s3_server fixture): its modes, the dataset
an s3:// URL lists to, a tiny run of every mode that can run here (rows with
every object's bytes, the client's CPU per GB, the engine's requests in
flight), modes whose package is missing skipped with the reason, --cache
cold refused, and no secret in the output or the JSON."""

import json
import os
import subprocess
import sys
import uuid

import pytest

from fastread.bench import environment, registry

S3_MODES = ["s3-dali", "s3-boto3", "s3-read_files", "s3-reader", "s3-curl"]
CLASSES, PER_CLASS = 2, 5


def _fastread_s3_or_skip():
    from fastread.engine import s3_version
    why = s3_version()[1]
    if why:
        pytest.skip(f"no s3 engine in this fastread: {why}")


@pytest.fixture(scope="module")
def s3_tree(s3_server, tmp_path_factory):
    """CLASSES x PER_CLASS small objects under s3://<fresh bucket>/train/cK/,
    different sizes (so a lost or doubled object changes the byte count)."""
    _fastread_s3_or_skip()
    bucket = f"fam-{uuid.uuid4().hex[:10]}"
    s3_server.make_bucket(bucket)
    sizes = {}
    for c in range(CLASSES):
        for i in range(PER_CLASS):
            key = f"train/c{c}/s{i:02d}.jpg"  # scan keeps image names only
            data = bytes([c * 16 + i]) * (1000 + 137 * (c * PER_CLASS + i))
            s3_server.put(bucket, key, data)
            sizes[f"s3://{bucket}/{key}"] = len(data)
    return bucket, sizes


def _options(server, secret=None):
    return {"s3": {"endpoint_url": server.endpoint, "region": server.region,
                   "access_key_id": server.access_key,
                   "secret_access_key": secret or server.secret_key}}


def _clean_env():
    """This environment without AWS_* (the options given on the command line
    must be what every client uses) and without instance-metadata probes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _bench(server, url, *args, secret=None, block=(), timeout=300):
    """`fastread bench URL` in a child process (DALI's client reads the
    environment once per process), the endpoint and credentials given as
    --engine-option s3.*; `block`: modules made unimportable there."""
    opts = _options(server, secret)["s3"]
    argv = ["bench", url, "--no-progress", "--device", "cpu"]
    for k, v in opts.items():
        argv += ["--engine-option", f"s3.{k}={v}"]
    argv += list(args)
    code = ("import sys\n"
            f"for m in {list(block)!r}: sys.modules[m] = None\n"
            "from fastread.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code] + argv, env=_clean_env(),
                          capture_output=True, text=True, timeout=timeout)


# -- the modes ---------------------------------------------------------------------------
def test_the_family_lists_its_modes():
    env = environment.probe_environment()
    fams = registry.families()
    assert "s3" in fams, registry.broken_families()
    modes = [m for m in registry.all_modes(env) if m.family == "s3"]
    assert [m.name for m in modes] == S3_MODES
    assert {m.dataset for m in modes} == {"s3"}
    roles = {m.name: m.role for m in modes}
    assert roles == {"s3-dali": "baseline", "s3-boto3": "python", "s3-read_files": "fastread",
                     "s3-reader": "fastread", "s3-curl": "reference"}
    assert [m.name for m in modes if m.ceiling] == ["s3-curl"]
    # the headline run of an s3:// dataset is every s3 mode, and no file mode
    ds = registry.Dataset(root="s3://b/p", primary="s3", kinds=("s3",), page_cache=False)
    assert [m.name for m in registry.defaults(registry.all_modes(env), ds, "cpu")] == S3_MODES


def test_read_files_takes_engine_s3_by_name(s3_server, s3_tree):
    # The modes name the engine: engine="s3" was refused ("unavailable
    # here") because its status is never True for local files.
    import fastread
    bucket, sizes = s3_tree
    urls = sorted(sizes)[:3]
    arrays = fastread.read_files(urls, engine="s3", **_options(s3_server))
    assert [a.nbytes for a in arrays] == [sizes[u] for u in urls]


# -- the dataset -------------------------------------------------------------------------
def test_an_s3_url_is_a_dataset_of_its_objects(s3_server, s3_tree):
    bucket, sizes = s3_tree
    ds = registry.detect_dataset(f"s3://{bucket}/train", engine_options=_options(s3_server))
    assert ds.primary == "s3" and ds.kinds == ("s3",) and not ds.page_cache
    assert ds.paths == sorted(sizes)
    assert ds.labels == [0] * PER_CLASS + [1] * PER_CLASS
    assert ds.samples == CLASSES * PER_CLASS
    assert ds.nbytes == sum(sizes.values())


def test_an_s3_url_that_cannot_be_listed_says_which(s3_server, s3_tree):
    bucket, _ = s3_tree
    with pytest.raises(registry.BenchError, match=f"s3://{bucket}/nothing-here holds no samples"):
        registry.detect_dataset(f"s3://{bucket}/nothing-here", engine_options=_options(s3_server))
    missing = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(registry.BenchError, match=f"s3://{missing}/train: cannot list it"):
        registry.detect_dataset(f"s3://{missing}/train", engine_options=_options(s3_server))
    with pytest.raises(registry.BenchError, match="cannot list it") as e:
        registry.detect_dataset(f"s3://{bucket}/train",
                                engine_options=_options(s3_server, secret="wrong-secret-xyz"))
    assert "wrong-secret-xyz" not in str(e.value)


def test_other_urls_belong_to_no_family():
    with pytest.raises(registry.BenchError, match="no benchmark family reads gs:// URLs"):
        registry.detect_dataset("gs://bucket/prefix")


# -- a run -------------------------------------------------------------------------------
def test_a_tiny_run_of_every_mode(s3_server, s3_tree, tmp_path):
    bucket, sizes = s3_tree
    out = tmp_path / "s3.json"
    r = _bench(s3_server, f"s3://{bucket}/train", "--modes", ",".join(S3_MODES),
               "--batchsize", "5", "--repeat", "1", "--warmup-runs", "0", "--json", str(out))
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    assert s3_server.secret_key not in text
    assert "cache: does not apply" in r.stdout
    doc = json.loads(out.read_text())
    assert s3_server.secret_key not in out.read_text()
    assert doc["config"]["engine_options"]["s3"]["secret_access_key"] == "***"
    assert doc["dataset"]["root"] == f"s3://{bucket}/train"
    assert doc["dataset"]["files"] == len(sizes) and doc["dataset"]["bytes"] == sum(sizes.values())
    ran = {x["mode"]: x for x in doc["results"]}
    # What cannot run here says why; everything else ran.
    assert set(ran) | set(doc["skipped"]) == set(S3_MODES), (ran.keys(), doc["skipped"])
    assert not doc["failed"]
    for name, why in doc["skipped"].items():
        assert why and name not in ("s3-read_files", "s3-reader"), (name, why)
    for name in ("s3-read_files", "s3-reader"):
        assert name in ran, doc["skipped"]
    epoch = len(sizes) // 5   # one epoch of batches of 5 (no partial batch: DALI wraps)
    for name, x in ran.items():
        assert x["cache"] == "none"
        assert x["batches"] == epoch
        # the default run is one epoch from the start: every object once
        assert x["samples"] == len(sizes), name
        if name == "s3-curl":
            # batches in curl's completion order: which objects the warm-up
            # batch took from each epoch is up to the transfers
            assert min(sizes.values()) * len(sizes) <= x["bytes"] <= max(sizes.values()) * len(sizes)
        else:
            assert x["bytes"] == sum(sizes.values()), name
        assert x["img_per_s"] > 0 and x["gb_per_s"] > 0
        assert x["cpu_s_per_gb"] > 0, name
    st = ran["s3-read_files"]["stats"]
    assert 1 <= st["s3_inflight_max"] <= 5      # one batch of 5 at a time
    assert st["s3_requests"] >= len(sizes) and st["s3_retries"] == 0
    assert "in flight" in r.stdout and "CPU s/GB" in r.stdout
    if "s3-curl" in ran:
        assert "of ceiling" in r.stdout


def test_a_missing_package_skips_its_mode_with_the_reason(s3_server, s3_tree, tmp_path):
    bucket, _ = s3_tree
    out = tmp_path / "s3.json"
    r = _bench(s3_server, f"s3://{bucket}/train", "--modes", "s3-boto3,s3-dali,s3-read_files",
               "--batchsize", "5", "--warmup-runs", "0", "--json", str(out),
               block=("boto3", "nvidia.dali"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    doc = json.loads(out.read_text())
    assert [x["mode"] for x in doc["results"]] == ["s3-read_files"]
    assert "boto3" in doc["skipped"]["s3-boto3"] and "pip install boto3" in doc["skipped"]["s3-boto3"]
    assert "DALI" in doc["skipped"]["s3-dali"]
    assert "mode s3-boto3: not available: boto3" in r.stdout


def test_cold_cache_is_refused_for_objects(s3_server, s3_tree):
    bucket, _ = s3_tree
    r = _bench(s3_server, f"s3://{bucket}/train", "--modes", "s3-read_files", "--cache", "cold")
    assert r.returncode == 2
    assert f"--cache cold: s3://{bucket}/train is not read through this machine's page cache" \
        in r.stderr


def test_a_wrong_secret_fails_naming_the_url_and_shows_no_secret(s3_server, s3_tree):
    bucket, _ = s3_tree
    r = _bench(s3_server, f"s3://{bucket}/train", "--modes", "s3-read_files",
               secret="not-the-secret-123")
    assert r.returncode == 2
    assert f"s3://{bucket}/train: cannot list it" in r.stderr
    assert "not-the-secret-123" not in r.stdout + r.stderr


def test_s3_options_are_only_for_s3_urls(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bench", str(tmp_path),
                        "--engine-option", "s3.region=eu-west-1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--engine-option s3.*: only for s3:// DATA" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "bench", "s3://b/p",
                        "--engine-option", "s3.no_such_option=1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no_such_option" in r.stderr

"""Ranges of many shards through ONE native reader (issue 37, item 1):
10,000 shards read under ``ulimit -n 256``, every sample exactly once an
epoch with its bytes, in order and shuffled, with threads bounded by the
workers and descriptors by ``max_open_files`` whatever the shard count; a
missing or truncated shard is that sample's error naming the shard; S3
objects by ranged GETs over one context's connections."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastread
from fastread.formats import MultiFileRanges

SHARDS = 10_000
PER_SHARD = 3
SAMPLE = 16


def _sample_bytes(shard, k):
    """Sample k of shard `shard`: 16 bytes no other sample has."""
    return (shard * PER_SHARD + k).to_bytes(8, "little") + (shard ^ 0x5A5A).to_bytes(8, "little")


def make_shards(root, shards=SHARDS):
    """`shards` files of PER_SHARD 16-byte samples after an 8-byte header:
    the columns (paths, file ids, offsets, lengths)."""
    os.makedirs(root, exist_ok=True)
    paths = []
    for s in range(shards):
        p = os.path.join(root, f"shard-{s:06d}.bin")
        with open(p, "wb") as f:
            f.write(b"HEADER!!" + b"".join(_sample_bytes(s, k) for k in range(PER_SHARD)))
        paths.append(p)
    file_ids = np.repeat(np.arange(shards, dtype=np.uint32), PER_SHARD)
    offsets = 8 + np.tile(np.arange(PER_SHARD, dtype=np.uint64) * SAMPLE, shards)
    lengths = np.full(shards * PER_SHARD, SAMPLE, np.uint64)
    return paths, file_ids, offsets, lengths


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("many-shards")))


# Both children's watcher: the process's peak threads and descriptors,
# sampled every 2 ms by a thread started once the reader is built.
PEAK_WATCH = r"""
peak = {"threads": 0, "fds": 0}
stop = threading.Event()
def watch():
    while not stop.is_set():
        peak["threads"] = max(peak["threads"], len(os.listdir("/proc/self/task")))
        peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))
        time.sleep(0.002)
"""

CHILD = r"""
import json, os, resource, sys, threading, time
import numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import fastread
from fastread.formats import MultiFileRanges

root, shuffle, workers, max_open = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
engine = sys.argv[5]
paths = sorted(os.path.join(root, n) for n in os.listdir(root))
per = 3
file_ids = np.repeat(np.arange(len(paths), dtype=np.uint32), per)
offsets = 8 + np.tile(np.arange(per, dtype=np.uint64) * 16, len(paths))
src = MultiFileRanges.from_columns(paths, file_ids, offsets, np.full(len(file_ids), 16))

""" + PEAK_WATCH + r"""base_threads = len(os.listdir("/proc/self/task"))
base_fds = len(os.listdir("/proc/self/fd"))
w = threading.Thread(target=watch, daemon=True)
w.start()
seen = np.zeros(len(file_ids), np.int64)
bad = 0
with fastread.Reader(source=src, batch_size=256, random_shuffle=shuffle, seed=7,
                     workers=workers, max_open_files=max_open, engine=engine) as r:
    for epoch in range(2):
        r.set_epoch(epoch)
        for arrays, labels in r:
            for a, lab in zip(arrays, labels.tolist()):
                b = a.tobytes()
                s, k = divmod(lab, per)
                want = lab.to_bytes(8, "little") + (s ^ 0x5A5A).to_bytes(8, "little")
                bad += b != want
                seen[lab] += 1
        fds_after = len(os.listdir("/proc/self/fd"))
    rings = r._native.stat("file_ranges_native")
    engine = r.engine
stop.set()
w.join()
print(json.dumps({"min": int(seen.min()), "max": int(seen.max()), "bad": bad,
                  "threads": peak["threads"], "fds": peak["fds"], "base_threads": base_threads,
                  "base_fds": base_fds, "engine": engine, "rings": rings}))
"""


def _uring_rings_or_skip():
    """Skips naming why where io_uring cannot read file ranges on its rings."""
    info = fastread.engines()["io_uring"]
    if info.files is not True:
        pytest.skip(f"io_uring: {info.files}")


@pytest.mark.parametrize("engine", ["auto", "io_uring"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_ten_thousand_shards_under_ulimit_256(shards, shuffle, engine):
    """auto reads shards with psync; io_uring on its rings (direct
    descriptors: none of the process's per shard) where the kernel has
    linked direct opens, else with psync too: bounded alike."""
    if engine == "io_uring":
        _uring_rings_or_skip()
    paths, *_ = shards
    workers, max_open = 2, 64
    out = subprocess.run([sys.executable, "-c", CHILD, os.path.dirname(paths[0]),
                          "1" if shuffle else "0", str(workers), str(max_open), engine],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if engine == "auto":
        assert got["rings"] <= 0, got  # psync: no rings (-1: no such counter)
    else:
        assert got["engine"] == "io_uring", got
        # Both workers on their rings, unless the kernel refused (psync then).
        assert got["rings"] in (0, workers), got
    # Two epochs: every sample exactly twice, every byte right.
    assert (got["min"], got["max"], got["bad"]) == (2, 2, 0), got
    # Threads: the workers and their psync helpers (threads=4: 3 each),
    # beside the interpreter's own and the watcher (base), never per shard.
    assert got["threads"] - got["base_threads"] <= workers + 8, got
    assert got["fds"] - got["base_fds"] <= max_open + 16, got


def test_lru_reuses_descriptors_when_the_shards_fit(shards):
    """Shards that fit in the LRU are opened once, not once a batch: the
    second epoch opens none; shards that do not are evicted, the open
    descriptors never past the bound."""
    paths, file_ids, offsets, lengths = shards
    n = 300 * PER_SHARD  # the first 300 shards
    src = MultiFileRanges.from_columns(paths[:300], file_ids[:n], offsets[:n], lengths[:n])
    src.max_open_files = 400
    native = src.open_native("psync", fastread.EngineOptions().resolve("psync"), prefetch=2,
                             workers=1)
    try:
        for epoch in range(2):
            for s in range(0, n, 128):
                native.submit(np.arange(s, min(s + 128, n)))
                native.next().release()
            if epoch == 0:
                opened = native.stat("fd_cache_opens")
        assert opened == 300
        assert native.stat("fd_cache_opens") == 300       # none again in epoch 2
        assert native.stat("fd_cache_evictions") == 0
        assert native.stat("fd_cache_open") == 300
    finally:
        native.close()
    src.max_open_files = 50
    native = src.open_native("psync", fastread.EngineOptions().resolve("psync"), prefetch=2,
                             workers=2)
    try:
        for s in range(0, n, 128):
            native.submit(np.arange(s, min(s + 128, n)))
            native.next().release()
        assert native.stat("fd_cache_opens") >= 300
        assert native.stat("fd_cache_evictions") >= 300 - 50
        assert native.stat("fd_cache_open") <= 50
    finally:
        native.close()


@pytest.mark.parametrize("engine", ["psync", "io_uring"])
def test_nearby_ranges_are_read_together_with_the_same_bytes(shards, engine):
    """A shard's samples read in order are adjacent: one vector read a
    shard a batch, not one a sample; io_uring (its psync side) delivers
    the very bytes psync does."""
    if engine == "io_uring" and fastread.engines()["io_uring"].files is not True:
        pytest.skip(f"io_uring: {fastread.engines()['io_uring'].files}")
    paths, file_ids, offsets, lengths = shards
    nsh = 300
    n = nsh * PER_SHARD
    src = MultiFileRanges.from_columns(paths[:nsh], file_ids[:n], offsets[:n], lengths[:n])
    native = src.open_native(engine, fastread.EngineOptions().resolve(engine), prefetch=2,
                             workers=1)
    batches = 0
    try:
        for s in range(0, n, 128):
            native.submit(np.arange(s, min(s + 128, n)))
            b = native.next()
            assert not b.failures()
            for i, a in zip(range(s, s + 128), b.arrays()):
                assert a.tobytes() == _sample_bytes(*divmod(i, PER_SHARD))
            b.release()
            batches += 1
        # A shard cut by a batch's end is read in both batches.
        assert nsh <= native.stat("fd_cache_reads") <= nsh + batches
    finally:
        native.close()


@pytest.mark.parametrize("engine", ["psync", "io_uring"])
def test_missing_and_truncated_shards_fail_their_samples_only(tmp_path, engine):
    paths, file_ids, offsets, lengths = make_shards(str(tmp_path / "s"), shards=20)
    os.remove(paths[3])                      # missing
    with open(paths[7], "r+b") as f:         # truncated inside its second sample
        f.truncate(8 + SAMPLE + 4)
    if engine == "io_uring":
        _uring_rings_or_skip()
    src = MultiFileRanges.from_columns(paths, file_ids, offsets, lengths)
    want_bad = {3 * PER_SHARD + k for k in range(PER_SHARD)} | {7 * PER_SHARD + 1,
                                                                 7 * PER_SHARD + 2}
    native = src.open_native(engine, fastread.EngineOptions().resolve(engine), prefetch=2,
                             workers=2)
    try:
        native.submit(np.arange(len(src)))
        b = native.next()
        fails = dict(b.failures())
        assert set(fails) == want_bad
        for i in want_bad:
            assert "shard-000003" in src.sample_name(i) or "shard-000007" in src.sample_name(i)
        arrays = b.arrays()
        for i in set(range(len(src))) - want_bad:
            s, k = divmod(i, PER_SHARD)
            assert arrays[i].tobytes() == _sample_bytes(s, k)
        b.release()
    finally:
        native.close()
    # Through the Reader: the error names the shard's path.
    with fastread.Reader(source=src, batch_size=len(src), engine=engine) as r:
        with pytest.raises(fastread.ReadError, match="shard-00000[37]"):
            next(iter(r))


def test_max_open_files_is_clamped_to_the_headroom():
    import resource
    from fastread import _defaults
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert _defaults.max_open_files(0) == max(1, min(256, soft // 4))
    assert _defaults.max_open_files(10) == 10
    # io_uring's slots are no process descriptors: its default holds every
    # file where half the soft limit covers them, else the plain default.
    auto = max(1, min(256, soft // 4))
    open_now = len(os.listdir("/proc/self/fd"))
    headroom = soft - open_now - 32
    many = min(soft // 8, 2000)
    want = many + many // 4 + 64
    if auto < want and 2 * want < headroom - 8:
        assert _defaults.max_open_files(0, "io_uring", many) == want
        assert _defaults.max_open_files(0, "io_uring", many, 2) == 2 * want
        assert _defaults.max_open_files(0, "psync", many) == auto
        assert _defaults.max_open_files(0, "auto", many) == auto
    assert _defaults.max_open_files(0, "io_uring", soft // 2 + 1) == auto
    assert _defaults.max_open_files(0, "io_uring", 1) == auto
    assert _defaults.max_open_files(7, "io_uring", many) == 7
    with pytest.warns(RuntimeWarning, match="max_open_files"):
        assert _defaults.max_open_files(soft * 2) < soft
    with pytest.raises(ValueError, match="max_open_files"):
        _defaults.max_open_files(-1)


def test_s3_objects_read_by_ranges_on_one_context(s3_engine, s3_server, tmp_path):
    """300 objects, ranges of all of them in shuffled batches: exact bytes,
    connections far fewer than requests (kept across objects)."""
    bucket = "many-shards"
    s3_server.make_bucket(bucket)
    local, file_ids, offsets, lengths = make_shards(str(tmp_path / "s3"), shards=300)
    urls = []
    for p in local:
        with open(p, "rb") as f:
            urls.append(s3_server.put(bucket, "shards/" + os.path.basename(p), f.read()))
    urls[5] = urls[5] + ".missing"
    src = MultiFileRanges.from_columns(urls, file_ids, offsets, lengths)
    o = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key)
    native = src.open_native("s3", fastread.EngineOptions(s3=o).resolve("s3"), prefetch=2,
                             workers=2)
    try:
        order = np.random.default_rng(3).permutation(len(src))
        batches = np.array_split(order, 6)
        for b in batches:
            native.submit(b)
        for b in batches:
            got = native.next()
            fails = dict(got.failures())
            arrays = got.arrays()
            for j, i in enumerate(b.tolist()):
                s, k = divmod(i, PER_SHARD)
                if s == 5:
                    assert j in fails
                else:
                    assert j not in fails and arrays[j].tobytes() == _sample_bytes(s, k)
            got.release()
        assert native.stat("s3_requests") >= len(src)
    finally:
        native.close()


DALI_CHILD = r"""
import io, json, os, resource, sys, tarfile, threading, time
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import numpy as np
from nvidia.dali import pipeline_def
from fastread.dali import _plugin
from fastread.dali.formats import webdataset

root, shuffle = sys.argv[1], sys.argv[2] == "1"
paths = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".tar"))
total = 3 * len(paths)
""" + PEAK_WATCH + r"""
@pipeline_def(batch_size=256, num_threads=1, device_id=None, prefetch_queue_depth=1)
def pipe():
    return tuple(webdataset(paths=paths, ext=["jpg", "cls"], native=True, name="R",
                            random_shuffle=shuffle, seed=3, workers=2, max_open_files=64))

p = pipe()
p.build()
base_threads = len(os.listdir("/proc/self/task"))
base_fds = len(os.listdir("/proc/self/fd"))
w = threading.Thread(target=watch, daemon=True)
w.start()
seen = np.zeros(total, np.int64)
bad = 0
done = 0
for _ in range(-(-total // 256)):
    jpg, cls = p.run()
    # The last batch runs into the next epoch (DALI's readers roll over):
    # one epoch is the first `total` samples.
    for i in range(min(len(cls), total - done)):
        done += 1
        k = int(bytes(np.array(cls[i])).decode())
        bad += bytes(np.array(jpg[i])) != k.to_bytes(4, "little") * 4
        seen[k] += 1
stop.set()
w.join()
print(json.dumps({"min": int(seen.min()), "max": int(seen.max()), "bad": bad,
                  "threads": peak["threads"], "fds": peak["fds"], "base_threads": base_threads,
                  "base_fds": base_fds}))
"""


@pytest.fixture(scope="module")
def tar_shards(tmp_path_factory):
    """3,000 WebDataset shards of 3 samples: jpg (16 bytes of the sample's
    number) and cls (the number)."""
    root = str(tmp_path_factory.mktemp("many-tars"))
    import tarfile
    import io
    for s in range(3000):
        with tarfile.open(os.path.join(root, f"shard-{s:05d}.tar"), "w",
                          format=tarfile.USTAR_FORMAT) as tf:
            for j in range(PER_SHARD):
                k = s * PER_SHARD + j
                for ext, data in (("jpg", k.to_bytes(4, "little") * 4), ("cls", str(k).encode())):
                    info = tarfile.TarInfo(f"{k:07d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return root


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_dali_native_webdataset_over_3000_shards_under_ulimit_256(tar_shards, shuffle):
    """fn.fastread.readers.webdataset (native=True): a batch's ranges of
    every shard in one native call, descriptors within max_open_files
    under ulimit -n 256 (the issue's 3,000 shards failed with EMFILE)."""
    from fastread.dali import _plugin
    if not _plugin.load():
        pytest.skip(f"the native DALI plugin: {_plugin.reason()}")
    out = subprocess.run([sys.executable, "-c", DALI_CHILD, tar_shards, "1" if shuffle else "0"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["min"], got["max"], got["bad"]) == (1, 1, 0), got
    # The operator's 2 workers and their psync helpers (threads: one per 2
    # CPUs), started with the pipeline: nothing per shard while it reads.
    assert got["threads"] - got["base_threads"] <= 8, got
    assert got["fds"] - got["base_fds"] <= 64 + 16, got


@pytest.mark.parametrize("register_files", [True, False], ids=["rings", "psync-fallback"])
def test_io_uring_reads_shards_on_its_rings_or_falls_back_to_psync(shards, register_files):
    """engine="io_uring": shards held in the rings' registered file tables
    (no process descriptor a shard, a second epoch of shards that fit opens
    none on a ring that holds them); without register_files (as on a kernel
    without linked direct opens) the same bytes through psync."""
    _uring_rings_or_skip()
    paths, file_ids, offsets, lengths = shards
    n = 200 * PER_SHARD
    src = MultiFileRanges.from_columns(paths[:200], file_ids[:n], offsets[:n], lengths[:n])
    src.max_open_files = 1024
    opts = fastread.EngineOptions(register_files=register_files).resolve("io_uring")
    native = src.open_native("io_uring", opts, prefetch=2, workers=1)
    order = np.random.default_rng(1).permutation(n)
    try:
        for epoch in range(2):
            for s in range(0, n, 128):
                idx = order[s:s + 128]
                native.submit(idx)
                b = native.next()
                assert not b.failures()
                for i, a in zip(idx.tolist(), b.arrays()):
                    assert a.tobytes() == _sample_bytes(*divmod(i, PER_SHARD))
                b.release()
            if epoch == 0:
                opened = native.stat("fd_cache_opens")
        rings = native.stat("file_ranges_native")
        if register_files:
            assert rings in (0, 1)  # 0: this kernel has no linked direct opens
        else:
            assert rings <= 0
        if rings == 1:
            # Each shard goes to one ring, whose slots hold all it was given.
            assert opened == 200 and native.stat("fd_cache_opens") == 200
            assert native.stat("fd_cache_open") == 200
    finally:
        native.close()


def test_io_uring_default_holds_every_shard_on_its_rings(shards):
    """max_open_files unset, engine="io_uring", more shards than the plain
    default (256) holds: the default holds every one in the rings' tables
    (no process descriptor each), so a shuffled epoch after the first
    opens none; where the rings cannot hold files, skipped naming why."""
    _uring_rings_or_skip()
    paths, file_ids, offsets, lengths = shards
    count = min(len(paths), 600)
    n = count * PER_SHARD
    src = MultiFileRanges.from_columns(paths[:count], file_ids[:n], offsets[:n], lengths[:n])
    from fastread import _defaults
    if _defaults.max_open_files(0, "io_uring", count) <= count:
        pytest.skip(f"RLIMIT_NOFILE's soft limit leaves no room for {count} shards")
    fds_before = len(os.listdir("/proc/self/fd"))
    native = src.open_native("io_uring", fastread.EngineOptions().resolve("io_uring"),
                             prefetch=2, workers=1)
    try:
        for epoch in range(2):
            order = np.random.default_rng(epoch).permutation(n)
            for s in range(0, n, 128):
                idx = order[s:s + 128]
                native.submit(idx)
                b = native.next()
                assert not b.failures()
                for i, a in zip(idx.tolist(), b.arrays()):
                    assert a.tobytes() == _sample_bytes(*divmod(i, PER_SHARD))
                b.release()
            fds = len(os.listdir("/proc/self/fd"))
        if native.stat("file_ranges_native") != 1:
            pytest.skip("io_uring: this kernel has no linked direct opens (read through psync)")
        assert native.stat("fd_cache_opens") == count  # each once, none in epoch 2
        assert fds - fds_before <= 16, (fds_before, fds)
    finally:
        native.close()

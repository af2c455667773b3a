"""fastread's native WebDataset operator (fn.fastread.readers.webdataset,
dali_plugin/fastread_webdataset.cc) on CPU-only DALI: batch-by-batch parity
with fn.readers.webdataset across epoch rolls, shards, padding and missing
components; global shuffles; checkpoints; errors from pipe.run() naming the
shard and offset; a bad index file; and the fallback when the plugin is not
loaded."""
import gc
import glob
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import write_tar
from dali_helpers import case_id, make_pipe
from nvidia.dali import fn, pipeline_def  # noqa: E402 (dali_helpers skips without DALI)

from fastread.datasets.webdataset import make_webdataset  # noqa: E402
from fastread.formats.webdataset import WebDataset  # noqa: E402
from fastread.dali.formats import webdataset  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three shards of 9, 11 and 13 samples of recognisable bytes, some
    without a cls (missing components), one empty jpg."""
    root = tmp_path_factory.mktemp("wds_native")
    rng = np.random.default_rng(11)
    paths = []
    for s, count in enumerate((9, 11, 13)):
        members = []
        for i in range(count):
            key = f"s{s}/k{i:03d}"
            size = 0 if (s, i) == (1, 4) else int(rng.integers(1, 4000))
            members.append((key + ".jpg", bytes([s, i]) + rng.bytes(size)))
            if (i + s) % 4:
                members.append((key + ".cls", str(100 * s + i).encode()))
        paths.append(write_tar(root / f"shard-{s}.tar", members))
    return paths


EXT = ["jpg", "cls"]


def batches(pipe, iterations, k=2):
    """The bytes of the first k outputs' samples, a batch (components, not
    the labels of dali_helpers.batches)."""
    out = []
    for _ in range(iterations):
        got = pipe.run()
        out.append([[np.array(got[j][i]).tobytes() for i in range(len(got[j]))]
                    for j in range(k)])
    return out


CASES = [
    dict(),
    dict(pad_last_batch=True),
    dict(num_shards=3, shard_id=0),
    dict(num_shards=3, shard_id=2),
    dict(num_shards=2, shard_id=1, pad_last_batch=True),
    dict(num_shards=4, shard_id=3, stick_to_shard=True),
    dict(num_shards=4, shard_id=1, stick_to_shard=True, pad_last_batch=True),
]


@pytest.mark.parametrize("batch_size", [1, 5, 8])
@pytest.mark.parametrize("kw", CASES, ids=case_id)
def test_batches_match_dali_across_epochs(shards, kw, batch_size):
    """Every batch equals fn.readers.webdataset's, for three epochs and
    more (batches that cross epochs and shards), with reader_meta alike."""
    theirs = make_pipe(lambda: fn.readers.webdataset(paths=shards, ext=EXT, name="R", **kw),
                       batch_size)
    ours = make_pipe(lambda: webdataset(paths=shards, ext=EXT, name="R", native=True, **kw),
                     batch_size)
    iterations = 3 * 33 // batch_size + 2
    assert batches(ours, iterations) == batches(theirs, iterations)
    meta_theirs, meta_ours = theirs.reader_meta("R"), ours.reader_meta("R")
    for key in ("epoch_size", "epoch_size_padded", "number_of_shards", "shard_id",
                "pad_last_batch", "stick_to_shard"):
        assert meta_ours[key] == meta_theirs[key], key


@pytest.mark.parametrize("behavior", ["empty", "skip"])
def test_missing_components_match_dali(shards, behavior):
    theirs = make_pipe(lambda: fn.readers.webdataset(
        paths=shards, ext=["cls", "jpg"], missing_component_behavior=behavior), 6)
    ours = make_pipe(lambda: webdataset(paths=shards, ext=["cls", "jpg"], native=True,
                                        missing_component_behavior=behavior), 6)
    got = batches(ours, 8)
    assert got == batches(theirs, 8)
    flat = [c for b in got for c in b[0]]
    assert (b"" in flat) == (behavior == "empty")


def test_gzip_shards_read_from_the_cache(shards, tmp_path):
    """.tar.gz shards: decompressed once into cache_dir, read from there;
    the same batches as DALI's reader of the plain shards."""
    import gzip
    gz = []
    for p in shards:
        dest = tmp_path / (os.path.basename(p) + ".gz")
        dest.write_bytes(gzip.compress(open(p, "rb").read()))
        gz.append(str(dest))
    theirs = make_pipe(lambda: fn.readers.webdataset(paths=shards, ext=EXT), 8)
    ours = make_pipe(lambda: webdataset(paths=gz, ext=EXT, native=True,
                                        cache_dir=str(tmp_path / "cache")), 8)
    assert batches(ours, 6) == batches(theirs, 6)
    assert len(list((tmp_path / "cache").glob("*.tar"))) == 3


def test_a_component_no_sample_has(shards):
    """An output every sample lacks: empty tensors, as DALI's reader gives."""
    ext = ["jpg", "txt", "cls"]
    theirs = make_pipe(lambda: fn.readers.webdataset(paths=shards, ext=ext), 6)
    ours = make_pipe(lambda: webdataset(paths=shards, ext=ext, native=True), 6)
    got = batches(ours, 7, k=3)
    assert got == batches(theirs, 7, k=3)
    assert all(c == b"" for b in got for c in b[1])


def test_single_output_and_alternatives(shards):
    theirs = make_pipe(lambda: fn.readers.webdataset(paths=shards, ext=["cls;jpg"]), 7)
    ours = make_pipe(lambda: webdataset(paths=shards, ext=["cls;jpg"], native=True), 7)
    assert batches(ours, 6, k=1) == batches(theirs, 6, k=1)


def test_generated_shards_match_dali(tmp_path):
    """`fastread make-dataset --format webdataset` shards, batch 16: every
    batch as fn.readers.webdataset's."""
    make_webdataset(tmp_path, shards=3, per_shard=20, width=16, height=12, seed=3)
    paths = sorted(glob.glob(str(tmp_path / "*.tar")))
    ext = ["jpg;jpeg;png", "cls"]
    theirs = make_pipe(lambda: fn.readers.webdataset(paths=paths, ext=ext), 16)
    ours = make_pipe(lambda: webdataset(paths=paths, ext=ext, native=True), 16)
    assert batches(ours, 10) == batches(theirs, 10)


def expected_samples(paths, ext):
    src = WebDataset(paths, ext, grouping="dali")
    arrays = src.read(np.arange(len(src)))
    return [[a.tobytes() for a in comp] for comp in src.components(arrays, np.arange(len(src)))]


def test_shuffle_is_a_permutation_per_epoch(shards):
    """random_shuffle: every epoch holds every sample once (outputs from
    several shards per batch: per-sample views), the same seed gives the
    same order, and epochs differ."""
    want = expected_samples(shards, EXT)
    n = len(want[0])
    pairs = sorted(zip(*want))

    def epochs(seed):
        p = make_pipe(lambda: webdataset(paths=shards, ext=EXT, native=True,
                                         random_shuffle=True, seed=seed, pad_last_batch=False),
                      n)
        return [list(zip(*b)) for b in batches(p, 3)]

    a, b = epochs(5), epochs(5)
    assert a == b
    for epoch in a:
        assert sorted(epoch) == pairs
    assert a[0] != a[1] and a[0] != list(zip(*want))


@pytest.mark.parametrize("kw", [dict(), dict(num_shards=2, shard_id=1, pad_last_batch=True),
                                dict(num_shards=3, shard_id=0, stick_to_shard=True)],
                         ids=case_id)
def test_initial_fill_is_a_buffer_shuffle_on_both_paths(shards, kw):
    """initial_fill=N (DALI's argument): the shard's samples in order through
    a shuffle buffer of N, the order fastread.index.epoch_indices gives
    (fr_buffer_shuffle), the same batches from the operator and the external
    source, epoch after epoch; every epoch a permutation of the shard."""
    from fastread.index import epoch_indices

    want = expected_samples(shards, EXT)
    n = len(want[0])
    fill, batch, seed = 5, 4, 7
    num_shards, shard_id = kw.get("num_shards", 1), kw.get("shard_id", 0)

    def run(native):
        p = make_pipe(lambda: webdataset(paths=shards, ext=EXT, native=native, random_shuffle=True,
                                         seed=seed, initial_fill=fill, **kw), batch)
        return batches(p, 3 * -(-n // num_shards) // batch + 2)

    got = run(True)
    assert got == run(False)
    expected = []
    for epoch in range(6):
        shard = shard_id if kw.get("stick_to_shard") else (shard_id + epoch) % num_shards
        expected.extend(epoch_indices(n, shard_id=shard, num_shards=num_shards, shuffle=True,
                                      seed=seed, epoch=epoch, shuffle_buffer=fill,
                                      pad_last_batch=kw.get("pad_last_batch", False),
                                      batch_size=batch).tolist())
    flat = [pair for b in got for pair in zip(*b)]
    assert flat == [(want[0][i], want[1][i]) for i in expected[:len(flat)]]
    # Neighbouring samples: item k never comes out before position k - fill + 1.
    first_epoch = epoch_indices(n, shard_id=shard_id, num_shards=num_shards, shuffle=True,
                                seed=seed, epoch=0, shuffle_buffer=fill)
    start = first_epoch.min()
    assert all(k - start < pos + fill for pos, k in enumerate(first_epoch))
    assert list(first_epoch) != sorted(first_epoch)


def test_initial_fill_refuses_bad_values(shards):
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="initial_fill"):
            make_pipe(lambda: webdataset(paths=shards, ext=EXT, random_shuffle=True,
                                         initial_fill=bad), 2)


def test_checkpoint_resumes_the_stream(shards):
    def pipe(**kw):
        return make_pipe(lambda: webdataset(paths=shards, ext=EXT, native=True, name="R",
                                            random_shuffle=True, seed=3), 4,
                         enable_checkpointing=True, **kw)

    first = pipe()
    batches(first, 5)
    cpt = first.checkpoint()
    rest = batches(first, 12)
    resumed = pipe(checkpoint=cpt)
    assert batches(resumed, 12) == rest


def test_truncated_shard_fails_the_run_naming_it(shards, tmp_path):
    """A shard cut after the pipeline was built: pipe.run() raises naming
    the shard, the sample and the byte offset; before the build, building
    raises naming it."""
    victim = tmp_path / "victim.tar"
    victim.write_bytes(open(shards[2], "rb").read())
    paths = [shards[0], str(victim)]
    p = make_pipe(lambda: webdataset(paths=paths, ext=EXT, native=True, prefetch_queue_depth=1),
                  3)
    size = victim.stat().st_size
    os.truncate(victim, size // 2)
    with pytest.raises(RuntimeError, match=r"shard '.*victim\.tar' at byte \d+: cannot read "
                                           r"component '(jpg|cls)' of sample 's2/k\d+'"):
        for _ in range(20):
            p.run()
    del p

    victim.write_bytes(open(shards[2], "rb").read())

    @pipeline_def(batch_size=3, num_threads=2, device_id=None)
    def changed():
        return tuple(webdataset(paths=paths, ext=EXT, native=True))
    q = changed()
    os.truncate(victim, victim.stat().st_size - 512)
    with pytest.raises(RuntimeError, match=r"shard '.*victim\.tar' is \d+ bytes but was \d+ "
                                           r"when indexed"):
        q.build()


def test_deleted_shard_fails_the_run_naming_it(shards, tmp_path):
    gone = tmp_path / "gone.tar"
    gone.write_bytes(open(shards[1], "rb").read())
    p = make_pipe(lambda: webdataset(paths=[shards[0], str(gone)], ext=EXT, native=True), 4)
    gone.unlink()
    with pytest.raises(RuntimeError, match=r"shard '.*gone\.tar' at byte \d+: cannot read "
                                           r"component 'jpg' of sample 's1/k\d+' \(\d+ bytes\): "
                                           r"No such file or directory"):
        for _ in range(20):
            p.run()


def test_bad_index_file_is_named(tmp_path, shards):
    bad = tmp_path / "bad.index"
    bad.write_bytes(b"FRWDSIX1" + b"\0" * 100)
    with pytest.raises(RuntimeError, match=r"index file '.*bad\.index'"):
        make_pipe(lambda: fn.fastread.readers.webdataset(index=str(bad), ext=EXT), 2)
    good = WebDataset(shards, EXT, grouping="dali").native_index()
    flipped = bytearray(good)
    flipped[60] ^= 1
    bad.write_bytes(bytes(flipped))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        make_pipe(lambda: fn.fastread.readers.webdataset(index=str(bad), ext=EXT), 2)
    bad.write_bytes(good)
    with pytest.raises(RuntimeError, match="2 components per sample, ext= names 3"):
        make_pipe(lambda: fn.fastread.readers.webdataset(index=str(bad), ext=EXT + ["x"]), 2)


def test_index_file_lives_as_long_as_the_pipeline(shards, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    p = make_pipe(lambda: webdataset(paths=shards, ext=EXT, native=True), 4)
    assert len(list(tmp_path.glob("fastread-wds-*.index"))) == 1
    p.run()
    del p
    gc.collect()
    assert list(tmp_path.glob("fastread-wds-*.index")) == []


def test_native_true_refuses_what_it_cannot_serve(shards):
    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def stop():
        return tuple(webdataset(paths=shards, ext=EXT, native=True, epoch_end="stop"))
    with pytest.raises(ValueError, match="epoch_end='stop' needs the external source"):
        stop()

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def direct():
        return tuple(webdataset(paths=shards, ext=EXT, native=True, o_direct=True))
    with pytest.raises(ValueError, match="does not take o_direct"):
        direct()


def test_external_source_when_the_plugin_is_off(shards):
    """FASTREAD_DALI_PLUGIN=0: native=None reads through the external source
    (the same samples), native=True raises with the reason."""
    code = textwrap.dedent(f"""
        import numpy as np
        from nvidia.dali import fn, pipeline_def
        from fastread.dali.formats import webdataset
        paths = {shards!r}

        @pipeline_def(batch_size=5, num_threads=1, device_id=None)
        def auto():
            return tuple(webdataset(paths=paths, ext=["jpg", "cls"]))
        p = auto()
        p.build()
        out = p.run()
        print("first", np.array(out[0][0]).tobytes()[:2].hex(), len(out[0]))
        try:
            @pipeline_def(batch_size=5, num_threads=1, device_id=None)
            def forced():
                return tuple(webdataset(paths=paths, ext=["jpg", "cls"], native=True))
            forced()
        except RuntimeError as e:
            print("refused", e)
    """)
    env = dict(os.environ, FASTREAD_DALI_PLUGIN="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "first 0000 5" in r.stdout
    assert ("refused fastread.dali.readers.webdataset(native=True) needs fastread's DALI "
            "plugin: disabled by FASTREAD_DALI_PLUGIN=0") in r.stdout


def test_pin_device_without_a_gpu_reads_pageable(shards, tmp_path, capfd):
    """pin_device where the driver cannot page-lock (no GPU here): a
    warning, then the same samples from pageable memory."""
    from fastread._core import gpu_probe

    if gpu_probe(0)[0]:
        pytest.skip("a CUDA device is present: pin_device page-locks here")
    index = str(tmp_path / "wds.index")
    WebDataset(shards, EXT, grouping="dali").write_native_index(index)
    p = make_pipe(lambda: fn.fastread.readers.webdataset(index=index, ext=EXT, pin_device=0), 5)
    assert "cannot page-lock its buffers on device 0" in capfd.readouterr().err
    theirs = make_pipe(lambda: fn.readers.webdataset(paths=shards, ext=EXT), 5)
    assert batches(p, 4) == batches(theirs, 4)


@pytest.fixture(scope="module")
def good_index(shards):
    return WebDataset(shards, EXT, grouping="dali").native_index()


def test_fuzzed_index_files_are_refused_by_name(shards, good_index, tmp_path_factory):
    """Index files cut short or with a byte changed: building the operator
    raises naming the file, never crashes or reads out of bounds (the parser
    checks counts against the size before allocating, then the CRC)."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    path = str(tmp_path_factory.mktemp("fuzz") / "f.index")
    size = len(good_index)

    @settings(max_examples=60, deadline=None,
              suppress_health_check=list(hypothesis.HealthCheck))
    @given(cut=st.integers(0, size), flip_at=st.integers(0, size - 1),
           flip=st.integers(1, 255))
    def check(cut, flip_at, flip):
        data = bytearray(good_index)
        data[flip_at] ^= flip
        data = bytes(data[:cut]) if cut < size else bytes(data)
        with open(path, "wb") as f:
            f.write(data)
        if cut == size and flip_at >= size - 4:
            return  # the trailing pad bytes are not checked
        with pytest.raises(RuntimeError, match=r"index file '.*f\.index'"):
            make_pipe(lambda: fn.fastread.readers.webdataset(index=path, ext=EXT), 2)

    check()


def test_more_shards_than_samples_is_refused(shards):
    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return tuple(webdataset(paths=shards[:1], ext=EXT, native=True, num_shards=10,
                                missing_component_behavior="skip"))
    with pytest.raises(ValueError, match=r"6 samples \(after missing_component_behavior="
                                         r"'skip'\) cannot make 10 shards"):
        pipe()


def test_shuffled_batches_over_many_shards_grow_one_arena(tmp_path):
    """A shuffled batch reads every shard it touches into one arena, one
    read after another: components of ~1 MB make the arena grow (and move)
    between reads, and every byte still comes back right."""
    rng = np.random.default_rng(2)
    paths = []
    for s in range(12):
        members = []
        for i in range(3):
            members.append((f"s{s}/k{i}.jpg", bytes([s, i]) + rng.bytes(int(rng.integers(1, 1 << 20)))))
            members.append((f"s{s}/k{i}.cls", f"{s}-{i}".encode()))
        paths.append(write_tar(tmp_path / f"big-{s:02d}.tar", members))
    want = sorted(zip(*expected_samples(paths, EXT)))
    p = make_pipe(lambda: webdataset(paths=paths, ext=EXT, native=True, random_shuffle=True,
                                     seed=1), 9)
    got = []
    for b in batches(p, 8):   # two epochs of 36
        got += list(zip(*b))
    assert sorted(got[:36]) == want and sorted(got[36:]) == want


def test_checkpoint_refuses_another_shuffle_buffer(shards):
    # The shuffle buffer decides the order: a checkpoint of one fill resumed
    # with another would continue a different stream.
    def pipe(fill, **kw):
        return make_pipe(lambda: webdataset(paths=shards, ext=EXT, native=True, name="R",
                                            random_shuffle=True, seed=3, initial_fill=fill), 4,
                         enable_checkpointing=True, **kw)

    first = pipe(8)
    batches(first, 2)
    cpt = first.checkpoint()
    with pytest.raises(Exception, match="saved by a reader with initial_fill=8, this reader "
                                        "has initial_fill=16"):
        pipe(16, checkpoint=cpt)

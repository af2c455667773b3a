"""fastread.dali.readers.file(file_root="s3://bucket/prefix") against DALI's
own fn.readers.file on the same bucket of a real S3 server (SeaweedFS,
tests/s3_server.py), and against readers.file of the local tree the bucket
was uploaded from: the same bytes, labels, shards and rolling epochs,
through both paths (the native operator and the external source), with the
bucket reached by S3 options or by the AWS environment DALI itself reads.
No mocks: every read is an HTTP request to the server."""
import hashlib
import os

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")
from nvidia.dali import fn, pipeline_def  # noqa: E402

import fastread  # noqa: E402
from fastread.dali import _plugin, readers  # noqa: E402

pytestmark = pytest.mark.usefixtures("s3_engine")

PATHS = [pytest.param(False, id="external"),
         pytest.param(True, id="native", marks=pytest.mark.skipif(
             not _plugin.load(), reason=f"fastread's DALI plugin: {_plugin.reason()}"))]

BUCKET = "dali-s3"
PREFIX = "train"
COUNTS = (7, 11, 5, 9)   # 32 samples: shards and batches of unequal sizes


def opts(srv):
    return fastread.S3Options(endpoint_url=srv.endpoint, region=srv.region,
                              access_key_id=srv.access_key, secret_access_key=srv.secret_key)


@pytest.fixture(scope="module")
def tree(disk_tmp, s3_server):
    """A class tree (random sizes, one file that no filter takes and a
    nested directory, both skipped by fn.readers.file) on disk and uploaded
    to s3://dali-s3/train/. (local root, s3 root)."""
    root = os.path.join(disk_tmp, "s3-dali-tree")
    rng = np.random.default_rng(11)
    for c, n in enumerate(COUNTS):
        d = os.path.join(root, f"class_{c}")
        os.makedirs(d)
        for j in range(n):
            data = f"{c}/{j}:".encode() + rng.integers(
                0, 256, int(rng.integers(0, 40000)), dtype=np.uint8).tobytes()
            with open(os.path.join(d, f"img{j:02d}.jpg"), "wb") as f:
                f.write(data)
    with open(os.path.join(root, "class_1", "notes.txt"), "wb") as f:
        f.write(b"not a sample")
    os.makedirs(os.path.join(root, "class_2", "deeper"))
    with open(os.path.join(root, "class_2", "deeper", "x.jpg"), "wb") as f:
        f.write(b"nested: not a sample")
    s3_server.upload_tree(root, BUCKET, PREFIX)
    return root, f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture
def aws_env(s3_server, monkeypatch):
    """The AWS environment DALI's own s3:// support reads (and the s3
    engine too, when no option is given)."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def no_aws_env(monkeypatch):
    """No AWS variable, config or credentials file: only what a test passes
    reaches the bucket."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


def digest(data):
    """A sample as (its first bytes, size, sha1): short in a failed assert."""
    return (data[:8], len(data), hashlib.sha1(data).hexdigest()[:16])


def run(reader_fn, batch_size, iterations, raw=False):
    """[(digest, label)] of every sample of `iterations` batches (bytes for raw)."""
    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None)
    def pipe():
        return tuple(reader_fn())

    p = pipe()
    p.build()
    out = []
    for _ in range(iterations):
        data, labels = p.run()
        out.append([((bytes if raw else lambda b: digest(bytes(b)))(np.asarray(data.at(i))),
                      int(np.asarray(labels.at(i))[0])) for i in range(len(data))])
    return out


def local_samples(root):
    """{(class, bytes)} of the local tree, as fn.readers.file sees it."""
    out = []
    for c in range(len(COUNTS)):
        d = os.path.join(root, f"class_{c}")
        for name in sorted(os.listdir(d)):
            if name.endswith(".jpg"):
                with open(os.path.join(d, name), "rb") as f:
                    out.append((digest(f.read()), c))
    return out


CASES = [dict(), dict(num_shards=3, shard_id=1), dict(num_shards=3, shard_id=2,
                                                       pad_last_batch=True),
         dict(num_shards=4, shard_id=0, stick_to_shard=True)]


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items())
                         or "plain")
def test_same_batches_as_dalis_own_s3_reader(tree, aws_env, native, kw):
    """Batch for batch over several rolled epochs (shards moving on each
    epoch unless stick_to_shard): fastread's reader from the bucket equals
    DALI's own from the bucket, and both readers' from the local tree."""
    local, url = tree
    batch, iters = 5, 20   # 100 samples: three epochs and more of every shard
    ours = run(lambda: readers.file(file_root=url, native=native, **kw), batch, iters)
    assert ours == run(lambda: fn.readers.file(file_root=local, **kw), batch, iters)
    assert ours == run(lambda: readers.file(file_root=local, native=native, **kw), batch, iters)
    theirs = run(lambda: fn.readers.file(file_root=url, **kw), batch, iters)
    if kw.get("pad_last_batch"):
        # DALI 2.4's s3 reader pads the first epoch right, then hands out a
        # zero-filled sample of a wrong size where later epochs repeat the
        # shard's last one (its local reader does not): equal up to there.
        shard = -(-sum(COUNTS) // kw["num_shards"])
        first_epoch = -(-shard // batch)
        assert ours[:first_epoch] == theirs[:first_epoch]
    else:
        assert ours == theirs
    # Real samples of the tree, every one of them over an epoch of shards.
    if not kw:
        seen = {s for b in ours for s in b}
        assert seen == set(local_samples(local))


@pytest.mark.parametrize("native", PATHS)
def test_options_instead_of_the_environment(tree, s3_server, no_aws_env, native):
    """No AWS variable set: S3 options as s3= or as flat keywords reach the
    bucket for the listing and the reads, on either path."""
    local, url = tree
    want = run(lambda: readers.file(file_root=local, native=native), 8, 5)
    o = opts(s3_server)
    assert run(lambda: readers.file(file_root=url, native=native, s3=o), 8, 5) == want
    flat = o.given()
    assert run(lambda: readers.file(file_root=url, native=native, **flat), 8, 5) == want
    # Without options or environment nothing reaches the bucket.
    with pytest.raises(Exception) as e:
        run(lambda: readers.file(file_root=url, native=native), 8, 1)
    assert url in str(e.value) or "dali-s3" in str(e.value)


@pytest.mark.skipif(not _plugin.load(), reason=f"fastread's DALI plugin: {_plugin.reason()}")
def test_explicit_credentials_stay_out_of_serialized_pipelines(tree, s3_server, no_aws_env):
    """DALI writes operator arguments into pipe.serialize(): explicit S3
    credentials reach the native operator by a reference kept in this
    process, so the serialized pipeline holds no secret, the pipeline reads
    as before, and an operator given a reference this process never
    registered fails naming why."""
    local, url = tree
    o = opts(s3_server)

    @pipeline_def(batch_size=8, num_threads=2, device_id=None)
    def pipe():
        return tuple(readers.file(file_root=url, native=True, s3=o))

    p = pipe()
    p.build()
    ser = p.serialize()
    assert s3_server.secret_key.encode() not in ser
    assert b"fastread_engine_args_ref=" in ser
    want = run(lambda: readers.file(file_root=local, native=True), 8, 3)
    got = []
    for _ in range(3):
        data, labels = p.run()
        got.append([(digest(bytes(np.asarray(data.at(i)))), int(np.asarray(labels.at(i))[0]))
                    for i in range(len(data))])
    assert got == want
    # Options with no secret stay inline (a pipeline then serializes whole).
    from fastread.dali._native import _secrets_by_reference
    assert _secrets_by_reference("region=us-east-1,threads=2") == "region=us-east-1,threads=2"
    with pytest.raises(Exception, match="credentials that this process never registered"):
        run(lambda: fn.fastread.readers.file(
            files=[url + "/class_0/img00.jpg"], engine="s3",
            engine_args="fastread_engine_args_ref=0123abcd"), 1, 1, raw=True)


@pytest.mark.parametrize("native", PATHS)
def test_shuffled_epochs_equal_to_the_local_tree(tree, aws_env, native):
    """A seeded shuffle draws the same permutation for the bucket as for the
    directory it came from (fastread's own shuffle, identical on every path)."""
    local, url = tree
    kw = dict(random_shuffle=True, seed=5, num_shards=2, shard_id=1)
    ours = run(lambda: readers.file(file_root=url, native=native, **kw), 4, 12)
    assert ours == run(lambda: readers.file(file_root=local, native=native, **kw), 4, 12)


@pytest.mark.parametrize("native", PATHS)
def test_files_list_of_urls(tree, aws_env, native):
    """files= of s3:// URLs with labels, as DALI takes them."""
    local, url = tree
    files = [f"{url}/class_3/img{j:02d}.jpg" for j in (4, 0, 8)]
    got = run(lambda: readers.file(files=files, labels=[7, 8, 9], native=native), 3, 1,
              raw=True)[0]
    want = run(lambda: fn.readers.file(files=files, labels=[7, 8, 9]), 3, 1, raw=True)[0]
    assert got == want
    with open(os.path.join(local, "class_3", "img04.jpg"), "rb") as f:
        assert got[0] == (f.read(), 7)


def test_local_semantics_where_dalis_s3_listing_differs(disk_tmp, s3_server, aws_env):
    """Where DALI 2.4's s3:// discovery departs from its own local one,
    fastread keeps the local semantics (issue 30: s3:// as a path, same
    semantics): classes sorted by name, not taken in listing order (AWS
    lists keys in byte order: 'a-b/...' before 'a/...' since '-' < '/';
    SeaweedFS lists by directory, so here only the sort shows), and an object right
    under the root is no sample (DALI's s3 listing makes it one, with a
    class of its own). So the bucket reads as its local tree does with
    DALI's own local reader."""
    root = os.path.join(disk_tmp, "s3-dali-quirks")
    for cls, names in (("a", ["1.jpg", "2.jpg"]), ("a-b", ["1.jpg"]), ("a.c", ["9.jpg"])):
        os.makedirs(os.path.join(root, cls))
        for n in names:
            with open(os.path.join(root, cls, n), "wb") as f:
                f.write(f"{cls}/{n}".encode())
    with open(os.path.join(root, "top.jpg"), "wb") as f:
        f.write(b"right under the root")
    s3_server.upload_tree(root, "dali-quirks", "q")
    want = run(lambda: fn.readers.file(file_root=root), 4, 3, raw=True)
    assert [s for s, _ in want[0]] == [b"a/1.jpg", b"a/2.jpg", b"a-b/1.jpg", b"a.c/9.jpg"]
    for native in (False,) + ((True,) if _plugin.load() else ()):
        assert run(lambda: readers.file(file_root="s3://dali-quirks/q", native=native),
                   4, 3, raw=True) == want


def test_bad_root_names_the_url_and_no_secret(tree, s3_server):
    """A bucket that does not exist and a wrong secret: the error names the
    URL (or bucket), never the secret."""
    o = opts(s3_server)
    with pytest.raises(OSError) as e:
        readers.file(file_root="s3://no-such-bucket-here/x", s3=o)
    assert "s3://no-such-bucket-here/x" in str(e.value)
    assert s3_server.secret_key not in str(e.value)
    wrong = fastread.S3Options.coerce(o, secret_access_key="wrong-secret-value-123")
    with pytest.raises(OSError) as e:
        readers.file(file_root=tree[1], s3=wrong)
    assert tree[1] in str(e.value)
    assert "wrong-secret-value-123" not in str(e.value)
    assert "AccessDenied" in str(e.value) or "SignatureDoesNotMatch" in str(e.value) or \
        "403" in str(e.value)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("via", ["env", "options"])
def test_object_gone_after_listing_names_it(tree, s3_server, monkeypatch, native, via):
    """An object listed and then deleted fails its batch with an error that
    names its URL and no secret (the operator gets explicit options in its
    engine_args: they must not show in DALI's message either)."""
    s3_server.make_bucket("dali-gone")
    for j in range(4):
        s3_server.put("dali-gone", f"p/c/{j}.jpg", b"x" * (j + 1))
    extra = {}
    if via == "env":
        for k, v in s3_server.env().items():
            monkeypatch.setenv(k, v)
    else:
        extra = {"s3": opts(s3_server)}

    @pipeline_def(batch_size=4, num_threads=2, device_id=None)
    def pipe():
        return readers.file(file_root="s3://dali-gone/p", native=native, **extra)

    p = pipe()   # listed here
    s3_server.client().delete_object(Bucket="dali-gone", Key="p/c/2.jpg")
    with pytest.raises(Exception) as e:
        p.build()
        p.run()
    assert "s3://dali-gone/p/c/2.jpg" in str(e.value)
    assert s3_server.secret_key not in str(e.value)

"""``fastread upload`` and ``fastread make-dataset --upload`` (and
fastread.s3.upload under them) against a real S3 server (SeaweedFS,
tests/s3_server.py): a generated class tree, a packed image with its index
and WebDataset shards put into a bucket read back exactly as the local
files; errors name the URL or path, never a secret."""
import os

import numpy as np
import pytest

import fastread
from fastread.cli import main

pytestmark = pytest.mark.usefixtures("s3_engine")

BUCKET = "upload-s3"


@pytest.fixture
def creds(s3_server, monkeypatch):
    """Credentials and region from the environment, as the CLI wants them;
    the endpoint only where a test passes --endpoint-url."""
    env = s3_server.env()
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    s3_server.make_bucket(BUCKET)
    return ["--endpoint-url", s3_server.endpoint]


def opts(srv):
    return fastread.S3Options(endpoint_url=srv.endpoint)


def test_make_dataset_upload_reads_back_as_the_tree(tmp_path, s3_server, creds, capsys):
    root = tmp_path / "jpeg"
    rc = main(["make-dataset", str(root), "--classes", "3", "--per-class", "5", "--mean-kb", "2",
               "--width", "40", "--height", "30", "--workers", "1", "--quiet",
               "--upload", f"s3://{BUCKET}/sets/jpeg", "--upload-workers", "4"] + creds)
    assert rc == 0
    out = capsys.readouterr().out
    assert f"s3://{BUCKET}/sets/jpeg: 16 objects" in out   # 15 JPEGs and the marker
    local, labels = fastread.scan(str(root))
    urls, url_labels = fastread.scan(f"s3://{BUCKET}/sets/jpeg", s3=opts(s3_server))
    assert [u.split("/sets/jpeg/", 1)[1] for u in urls] == \
        [os.path.relpath(p, root) for p in local]
    np.testing.assert_array_equal(labels, url_labels)
    got = fastread.read_files(urls, s3=opts(s3_server))
    assert [a.tobytes() for a in got] == [open(p, "rb").read() for p in local]


def test_upload_packed_image_and_shards(tmp_path, s3_server, creds, capsys):
    tree = tmp_path / "tree"
    for c in range(2):
        (tree / f"c{c}").mkdir(parents=True)
        for j in range(6):
            (tree / f"c{c}" / f"{j}.jpg").write_bytes(os.urandom(100 + 700 * j))
    img = fastread.pack(str(tree), str(tmp_path / "train.img"), progress=False)
    assert main(["upload", img.path, img.index_path, f"s3://{BUCKET}/img/", "--quiet"]
                + creds) == 0
    remote = fastread.PackedImage(f"s3://{BUCKET}/img/train.img", s3=opts(s3_server))
    idx = list(range(len(img)))
    assert [a.tobytes() for a in remote.read(idx)] == [a.tobytes() for a in img.read(idx)]

    from fastread.formats import WebDataset
    wds = tmp_path / "wds"
    assert main(["make-dataset", str(wds), "--format", "webdataset", "--shards", "3",
                 "--per-shard", "7", "--width", "32", "--height", "24", "--quiet",
                 "--upload", f"s3://{BUCKET}/wds"] + creds) == 0
    shards = sorted(p for p in os.listdir(wds) if p.endswith(".tar"))
    local = WebDataset([str(wds / p) for p in shards], ["jpg", "cls"])
    ours = WebDataset([f"s3://{BUCKET}/wds/{p}" for p in shards], ["jpg", "cls"],
                      s3=opts(s3_server))
    r = fastread.Reader(source=ours, batch_size=len(ours))
    w = fastread.Reader(source=local, batch_size=len(local))
    assert [a.tobytes() for a in next(iter(r))[0]] == [a.tobytes() for a in next(iter(w))[0]]


def test_single_file_to_a_key_and_progress(tmp_path, s3_server, creds, capsys):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"abc" * 1000)
    done = fastread.s3.upload(str(f), f"s3://{BUCKET}/one/renamed.bin", progress=True,
                              endpoint_url=s3_server.endpoint)
    assert done == [(f"s3://{BUCKET}/one/renamed.bin", 3000)]
    assert "upload to" in capsys.readouterr().err   # the tqdm bar
    assert fastread.read_files([done[0][0]], s3=opts(s3_server))[0].tobytes() == b"abc" * 1000


def test_files_in_memory_at_once_stay_within_the_budget(tmp_path, s3_server, creds,
                                                        monkeypatch):
    """upload() reads each file whole: with 8 workers, at most
    UPLOAD_BUFFER_BYTES of them at once, a larger file alone; every byte
    arrives."""
    import threading

    from fastread import s3 as s3mod

    monkeypatch.setattr(s3mod, "UPLOAD_BUFFER_BYTES", 3 * 10_000)
    peak, lock = [0], threading.Lock()
    take = s3mod._ByteBudget.take

    def watched(self, n):
        take(self, n)
        with lock:   # held: what all workers hold now, this file included
            peak[0] = max(peak[0], self.held)
            if n > self.limit:
                assert self.held == n, "a file over the budget went with others"
            else:
                assert self.held <= self.limit

    monkeypatch.setattr(s3mod._ByteBudget, "take", watched)
    root = tmp_path / "many"
    root.mkdir()
    sizes = [10_000] * 12 + [50_000]
    for i, n in enumerate(sizes):
        (root / f"f{i:02d}.bin").write_bytes(bytes([i]) * n)
    done = s3mod.upload(str(root), f"s3://{BUCKET}/budget/", workers=8, progress=False,
                        endpoint_url=s3_server.endpoint)
    assert sorted(n for _, n in done) == sorted(sizes)
    assert peak[0] == 50_000
    got = fastread.read_files([u for u, _ in done], s3=opts(s3_server))
    assert [a.tobytes() for a in got] == [bytes([i]) * n for i, n in enumerate(sizes)]


def test_errors_name_the_url_and_no_secret(tmp_path, s3_server, creds, capsys, monkeypatch):
    f = tmp_path / "x.bin"
    f.write_bytes(b"x")
    # A bucket S3 refuses (SeaweedFS makes a missing bucket on a PUT, but
    # refuses names shorter than 3 characters).
    assert main(["upload", str(f), "s3://ab/p/", "--quiet"] + creds) == 1
    err = capsys.readouterr().err
    assert "s3://ab/p/x.bin" in err and "InvalidBucketName" in err
    assert s3_server.secret_key not in err
    assert main(["upload", str(tmp_path / "missing"), f"s3://{BUCKET}/p/", "--quiet"]
                + creds) == 1
    assert str(tmp_path / "missing") in capsys.readouterr().err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-upload")
    assert main(["upload", str(f), f"s3://{BUCKET}/p/", "--quiet"] + creds) == 1
    err = capsys.readouterr().err
    assert f"s3://{BUCKET}/p/x.bin" in err and "wrong-secret-upload" not in err
    with pytest.raises(SystemExit) as e:
        main(["upload", str(f), "/local/dir"])
    assert e.value.code == 2
    assert "s3:// URL" in capsys.readouterr().err


def test_nul_in_a_url_is_refused_not_truncated(s3_server):
    """C ends a string at a NUL: an upload to "real.bin\\0.backup" would
    overwrite real.bin. Every way in refuses it, naming the URL."""
    from fastread import s3 as fs3
    from fastread import _s3
    bucket = s3_server.make_bucket("nul")
    url = s3_server.put(bucket, "real.bin", b"REAL")
    o = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key)
    for bad in (f"s3://{bucket}/real.bin\0.backup", f"s3://{bucket}\0x/real.bin"):
        with pytest.raises(ValueError, match="NUL") as e:
            fs3.put_object(bad, b"OVERWRITTEN", o)
        assert repr(bad) in str(e.value)
        with pytest.raises(ValueError, match="NUL"):
            fs3.list_objects(bad, o)
        with pytest.raises(ValueError, match="NUL"):
            fastread.read_files([bad], s3=o)
    client = _s3.Client(fastread.EngineOptions(s3=o).resolve("s3")["engine_args"])
    try:
        for kw in ({"key": "real.bin\0.backup"}, {"bucket": bucket + "\0"},
                   {"query": "x=1\0"}, {"method": "PUT\0"}):
            args = {"method": "PUT", "bucket": bucket, "key": "real.bin", "query": ""} | kw
            with pytest.raises(ValueError, match="NUL") as e:
                client.request(args["method"], args["bucket"], args["key"], args["query"],
                               b"OVERWRITTEN")
            assert "s3://" in str(e.value)
    finally:
        client.close()
    assert fastread.read_files([url], s3=o)[0].tobytes() == b"REAL"

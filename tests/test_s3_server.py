"""The S3 test server itself (tests/s3_server.py): real SeaweedFS, signatures
checked, helpers that upload what they say, restart keeping the data. These
need no fastread S3 engine: the client is boto3."""

import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

botocore = pytest.importorskip("botocore")


def test_signed_round_trip_and_wrong_secret_refused(s3_server):
    s3_server.make_bucket("srv-auth")
    url = s3_server.put("srv-auth", "dir/a.bin", b"\x00\x01payload")
    assert url == "s3://srv-auth/dir/a.bin"
    got = s3_server.client().get_object(Bucket="srv-auth", Key="dir/a.bin")["Body"].read()
    assert got == b"\x00\x01payload"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3_server.client(secret_key="not-the-secret").get_object(Bucket="srv-auth", Key="dir/a.bin")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    # Unsigned (anonymous) requests are refused too: the server checks SigV4.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{s3_server.endpoint}/srv-auth/dir/a.bin", timeout=10)
    assert e.value.code == 403


def test_upload_tree_puts_every_file_under_the_prefix(s3_server, tmp_path):
    sizes = {"c0/a.jpg": 0, "c0/b.jpg": 1, "c1/deep/c.jpg": 100_000}
    for rel, size in sizes.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes(i % 251 for i in range(size)))
    (tmp_path / ".fastread-dataset.json").write_text("{}")   # bookkeeping, not a sample
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x").write_text("x")
    done = s3_server.upload_tree(str(tmp_path), "srv-tree", "pre/fix")
    assert done == {f"s3://srv-tree/pre/fix/{rel}": size for rel, size in sorted(sizes.items())}
    listed = s3_server.client().list_objects_v2(Bucket="srv-tree", Prefix="pre/fix/")
    assert {o["Key"]: o["Size"] for o in listed["Contents"]} == \
        {f"pre/fix/{rel}": size for rel, size in sizes.items()}
    body = s3_server.client().get_object(Bucket="srv-tree", Key="pre/fix/c1/deep/c.jpg")["Body"].read()
    assert body == (tmp_path / "c1/deep/c.jpg").read_bytes()


def test_env_points_a_fresh_process_at_the_server(s3_server):
    """env() alone (no arguments in code) is enough for an AWS SDK."""
    s3_server.put(s3_server.make_bucket("srv-env"), "k", b"from-env")
    script = ("import boto3; from botocore.config import Config; "
              "c = boto3.client('s3', config=Config(s3={'addressing_style': 'path'})); "
              "print(c.get_object(Bucket='srv-env', Key='k')['Body'].read().decode())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3_server.env())
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "from-env"


def test_kill_then_restart_keeps_endpoint_and_objects(s3_server):
    s3_server.put(s3_server.make_bucket("srv-restart"), "k", b"survives")
    endpoint = s3_server.endpoint
    try:
        s3_server.kill()
        with pytest.raises(OSError):
            urllib.request.urlopen(endpoint + "/", timeout=5)
    finally:
        s3_server.restart()
    assert s3_server.endpoint == endpoint
    got = s3_server.client().get_object(Bucket="srv-restart", Key="k")["Body"].read()
    assert got == b"survives"


def test_empty_put_leaves_the_connection_usable(s3_server):
    """An empty PUT with boto3's Expect: 100-continue put the pooled
    connection out of step with SeaweedFS: the next request waited its 60 s
    read timeout. The fixture's client drops Expect on empty bodies."""
    import time
    bucket = s3_server.make_bucket("srv-empty")
    t0 = time.perf_counter()
    for i, data in enumerate([b"", b"\x01", b"", b"", b"abc"]):
        s3_server.put(bucket, f"k/{i}", data)
        assert s3_server.client().get_object(Bucket=bucket, Key=f"k/{i}")["Body"].read() == data
    assert time.perf_counter() - t0 < 10

"""The fault-injecting proxy (tests/s3_proxy.py) in front of the real S3
server, checked with boto3 and urllib alone: what the S3 engine's tests rely
on it to do, it does."""

import http.client
import threading
import time
import urllib.error
import urllib.request

import pytest

botocore = pytest.importorskip("botocore")
from botocore.exceptions import ClientError  # noqa: E402

SIZES = [0, 1, 4096, 100_000, (3 << 20) + 17]


def payload(size, seed=0):
    return bytes((i * 31 + seed) % 251 for i in range(size))


@pytest.fixture(scope="module")
def objects(s3_server):
    """Bucket "proxy-objs" with one object per size in SIZES; {key: bytes}."""
    bucket = s3_server.make_bucket("proxy-objs")
    content = {f"obj/{size}.bin": payload(size, seed=size % 7) for size in SIZES}
    for key, data in content.items():
        s3_server.put(bucket, key, data)
    return content


def client(s3_server, proxy, attempts=1, read_timeout=30, **kw):
    """A boto3 client on the proxy; attempts (in all, botocore's
    total_max_attempts) 1: no retry hides a fault."""
    return s3_server.client(endpoint=proxy.endpoint,
                            retries={"total_max_attempts": attempts, "mode": "standard"},
                            read_timeout=read_timeout, **kw)


def presigned(s3_server, proxy, key, bucket="proxy-objs"):
    """A signed GET URL on the proxy, for plain urllib."""
    return client(s3_server, proxy).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=600)


def test_pass_through_is_byte_exact_and_signatures_validate(s3_server, s3_proxy, objects):
    c = client(s3_server, s3_proxy)
    for key, data in objects.items():
        assert c.get_object(Bucket="proxy-objs", Key=key)["Body"].read() == data, key
        assert c.head_object(Bucket="proxy-objs", Key=key)["ContentLength"] == len(data)
    part = c.get_object(Bucket="proxy-objs", Key=f"obj/{SIZES[-1]}.bin", Range="bytes=10-99")
    assert part["Body"].read() == objects[f"obj/{SIZES[-1]}.bin"][10:100]
    listed = c.list_objects_v2(Bucket="proxy-objs", Prefix="obj/")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(objects)
    # A PUT through the proxy (over 1 MB: boto3 sends Expect: 100-continue).
    big = payload(2 << 20, seed=3)
    c.put_object(Bucket="proxy-objs", Key="put/through-proxy", Body=big)
    assert s3_server.client().get_object(Bucket="proxy-objs", Key="put/through-proxy")["Body"].read() == big
    # Signatures are still checked through the proxy: a wrong secret is refused.
    bad = s3_server.client(endpoint=s3_proxy.endpoint, secret_key="wrong",
                           retries={"total_max_attempts": 1, "mode": "standard"})
    with pytest.raises(ClientError) as e:
        bad.get_object(Bucket="proxy-objs", Key="obj/1.bin")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert s3_proxy.counts["pass"] == s3_proxy.counts["requests"] >= len(objects) * 2 + 4


@pytest.mark.parametrize("delay_ms", [5, 25])
def test_delay_is_added_to_every_response(s3_server, s3_proxy, objects, delay_ms):
    c = client(s3_server, s3_proxy)
    c.get_object(Bucket="proxy-objs", Key="obj/1.bin")["Body"].read()   # connection made
    s3_proxy.delay_ms = delay_ms
    for _ in range(5):
        t0 = time.perf_counter()
        assert c.get_object(Bucket="proxy-objs", Key="obj/4096.bin")["Body"].read() == objects["obj/4096.bin"]
        assert time.perf_counter() - t0 >= delay_ms / 1000.0


def test_requests_in_flight_are_counted(s3_server, s3_proxy, objects):
    """inflight(): 8 requests held 1 s each, sent at once, are 8 in flight
    at most and 8 request-seconds at least over the window they spanned;
    none once they are answered."""
    import concurrent.futures
    clients = [client(s3_server, s3_proxy) for _ in range(8)]   # made before: slow on 2 cores
    s3_proxy.delay_ms = 1000
    before = s3_proxy.inflight()
    assert before["now"] == 0
    start = threading.Barrier(8)

    def get(c):
        start.wait()
        return c.get_object(Bucket="proxy-objs", Key="obj/1.bin")["Body"].read()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(get, clients)) == [objects["obj/1.bin"]] * 8
    after = s3_proxy.inflight()
    assert after["now"] == 0 and after["max"] == 8
    assert after["area_s"] - before["area_s"] >= 8 * 1.0


def test_slowdown_answers_503_the_given_number_of_times(s3_server, s3_proxy, objects):
    s3_proxy.fail("slowdown", times=2, match="/obj/100000.bin")
    # Without retries the client sees S3's throttling answer.
    with pytest.raises(ClientError) as e:
        client(s3_server, s3_proxy).get_object(Bucket="proxy-objs", Key="obj/100000.bin")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert e.value.response["Error"]["Code"] == "SlowDown"
    # Other keys are not affected by a matched rule.
    assert client(s3_server, s3_proxy).get_object(Bucket="proxy-objs", Key="obj/1.bin")["Body"].read() \
        == objects["obj/1.bin"]
    # With retries: the one 503 left, then the object.
    got = client(s3_server, s3_proxy, attempts=3).get_object(Bucket="proxy-objs", Key="obj/100000.bin")
    assert got["Body"].read() == objects["obj/100000.bin"]
    assert s3_proxy.counts["slowdown"] == 2
    hits = [(action, status) for _m, target, action, status in s3_proxy.log if "100000" in target]
    assert hits == [("slowdown", 503), ("slowdown", 503), ("pass", 200)]


def test_status_injects_any_s3_error(s3_server, s3_proxy, objects):
    s3_proxy.fail("status", status=500, code="InternalError")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(presigned(s3_server, s3_proxy, "obj/1.bin"), timeout=10)
    assert e.value.code == 500
    assert b"<Code>InternalError</Code>" in e.value.read()
    assert urllib.request.urlopen(presigned(s3_server, s3_proxy, "obj/1.bin"), timeout=10).read() \
        == objects["obj/1.bin"]
    assert [a for _m, _t, a, _s in s3_proxy.log] == ["status", "pass"]


def test_truncated_body_is_detected(s3_server, s3_proxy, objects):
    key = "obj/100000.bin"
    s3_proxy.fail("truncate", keep=1000)
    with pytest.raises(http.client.IncompleteRead) as e:
        urllib.request.urlopen(presigned(s3_server, s3_proxy, key), timeout=10).read()
    assert len(e.value.partial) == 1000 and e.value.partial == objects[key][:1000]
    s3_proxy.fail("truncate")     # default: half of Content-Length
    body = client(s3_server, s3_proxy).get_object(Bucket="proxy-objs", Key=key)["Body"]
    with pytest.raises((botocore.exceptions.IncompleteReadError,
                        botocore.exceptions.ResponseStreamingError)):
        body.read()
    assert s3_proxy.counts["truncate"] == 2
    # The next request is whole again.
    assert urllib.request.urlopen(presigned(s3_server, s3_proxy, key), timeout=10).read() == objects[key]


def test_reset_breaks_the_connection(s3_server, s3_proxy, objects):
    s3_proxy.fail("reset", times=1)
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        urllib.request.urlopen(presigned(s3_server, s3_proxy, "obj/1.bin"), timeout=10).read()
    s3_proxy.fail("reset", times=1)
    with pytest.raises((botocore.exceptions.ConnectionClosedError,
                        botocore.exceptions.EndpointConnectionError)):
        client(s3_server, s3_proxy).get_object(Bucket="proxy-objs", Key="obj/1.bin")
    assert s3_proxy.counts["reset"] == 2


def test_stall_times_out_the_client_and_close_ends_it(s3_server, s3_proxy, objects):
    s3_proxy.fail("stall", seconds=60, after_bytes=100)
    c = client(s3_server, s3_proxy, read_timeout=1)
    t0 = time.perf_counter()
    body = c.get_object(Bucket="proxy-objs", Key="obj/100000.bin")["Body"]
    with pytest.raises((botocore.exceptions.ReadTimeoutError,
                        botocore.exceptions.ResponseStreamingError)):
        body.read()
    assert 0.9 <= time.perf_counter() - t0 < 30
    # A stall before the head, still running when the proxy closes.
    s3_proxy.fail("stall", seconds=60)
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        c.get_object(Bucket="proxy-objs", Key="obj/1.bin")
    t0 = time.perf_counter()
    s3_proxy.close()
    assert time.perf_counter() - t0 < 5
    assert s3_proxy.counts["stall"] == 2

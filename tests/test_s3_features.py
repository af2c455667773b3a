"""FeatureStore("s3://bucket/key", ...) on the host backend against a real
S3 server (SeaweedFS, tests/s3_server.py): rows gathered by coalesced
ranged GETs through the s3 engine (gather_host.c's fr_read_ranges), equal
to the local file's rows; raw and .npy objects, a packed-image sample;
errors naming the URL."""
import io
import os

import numpy as np
import pytest

import fastread

pytestmark = pytest.mark.usefixtures("s3_engine")

BUCKET = "features-s3"


@pytest.fixture(scope="module")
def arrays(disk_tmp, s3_server):
    """A float32 (3000, 24) array as raw bytes and as .npy, on disk and in
    the bucket. (array, raw path, raw URL, npy URL, S3Options)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3000, 24)).astype(np.float32)
    raw = os.path.join(disk_tmp, "s3-feat.raw")
    a.tofile(raw)
    buf = io.BytesIO()
    np.save(buf, a)
    s3_server.make_bucket(BUCKET)
    raw_url = s3_server.put(BUCKET, "f/feat.raw", a.tobytes())
    npy_url = s3_server.put(BUCKET, "f/feat.npy", buf.getvalue())
    o = fastread.S3Options(endpoint_url=s3_server.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key)
    return a, raw, raw_url, npy_url, o


def ids_cases():
    rng = np.random.default_rng(1)
    return [np.arange(3000), rng.integers(0, 3000, 700), np.array([2999, 0, 5, 5, 6, 7, 1500]),
            np.sort(rng.choice(3000, 300, replace=False))]


def test_raw_and_npy_rows_equal_the_local_file(arrays):
    a, raw, raw_url, npy_url, o = arrays
    local = fastread.FeatureStore(raw, np.float32, (-1, 24), backend="host", device_id=-1)
    stores = [fastread.FeatureStore(raw_url, np.float32, (-1, 24), backend="host",
                                    device_id=-1, s3=o),
              fastread.FeatureStore(npy_url, backend="host", device_id=-1, **o.given())]
    for st in stores:
        assert st.shape == (3000, 24) and st.dtype == np.float32 and st.backend == "host"
        assert st.engine == "s3"
        for ids in ids_cases():
            got = st.gather(ids, device="cpu")
            np.testing.assert_array_equal(got, a[ids])
            np.testing.assert_array_equal(got, local.gather(ids, device="cpu"))
    assert stores[1].npy


def test_adjacent_rows_coalesce_into_few_gets(arrays, s3_server, s3_proxy):
    """A gather of 200 adjacent rows is a handful of ranged GETs (206),
    not one per row; scattered rows are more, never more than the rows."""
    a, _, raw_url, _, _ = arrays
    o = fastread.S3Options(endpoint_url=s3_proxy.endpoint, region=s3_server.region,
                           access_key_id=s3_server.access_key,
                           secret_access_key=s3_server.secret_key)
    st = fastread.FeatureStore(raw_url, np.float32, (-1, 24), backend="host", device_id=-1, s3=o)
    s3_proxy.log.clear()
    ids = np.arange(1000, 1200)[::-1]
    np.testing.assert_array_equal(st.gather(ids, device="cpu"), a[ids])
    gets = [status for m, t, _, status in s3_proxy.settled_log()
            if m == "GET" and t.endswith("feat.raw")]
    assert 1 <= len(gets) <= 4 and all(s == 206 for s in gets), gets


def test_environment_and_packed_sample(arrays, s3_server, monkeypatch, disk_tmp):
    a, _, raw_url, npy_url, o = arrays
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    st = fastread.FeatureStore(npy_url, backend="host", device_id=-1)
    np.testing.assert_array_equal(st.gather([7, 3], device="cpu"), a[[7, 3]])
    # A packed image in the bucket whose sample is a .npy array.
    root = os.path.join(disk_tmp, "s3-feat-tree")
    os.makedirs(os.path.join(root, "c"))
    np.save(os.path.join(root, "c", "x.npy"), a[:500])
    with open(os.path.join(root, "c", "y.npy"), "wb") as f:
        f.write(b"other")
    img = fastread.pack(root, os.path.join(disk_tmp, "s3-feat.img"), progress=False,
                        file_filters=["*.npy"])
    with open(img.path, "rb") as f:
        url = s3_server.put(BUCKET, "img/feat.img", f.read())
    with open(img.index_path, "rb") as f:
        s3_server.put(BUCKET, "img/feat.img.index", f.read())
    st = fastread.FeatureStore(url, sample="c/x.npy", backend="host", device_id=-1)
    assert st.shape == (500, 24)
    np.testing.assert_array_equal(st.gather([499, 0, 250], device="cpu"), a[[499, 0, 250]])


def test_errors_name_the_url(arrays, s3_server):
    a, _, raw_url, _, o = arrays
    with pytest.raises(FileNotFoundError) as e:
        fastread.FeatureStore(f"s3://{BUCKET}/f/nope.raw", np.float32, (-1, 24), s3=o)
    assert f"s3://{BUCKET}/f/nope.raw" in str(e.value)
    with pytest.raises(ValueError, match="too short"):
        fastread.FeatureStore(raw_url, np.float32, (4000, 24), backend="host", s3=o)
    with pytest.raises(ValueError, match="backend='host'"):
        fastread.FeatureStore(raw_url, np.float32, (-1, 24), backend="proxy", s3=o)
    wrong = fastread.S3Options.coerce(o, secret_access_key="wrong-secret-feat")
    with pytest.raises(OSError) as e:
        fastread.FeatureStore(raw_url, np.float32, (-1, 24), s3=wrong)
    assert "wrong-secret-feat" not in str(e.value) and s3_server.secret_key not in str(e.value)
    # The object shrinks after the store opened: the gather reading past its
    # end fails, naming the URL.
    url = s3_server.put(BUCKET, "f/shrinks.raw", a.tobytes())
    st = fastread.FeatureStore(url, np.float32, (-1, 24), backend="host", device_id=-1, s3=o)
    s3_server.put(BUCKET, "f/shrinks.raw", a[:10].tobytes())
    with pytest.raises(OSError) as e:
        st.gather([2999], device="cpu")
    assert url in str(e.value)

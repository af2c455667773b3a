"""The S3 engine's main tests against a second real server, MinIO
(tests/s3_minio.py), where its binary is built (bash scripts/build-minio.sh;
skipped naming MinIO elsewhere, never required): exact bytes, keys that need
encoding, listings past a page and by common prefixes (in C and in Python),
scans equal to local ones, ranged GETs, SigV4 refused with a wrong secret,
errors naming the URL, ETags, PUTs, retries through the fault proxy.

The tests are test_s3.py's and test_s3_list.py's own, run with `s3_server`
being the MinIO: a server-specific difference shows as a failure here. The
whole S3 suite runs against MinIO with FASTREAD_S3_SERVER=minio."""
import pytest

import test_s3
import test_s3_list
from conftest import skip_unless
from test_s3 import many  # noqa: F401  (fixtures, here on the MinIO)
from test_s3_list import objects  # noqa: F401

pytestmark = pytest.mark.usefixtures("s3_engine")


@pytest.fixture(scope="module")
def s3_server(minio_server):
    """Every test and fixture of this module (s3_proxy included) on MinIO."""
    return minio_server


@pytest.fixture
def list_in_c():
    from fastread import s3 as fs3
    if fs3._s3 is None or not fs3._s3.list_native():
        skip_unless("s3-list", "this build lists in Python: libexpat was not found when it "
                               "was built (apt install libexpat1-dev)")


def test_server_is_minio(s3_server):
    # MinIO names itself in every response's Server header.
    r = s3_server.client().list_buckets()
    assert r["ResponseMetadata"]["HTTPHeaders"].get("server", "").startswith("MinIO")


def test_exact_bytes_of_thousands(s3_server, many):  # noqa: F811
    test_s3.test_exact_bytes_of_thousands(s3_server, many)


def test_keys_that_need_encoding(s3_server):
    test_s3.test_keys_that_need_encoding(s3_server)


def test_listing_past_one_page(s3_server, many):  # noqa: F811
    test_s3.test_listing_past_one_page(s3_server, many)


def test_scan_and_reader_match_local(s3_server, tmp_path):
    test_s3.test_scan_and_reader_match_local(s3_server, tmp_path)


def test_byte_ranges(s3_server):
    test_s3.test_byte_ranges(s3_server)


def test_wrong_secret_names_403_not_the_secret(s3_server):
    test_s3.test_wrong_secret_names_403_not_the_secret(s3_server)


def test_missing_object_names_the_url(s3_server, many):  # noqa: F811
    test_s3.test_missing_object_names_the_url(s3_server, many)


def test_put_object_round_trip(s3_server):
    test_s3.test_put_object_round_trip(s3_server)


def test_listing_in_c_is_python_s(s3_server, objects, list_in_c):  # noqa: F811
    test_s3_list.test_the_same_listing_as_python(s3_server, objects)


def test_listings_in_flight_and_retried(s3_server, s3_proxy, objects, list_in_c):  # noqa: F811
    test_s3_list.test_listings_in_flight_at_once_and_retried(s3_server, s3_proxy, objects)


def test_listing_errors_name_the_url(s3_server, s3_proxy, objects, list_in_c):  # noqa: F811
    test_s3_list.test_errors_name_the_url(s3_server, s3_proxy, objects)


def test_kill_and_restart_keep_the_endpoint_and_objects(s3_server):
    # The helper's restart() (what the "server dies mid-epoch" tests use)
    # on MinIO: same port, same drive, a signed GET works again.
    import fastread
    s3_server.make_bucket("restart")
    url = s3_server.put("restart", "k.bin", b"kept")
    endpoint = s3_server.endpoint
    s3_server.restart()
    assert s3_server.endpoint == endpoint
    got = fastread.read_files([url], s3=test_s3.opts(s3_server))
    assert got[0].tobytes() == b"kept"

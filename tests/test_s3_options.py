"""S3 options without a server: S3Options' checks and engine_args, secrets
kept out of every repr(), s3:// URL helpers, and where engine 'auto' sends
a list of URLs."""
import pytest

import fastread
from fastread import s3 as fs3
from fastread.engine import EngineOptions, for_paths


def test_options_become_engine_args():
    o = fastread.S3Options(endpoint_url="http://127.0.0.1:9000", region="eu-west-1",
                           unsigned=True, verify=False, inflight=64, part_size=1 << 20)
    assert o.engine_args() == ("endpoint=http://127.0.0.1:9000,region=eu-west-1,unsigned=1,"
                               "verify=0,inflight=64,part_size=1048576")
    assert fastread.S3Options().engine_args() == ""
    # A mapping, and keywords that win over it.
    assert fastread.S3Options.coerce({"region": "a"}, region="b").region == "b"
    assert fastread.S3Options.coerce(o) is o
    # Folded into engine_args for the s3 engine only, after the caller's own.
    resolved = EngineOptions(s3=o, engine_args="retries=2").resolve("s3")
    assert resolved["engine_args"] == "retries=2," + o.engine_args()
    with pytest.raises(TypeError, match="only to engine 's3'"):
        EngineOptions(s3=o).resolve("psync")


def test_options_are_checked():
    with pytest.raises(TypeError, match="unknown S3 option"):
        fastread.S3Options.coerce(endpoint="x")
    with pytest.raises(ValueError, match="inflight must be an integer"):
        fastread.S3Options(inflight="many")
    with pytest.raises(ValueError, match="unsigned must be True or False"):
        fastread.S3Options(unsigned="yes")
    # A comma would split engine_args: refused, a secret without being shown.
    with pytest.raises(ValueError, match="region cannot hold ','"):
        fastread.S3Options(region="a,b")
    with pytest.raises(ValueError) as e:
        fastread.S3Options(secret_access_key="top,secret")
    assert "top" not in str(e.value) and "not shown" in str(e.value)


def test_no_repr_shows_a_secret():
    secret, token = "wJalrXUtnFEMI/K7MDENG", "FwoGZXIvYXdzEJr"
    o = fastread.S3Options(access_key_id="AKID", secret_access_key=secret, session_token=token)
    for text in (repr(o), str(o)):
        assert secret not in text and token not in text and "AKID" in text
    eo = EngineOptions(s3=o, engine_args=f"secret_access_key={secret},session_token={token},"
                                         "region=r")
    for text in (repr(eo), str(eo)):
        assert secret not in text and token not in text and "region=r" in text
    assert fs3.redact_engine_args(f"a=1,secret_access_key={secret}") == \
        "a=1,secret_access_key=***"


def test_urls_and_auto(monkeypatch):
    assert fs3.split_url("s3://b/dir/k") == ("b", "dir/k")
    assert fs3.split_url("s3://b") == ("b", "")
    assert fs3.is_url("s3://b/k") and not fs3.is_url("/data/s3://x")
    with pytest.raises(ValueError):
        fs3.split_url("/local")
    assert for_paths("auto", "s3://b/k") == "s3"
    # None: FASTREAD_ENGINE's choice, 'auto' unless set.
    monkeypatch.delenv("FASTREAD_ENGINE", raising=False)
    assert for_paths(None, "s3://b/k") == "s3"
    monkeypatch.setenv("FASTREAD_ENGINE", "psync")
    assert for_paths(None, "s3://b/k") is None
    assert for_paths("psync", "s3://b/k") == "psync"
    assert for_paths("auto", "/data/a.jpg") == "auto"


def test_credentials_in_an_endpoint_are_never_shown():
    """https://KEY:SECRET@host: refused by the engine (no user info in an
    endpoint), and no repr() or message shows the user info."""
    key, secret = "AKIAEXAMPLE", "wJalrXUtnFEMI-SECRET"
    endpoint = f"https://{key}:{secret}@s3.example.com"
    o = fastread.S3Options(endpoint_url=endpoint, unsigned=True)
    eo = EngineOptions(s3=o, engine_args=f"endpoint={endpoint},region=r")
    for text in (repr(o), str(o), repr(eo), str(eo)):
        assert key not in text and secret not in text and "***@s3.example.com" in text
    assert fs3.redact_url("http://u@h:1/p@q") == "http://***@h:1/p@q"
    assert fs3.redact_url("http://h:1/p@q") == "http://h:1/p@q"
    assert fs3.redact_engine_args(f"endpoint={endpoint},a=1") == \
        "endpoint=https://***@s3.example.com,a=1"
    with pytest.raises(ValueError) as e:
        fastread.S3Options(endpoint_url=endpoint + ",x")
    assert secret not in str(e.value) and key not in str(e.value)
    if fastread.engines()["s3"].files is True or fs3.describe()[0]:
        for call in (lambda: fs3.list_objects("s3://bkt/x", o),
                     lambda: fastread.read_files(["s3://bkt/x"], s3=o)):
            with pytest.raises(ValueError) as e:
                call()
            msg = str(e.value)
            assert key not in msg and secret not in msg and "***@s3.example.com" in msg, msg

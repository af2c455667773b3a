"""Modes over objects in S3 (or an S3-compatible server): ``fastread bench
s3://bucket/prefix``.

DATA is the URL. The samples are the objects one "directory" below the
prefix (``prefix/CLASS/NAME``), listed by :func:`fastread.scan` as
``fn.readers.file`` lists a tree. The endpoint and credentials come from
the AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...; see
docs/s3.md) or from ``--engine-option s3.<name>=<value>`` (the fields of
:class:`fastread.S3Options`: ``s3.endpoint_url``, ``s3.region``,
``s3.inflight``, ...), which every mode here is given.

=================  ==============================================================
``s3-dali``        DALI's ``fn.readers.file(file_root="s3://...")`` (its AWS SDK
                   client): the baseline
``s3-boto3``       boto3 ``get_object`` per object, 32 at a time from a
                   ``ThreadPoolExecutor(32)``: the plain Python way
``s3-read_files``  :func:`fastread.read_files` on each batch's URLs (engine s3),
                   one call per batch, no read-ahead
``s3-reader``      :class:`fastread.Reader` over the prefix (engine s3), with its
                   read-ahead
``s3-curl``        ``curl --parallel --parallel-max 64 --aws-sigv4`` over one
                   epoch's URLs: the server's ceiling (no Python, no arrays)
=================  ==============================================================

The page cache does not apply: every run reads the objects from the server
(whose own caches are its business), so ``--cache cold`` and ``--cache
both`` are refused and the results' cache is ``"none"``.

Besides img/s and GB/s each run records the client's CPU seconds per GB
(the harness's ``cpu_s_per_gb``) and, for the modes that read through a
context fastread lets us see (``s3-read_files``), the engine's counters:
``s3_inflight_max`` (the most requests in flight at once) and the
requests and retries of the run.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import urllib.parse

import numpy as np

from fastread.bench.registry import BenchError, Dataset, Mode, add_dataset_kind
from fastread.bench.runners import DaliRunner, EpochRunner, ReaderRunner

NAME = "s3"
ORDER = 60

KIND = "s3"
add_dataset_kind(KIND, "objects under an s3://bucket/prefix URL (one prefix per class)")

BOTH = ("cpu", "gpu")
#: boto3's pool: the comparison the issue asks for (bench/s3/bench_s3.py's too).
BOTO3_THREADS = 32
#: curl's transfers in flight (bench/s3/bench_s3.py's ceiling uses the same).
CURL_PARALLEL = 64

def modes(env):
    yield Mode("s3-dali", NAME, KIND, "fn.readers.file(file_root='s3://...')",
               "DALI's fn.readers.file over the s3:// prefix (its AWS SDK client): the baseline",
               check=_check_dali, build=_build_dali, role="baseline", dali=True, default=BOTH)
    yield Mode("s3-boto3", NAME, KIND, f"boto3 get_object x ThreadPoolExecutor({BOTO3_THREADS})",
               f"boto3 get_object per object, {BOTO3_THREADS} threads (pip install boto3)",
               check=_check_boto3, build=_build_boto3, role="python", default=BOTH)
    yield Mode("s3-read_files", NAME, KIND, "fastread.read_files(urls, engine='s3')",
               "fastread.read_files() on each batch's URLs (engine s3), no read-ahead",
               engine="s3", check=_check_read_files, build=_build_read_files, default=BOTH)
    yield Mode("s3-reader", NAME, KIND, "fastread.Reader('s3://...', engine='s3')",
               "fastread.Reader over the prefix (engine s3), with its read-ahead",
               engine="s3", check=_check_reader, build=_build_reader, default=BOTH)
    yield Mode("s3-curl", NAME, KIND,
               f"curl --parallel --parallel-max {CURL_PARALLEL} --aws-sigv4",
               "the server's ceiling: one curl --parallel process per epoch, objects to "
               "/dev/null (needs curl >= 7.75)",
               check=_check_curl, build=_build_curl, role="reference", ceiling=True,
               default=BOTH)


# -- the dataset ----------------------------------------------------------------------
def _s3_error():
    """Why this fastread cannot read s3:// URLs, or None (asked once)."""
    if "why" not in _cache:
        from fastread.engine import s3_version
        _cache["why"] = s3_version()[1]
    return _cache["why"]


_cache = {}


def s3_options(engine_options):
    """The ``s3`` engine option (a mapping of S3Options fields), or None."""
    return (engine_options or {}).get("s3") or None


def detect(path, engine_options=None):
    """An ``s3://bucket/prefix`` URL: its objects, listed (ListObjectsV2) with
    the endpoint and credentials of the environment or ``--engine-option
    s3.*``. Raises BenchError naming the URL when it cannot be listed or
    holds no samples."""
    from fastread import s3

    if not s3.is_url(path):
        return None
    why = _s3_error()
    if why:
        raise BenchError(f"DATA {path}: this fastread cannot read s3:// URLs: {why}")
    import fastread

    opts = s3_options(engine_options)
    base = path if path.endswith("/") else path + "/"
    try:
        bucket, _ = s3.split_url(base)
    except ValueError as e:
        raise BenchError(f"DATA {path}: {e}") from None
    # Listed first: a missing bucket or refused credentials say so here,
    # before scan's "no files" could hide them.
    try:
        sizes = {f"s3://{bucket}/{o.key}": o.size for o in s3.list_objects(base, opts)}
    except (OSError, ValueError, TypeError) as e:
        raise BenchError(f"DATA {path}: cannot list it: {e}") from None
    try:
        paths, labels = fastread.scan(path, s3=opts)
    except OSError as e:
        raise BenchError(f"DATA {path}: cannot list it: {e}") from None
    except ValueError as e:  # scan's "no files found ... matching file_filters"
        paths, why = [], f" ({e})"
    else:
        why = ""
    if not paths:
        raise BenchError(f"DATA {path} holds no samples: expected objects {base}CLASS/NAME "
                         f"(one prefix per class, as fn.readers.file reads a tree){why}")
    missing = [p for p in paths if p not in sizes]
    if missing:  # the two listings disagree: objects written while we listed
        raise BenchError(f"DATA {path}: {missing[0]} was listed by scan but not by "
                         "list_objects (is the prefix being written to?)")
    return Dataset(root=path, primary=KIND, kinds=(KIND,), paths=list(paths),
                   labels=[int(x) for x in labels], samples=len(paths),
                   nbytes=sum(sizes[p] for p in paths), page_cache=False)


# -- where the other clients find the server ---------------------------------------------
def _setting(opts, field, *env_names):
    if opts and opts.get(field) is not None:
        return opts[field]
    for name in env_names:
        if os.environ.get(name):
            return os.environ[name]
    return None


def client_settings(cfg):
    """endpoint, region and credentials for clients other than fastread's
    engine (boto3, curl, DALI): the ``s3.*`` engine options, else the AWS
    environment. Values may be None (then the client's own defaults and
    files apply, where it has them)."""
    opts = s3_options(cfg.engine_options)
    return {
        "endpoint": _setting(opts, "endpoint_url", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        "region": _setting(opts, "region", "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
        "access_key": _setting(opts, "access_key_id", "AWS_ACCESS_KEY_ID"),
        "secret_key": _setting(opts, "secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        "session_token": _setting(opts, "session_token", "AWS_SESSION_TOKEN"),
    }


# -- checks ------------------------------------------------------------------------------
def _common(cfg, host_only=True, decode=False):
    if cfg.decode and not decode:
        return "does not decode; --decode applies to s3-dali"
    if host_only and cfg.device == "gpu":
        return "reads into host memory only; run it with --device cpu"
    return None


def _check_read_files(mode, cfg):
    return _s3_error() or _common(cfg)


def _check_reader(mode, cfg):
    why = _s3_error() or _common(cfg, host_only=False)
    if why is None and cfg.device == "gpu" and cfg.env.cuda_error:
        why = f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return why


def _check_dali(mode, cfg):
    why = cfg.env.dali_error_for()
    if why:
        return why
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_boto3(mode, cfg):
    from fastread.bench.environment import try_import

    mod, why = try_import("boto3")
    if mod is None:
        return f"boto3 {why} (pip install boto3)"
    return _common(cfg)


def _curl_error():
    if "curl" not in _cache:
        exe = shutil.which("curl")
        if exe is None:
            _cache["curl"] = "no curl on PATH"
        else:
            try:
                text = subprocess.run([exe, "--help", "all"], capture_output=True, text=True,
                                      timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired) as e:
                text, _cache["curl"] = "", f"curl --help all: {e}"
            if "curl" not in _cache:
                need = ("--aws-sigv4", "--parallel-max", "--no-progress-meter")
                lacks = [o for o in need if o not in text]
                _cache["curl"] = (f"{exe} lacks {', '.join(lacks)} (curl >= 7.75 has them)"
                                  if lacks else None)
    return _cache["curl"]


def _check_curl(mode, cfg):
    why = _curl_error() or _common(cfg)
    if why:
        return why
    s = client_settings(cfg)
    if not s["endpoint"] or not s["access_key"] or not s["secret_key"]:
        return ("needs the endpoint and credentials in AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or --engine-option s3.endpoint_url=..., "
                "s3.access_key_id=..., s3.secret_access_key=...): curl reads no ~/.aws files")
    if s["session_token"]:
        return "session tokens are not passed to curl (AWS_SESSION_TOKEN is set)"
    return None


# -- fastread ----------------------------------------------------------------------------
def _fastread_options(cfg):
    """The engine options of the fastread modes, the s3 mapping as
    S3Options (hashable: read_files then keeps one context for the run)."""
    from fastread.s3 import S3Options

    opts = cfg.engine_options_without("workers", "prefetch")
    if opts.get("s3") is not None:
        opts["s3"] = S3Options.coerce(opts["s3"])
    return opts


class ReadFilesRunner(EpochRunner):
    """fastread.read_files() on each batch's URLs, one call per batch. Its
    stats() are the counters of the context read_files() reads with (this
    thread's cached one): the most requests in flight at once since it
    opened (warm-up runs included), and the requests and retries since this
    runner was built."""

    COUNTERS = ("s3_requests", "s3_retries")

    def __init__(self, cfg):
        from fastread.engine import cached_context

        self.cfg = cfg
        self.options = _fastread_options(cfg)
        # The very context files.read_files() takes from the cache (same
        # arguments), so its counters are the reads' counters.
        self.ctx = cached_context("s3", None, all_cpus=True, **self.options)
        self.start = {k: self.ctx.stat(k) for k in self.COUNTERS}
        super().__init__()

    def new_epoch(self):
        import fastread

        paths, bs = self.cfg.paths, self.cfg.batch_size
        for start in range(0, len(paths), bs):
            yield fastread.read_files(paths[start:start + bs], engine="s3", **self.options), None

    def stats(self):
        out = {k: self.ctx.stat(k) - self.start[k] for k in self.COUNTERS}
        out["s3_inflight_max"] = self.ctx.stat("s3_inflight_max")
        return out

    def close(self):
        super().close()
        self.ctx = None


def _build_read_files(mode, cfg):
    return ReadFilesRunner(cfg)


def _build_reader(mode, cfg):
    import fastread

    opts = dict(cfg.engine_options)
    return ReaderRunner(fastread.Reader(cfg.data_dir, batch_size=cfg.batch_size, engine="s3",
                                        device=cfg.device, **opts))


# -- DALI --------------------------------------------------------------------------------
_DALI_ENV = (("endpoint", ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")),
             ("region", ("AWS_REGION",)),
             ("access_key", ("AWS_ACCESS_KEY_ID",)),
             ("secret_key", ("AWS_SECRET_ACCESS_KEY",)),
             ("session_token", ("AWS_SESSION_TOKEN",)))


def _build_dali(mode, cfg):
    # DALI's AWS SDK client reads its endpoint and credentials from the
    # environment only (once per process): the s3.* options go there.
    if s3_options(cfg.engine_options):
        s = client_settings(cfg)
        for key, names in _DALI_ENV:
            if s[key] is not None:
                for name in names:
                    os.environ[name] = str(s[key])

    def reader():
        from nvidia.dali import fn
        return fn.readers.file(file_root=cfg.data_dir, random_shuffle=False, name="Reader")
    return DaliRunner(cfg, reader)


# -- boto3 -------------------------------------------------------------------------------
class Boto3Runner(EpochRunner):
    """boto3 get_object for each object of a batch, BOTO3_THREADS at a time
    (one client, as boto3 allows across threads), bodies read whole."""

    def __init__(self, cfg):
        import boto3
        from botocore.config import Config

        from fastread import s3

        self.cfg = cfg
        s = client_settings(cfg)
        addressing = (s3_options(cfg.engine_options) or {}).get("addressing")
        if addressing in (None, "auto"):
            # fastread's rule: path-style for endpoints other than AWS's.
            addressing = "path" if s["endpoint"] and "amazonaws.com" not in s["endpoint"] \
                else "virtual"
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=s["endpoint"], region_name=s["region"],
            aws_access_key_id=s["access_key"], aws_secret_access_key=s["secret_key"],
            aws_session_token=s["session_token"],
            config=Config(s3={"addressing_style": addressing},
                          max_pool_connections=BOTO3_THREADS,
                          retries={"total_max_attempts": 3, "mode": "standard"}))
        self.keys = [s3.split_url(p) for p in cfg.paths]
        self.pool = concurrent.futures.ThreadPoolExecutor(BOTO3_THREADS)
        super().__init__()

    def _get(self, bucket_key):
        bucket, key = bucket_key
        body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return np.frombuffer(body, dtype=np.uint8)

    def new_epoch(self):
        keys, bs = self.keys, self.cfg.batch_size
        for start in range(0, len(keys), bs):
            yield list(self.pool.map(self._get, keys[start:start + bs])), None

    def close(self):
        super().close()
        self.pool.shutdown(wait=True)
        self.client.close()


def _build_boto3(mode, cfg):
    return Boto3Runner(cfg)


# -- curl: the ceiling ------------------------------------------------------------------
#: Marks curl's line per transfer ("%{stderr}": written unbuffered as each
#: transfer ends) among its error messages.
_MARK = "%{stderr}fastread-curl"
_LINE = re.compile(rb"fastread-curl (\d{3}) (\d+)")


def _quote_config(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class CurlRunner:
    """One ``curl --parallel`` process per epoch fetching every object to
    /dev/null; next() waits for the next batch_size transfers to finish (so
    curl reads ahead up to CURL_PARALLEL objects, as a Reader does). The
    config (the credentials, the URLs) goes through curl's stdin, never its
    command line (which every local user can read). Each transfer's status
    and size come on curl's stderr (``%{stderr}``: unbuffered, one line per
    transfer as it ends)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.settings = client_settings(cfg)
        self.proc = None
        self.done = 0
        self._epoch()

    def _urls(self):
        from fastread import s3

        end = self.settings["endpoint"].rstrip("/")
        for p in self.cfg.paths:
            bucket, key = s3.split_url(p)
            yield f"{end}/{bucket}/{urllib.parse.quote(key, safe='/~')}"

    def _epoch(self):
        self._stop()
        s = self.settings
        lines = [f"user = {_quote_config(s['access_key'] + ':' + s['secret_key'])}",
                 f"aws-sigv4 = {_quote_config('aws:amz:' + s['region'] + ':s3')}"]
        for url in self._urls():
            lines += [f"url = {_quote_config(url)}", 'output = "/dev/null"']
        self.proc = subprocess.Popen(
            # --no-progress-meter: in parallel mode curl 7.88 draws its meter
            # on stderr even with --silent.
            [shutil.which("curl"), "--no-progress-meter", "--parallel", "--parallel-max",
             str(CURL_PARALLEL), "--write-out", _MARK + " %{http_code} %{size_download}\\n",
             "--config", "-"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # curl reads its whole config before the first transfer: no deadlock.
        self.proc.stdin.write(("\n".join(lines) + "\n").encode())
        self.proc.stdin.close()
        self.done = 0

    def next(self):
        want = min(self.cfg.batch_size, len(self.cfg.paths) - self.done)
        if want <= 0:
            self._epoch()
            want = min(self.cfg.batch_size, len(self.cfg.paths))
        n = nbytes = 0
        said = ""  # curl's last words that were not a transfer's line
        while n < want:
            line = self.proc.stderr.readline()
            if not line:
                rc = self.proc.wait(timeout=30)
                raise RuntimeError(f"curl ended (status {rc}) after {self.done + n} of "
                                   f"{len(self.cfg.paths)} objects of {self.cfg.data_dir}"
                                   f"{': ' + said if said else ''}")
            m = _LINE.search(line)
            if m is None:
                said = line.decode(errors="replace").strip()
                continue
            if m.group(1) != b"200":
                raise RuntimeError(f"curl: HTTP {m.group(1).decode()} for an object of "
                                   f"{self.cfg.data_dir} (transfer {self.done + n + 1} of "
                                   f"{len(self.cfg.paths)}){': ' + said if said else ''}")
            n += 1
            nbytes += int(m.group(2))
        self.done += n
        return n, nbytes

    def child_cpu_seconds(self):
        """CPU seconds of the running curl (the harness adds them to the
        run's client CPU: a curl not yet waited for is in no rusage)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def _stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc.stderr.close()
            self.proc = None

    def close(self):
        self._stop()


def _build_curl(mode, cfg):
    return CurlRunner(cfg)

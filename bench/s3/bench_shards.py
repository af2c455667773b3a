#!/usr/bin/env python3
"""S3 shard benchmark (issue 30 item 8, large objects): the JPEGs of one
`fastread make-dataset` tree written as ~64 MB shards (WebDataset tars;
MosaicML streaming's MDS; LitData's optimize() chunks), uploaded to a real
S3 server (SeaweedFS, tests/s3_server.py), and read whole, once per pass, by

  fastread-wds   fastread.Reader(source=fastread.formats.WebDataset(shard URLs,
                 ["jpg", "cls"])): whole shards in order (s3_read's default),
                 batch 64: what a PyTorch/NumPy user of fastread writes
  fastread-wds-noahead  the same without its next-shard read-ahead (an A/B,
                 only when asked for in --readers)
  fastread-wds-ahead1  the same reading one shard ahead, not AHEAD_SHARDS (an A/B)
  fastread-dali  fastread.dali.readers.webdataset(paths=shard URLs) in a DALI
                 pipeline (CPU), batch 64: what a DALI user of fastread writes
  read_files     fastread.read_files(shard URLs): each shard one object, which
                 the engine fetches as parallel ranged GETs of part_size
  s3torch        s3torchconnector S3IterableDataset.from_objects(shard URLs,
                 enable_sharding=True) with webdataset's tar_file_expander and
                 group_by_keys (as its README shows), DataLoader(--loader-workers)
  dali-wds       DALI's own fn.readers.webdataset(paths="s3://...") (skipped
                 with DALI's error where DALI cannot read s3:// shards)
  boto3          get_object of each whole shard in a ThreadPoolExecutor(32)
  mosaic         MosaicML streaming: MDSWriter shards, StreamingDataset(remote=
                 "s3://...", a fresh local cache per pass: it downloads every
                 shard to local disk, then reads), DataLoader(--loader-workers)
  litdata        LitData: optimize() chunks, StreamingDataset("s3://...",
                 storage_options with the endpoint, a fresh cache per pass),
                 its StreamingDataLoader(--loader-workers)
  curl           the server's ceiling: curl --parallel --parallel-max 64
                 --aws-sigv4 over the shards, whole objects
  curl-ranges    the same, each shard as ranged GETs of 8 MiB (64 in flight)

at each added delay (--delays, ms; 0: the server itself, > 0: the delay
proxy, bench/s3/latency.py, since this kernel has no sch_netem), in ONE run
whose rounds interleave the readers and the delays. A measurement is
--passes whole passes over the data set (every sample once each); it is an
error unless each pass delivered every sample. Per measurement:
samples/s, GB/s (the bytes of the format's shards per pass, so readers of
samples and readers of whole objects compare on the same data), the
client's CPU seconds per GB (the reader's process tree: DataLoader workers,
curl; not the server, not the proxy: reported apart), and requests in
flight where the reader says (fastread: the engine's counter; boto3 and
curl: their bound).

    python bench/s3/bench_shards.py                       # 5,000 images, 0 and 25 ms
    python bench/s3/bench_shards.py --per-class 200 --rounds 1 --readers read_files,curl

Each (reader, delay) lives in a worker process of its own (bench/s3/_harness.py),
set up once and measured every round.
"""

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "tests")))
sys.path.insert(0, HERE)

import _harness  # noqa: E402
from _harness import (Boto3Gets, Worker, close_all, curl_skip_reason, ensure_dataset,  # noqa: E402
                      ensure_uploaded, inflight_cell, measure_round, open_endpoints, parse_tail,
                      report_base, rows_by_reader, summary_head, summary_problems, versions)

READERS = ("fastread-wds", "fastread-wds-noahead", "fastread-wds-ahead1", "fastread-dali", "read_files", "s3torch",
           "dali-wds", "boto3", "mosaic", "litdata", "curl", "curl-ranges")
#: What a plain run measures (fastread-wds-noahead: an A/B, asked by name).
DEFAULT_READERS = tuple(r for r in READERS
                        if r not in ("fastread-wds-noahead", "fastread-wds-ahead1"))
CEILINGS = ("curl", "curl-ranges")
BUCKET = "bench"
#: The formats and where each lives under the bucket.
PREFIX = {"wds": "shards/wds", "mds": "shards/mds", "litdata": "shards/litdata"}
#: A format's shards, apart from its index files (which its reader fetches too).
SHARD_SUFFIX = {"wds": ".tar", "mds": ".mds", "litdata": ".bin"}
FORMAT_OF = {"mosaic": "mds", "litdata": "litdata"}   # others read the tar shards
BATCH = 64


# -- the shards (made once per --workdir, then reused) ------------------------------

def tree_samples(dataset):
    """[(key, jpeg path, label)] of the tree, sorted: label = the class's
    position among the sorted class directories."""
    classes = sorted(d for d in os.listdir(dataset)
                     if not d.startswith(".") and os.path.isdir(os.path.join(dataset, d)))
    out = []
    for label, c in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(dataset, c))):
            if name.startswith("."):
                continue
            out.append((f"{c}_{os.path.splitext(name)[0]}", os.path.join(dataset, c, name), label))
    return out


def _done(directory, params):
    """Whether directory holds a complete output made with params."""
    try:
        with open(os.path.join(directory, ".params.json")) as f:
            return json.load(f) == params
    except (OSError, ValueError):
        return False


def _mark(directory, params):
    with open(os.path.join(directory, ".params.json"), "w") as f:
        json.dump(params, f)


def write_wds(samples, out, shard_bytes):
    """WebDataset tar shards (<key>.jpg, <key>.cls) of about shard_bytes."""
    shard, size, tar = 0, 0, None
    try:
        for key, path, label in samples:
            if tar is None or size >= shard_bytes:
                if tar is not None:
                    tar.close()
                tar = tarfile.open(os.path.join(out, f"shard-{shard:06d}.tar"), "w",
                                   format=tarfile.USTAR_FORMAT)
                shard, size = shard + 1, 0
            with open(path, "rb") as f:
                jpg = f.read()
            for ext, data in (("jpg", jpg), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
                size += 512 + (len(data) + 511) // 512 * 512
    finally:
        if tar is not None:
            tar.close()


def import_streaming():
    """MosaicML streaming, imported. Returns a note when it needed the
    torchvision workaround, else "".

    streaming imports torchvision at import time (VisionDataset, a Python
    class); the only torchvision on this mirror is the CUDA build, whose C
    ops do not load with the CPU torch here, and its _meta_registrations
    then fail (fake kernels for ops that do not exist). That module only
    registers those fake kernels: it is left out, nothing streaming reads
    with depends on it."""
    try:
        import streaming  # noqa: F401
        return ""
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    import types
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    import streaming  # noqa: F401,F811
    return ("torchvision's _meta_registrations left out (CUDA torchvision wheel, CPU torch: "
            "its C ops do not load)")


def write_mds(samples, out, shard_bytes):
    import_streaming()
    from streaming import MDSWriter
    with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, compression=None,
                   size_limit=shard_bytes, progress_bar=False) as w:
        for _key, path, label in samples:
            with open(path, "rb") as f:
                w.write({"jpg": f.read(), "cls": label})


def _litdata_item(sample):
    _key, path, label = sample
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def write_litdata(samples, out, shard_bytes):
    import litdata
    litdata.optimize(fn=_litdata_item, inputs=list(samples), output_dir=out,
                     chunk_bytes=shard_bytes, num_workers=1, mode="overwrite",
                     start_method="fork")


WRITERS = {"wds": write_wds, "mds": write_mds, "litdata": write_litdata}


def ensure_formats(args, samples):
    """{format: (local directory, error or None)}: each format written under
    --workdir/formats/<format> unless already there with these parameters."""
    params = {"samples": [k for k, _p, _l in samples], "shard_bytes": args.shard_mb * 10**6,
              "dataset": os.path.abspath(args.dataset)}
    out = {}
    for fmt, write in WRITERS.items():
        d = os.path.join(args.workdir, "formats", fmt)
        if _done(d, params):
            out[fmt] = (d, None)
            continue
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        t0 = time.perf_counter()
        try:
            write(samples, d, params["shard_bytes"])
        except Exception as e:   # a peer that does not install or write: said in the report
            out[fmt] = (d, f"writing {fmt} failed: {type(e).__name__}: {str(e)[:300]}")
            print(f"# {out[fmt][1]}", file=sys.stderr)
            continue
        _mark(d, params)
        print(f"# wrote {fmt} under {d} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        out[fmt] = (d, None)
    return out


# -- the readers (each in a worker process) ---------------------------------------

class Reader:
    """setup() once; measure(passes, seconds) -> (samples, bytes, {more}) of
    `passes` whole passes; a pass that misses samples is an error, unless
    the reader stopped it at the time bound (`seconds`, readers of batches
    only: then the samples it delivered, the bytes in proportion, and
    "partial" in the report)."""

    fmt = "wds"

    def __init__(self, cfg):
        self.cfg = cfg
        self.endpoint = cfg["endpoint"]
        self.keys = cfg["keys"][self.fmt]
        self.urls = [f"s3://{BUCKET}/{k}" for k in self.keys]
        self.samples = cfg["samples"]
        self.pass_bytes = cfg["format_bytes"][self.fmt]

    def skip_reason(self):
        return None

    def setup(self):
        pass

    def one_pass(self, deadline):
        """Samples delivered and more to report; a reader of batches stops
        after the batch that passes `deadline` (time.perf_counter())."""
        raise NotImplementedError

    def measure(self, passes, seconds=None):
        deadline = time.perf_counter() + seconds if seconds else float("inf")
        more, total = {}, 0
        for _ in range(passes):
            n, more = self.one_pass(deadline)
            total += n
            if n != self.samples:
                if n < self.samples and time.perf_counter() > deadline:
                    more = dict(more, partial=True)
                    break
                raise RuntimeError(f"a pass delivered {n} samples, not {self.samples}")
        return total, self.pass_bytes * total // self.samples, more


def _count(batches, deadline):
    """Samples in batches (counts), stopping after the one that passes deadline."""
    n = 0
    for count in batches:
        n += count
        if time.perf_counter() > deadline:
            break
    return n


class _Fastread(Reader):
    def skip_reason(self):
        try:
            import fastread  # noqa: F401
            from fastread.engine import s3_version
        except ImportError as e:
            return f"no fastread: {e}"
        why = s3_version()[1]
        return f"fastread has no s3 engine ({why})" if why else None

    def options(self):
        import fastread
        return fastread.S3Options(endpoint_url=self.endpoint, region=self.cfg["region"],
                                  access_key_id=self.cfg["access_key"],
                                  secret_access_key=self.cfg["secret_key"],
                                  **self.cfg.get("s3_options", {}))


class FastreadWdsReader(_Fastread):
    def setup(self):
        import fastread
        from fastread.formats import WebDataset
        # Indexed here, once (every shard streamed): setup, not measured.
        source = WebDataset(self.urls, ["jpg", "cls"], s3=self.options())
        # One Reader, an epoch per pass, as a training loop uses it.
        self.reader = fastread.Reader(source=source, batch_size=BATCH)

    def one_pass(self, deadline):
        before = self.reader.stats().get("s3_requests", 0)
        n = _count((len(arrays) for arrays, _labels in self.reader), deadline)
        return n, {"s3_requests": self.reader.stats().get("s3_requests", 0) - before}


class FastreadWdsNoAheadReader(FastreadWdsReader):
    """fastread-wds without the next-shard read-ahead (an A/B of
    _WholeShards.AHEAD_SCAN, a private knob: 0 turns it off)."""

    def setup(self):
        from fastread.formats import webdataset
        webdataset._WholeShards.AHEAD_SCAN = 0
        super().setup()


def _no_dali():
    """Why DALI cannot be used here, or None."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as e:
        return f"no DALI: {e}"
    return None


def _wds_pipe(webdataset, urls, **kwargs):
    """A built CPU pipeline of batches of BATCH (jpg, cls) from a DALI
    webdataset reader op (DALI's or fastread's) over the shard URLs."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=BATCH, num_threads=os.cpu_count(), device_id=None,
                  prefetch_queue_depth=2)
    def pipe():
        jpg, cls = webdataset(paths=urls, ext=["jpg", "cls"], name="wds", **kwargs)
        return jpg, cls
    built = pipe()
    built.build()
    return built


class FastreadWdsAhead1Reader(FastreadWdsReader):
    """fastread-wds reading one shard ahead instead of _WholeShards.AHEAD_SHARDS
    (an A/B of that private knob)."""

    def setup(self):
        from fastread.formats import webdataset
        webdataset._WholeShards.AHEAD_SHARDS = 1
        super().setup()


class FastreadDaliReader(_Fastread):
    def skip_reason(self):
        return _no_dali() or super().skip_reason()

    def setup(self):
        from fastread.dali import readers
        self.pipe = _wds_pipe(readers.webdataset, self.urls, s3=self.options())

    def one_pass(self, deadline):
        # The reader rolls over epochs (as DALI's do): a pass is one epoch's
        # worth of samples, counted from the batches (the last one padded
        # from the next epoch: at most BATCH - 1 samples of it).
        n = 0
        while n < self.samples:
            jpg, _cls = self.pipe.run()
            n += len(jpg)
            if time.perf_counter() > deadline:
                return n, {}
        return self.samples if n - self.samples < BATCH else n, {}


class ReadFilesReader(_Fastread):
    def setup(self):
        import fastread
        from fastread.engine import cached_context
        self.fastread = fastread
        self.opts = self.options()
        self.fastread.read_files(self.urls[:1], s3=self.opts)   # the context, opened
        # The context read_files() reads with (its cache's), for its counters.
        self.ctx = cached_context("s3", None, all_cpus=True, s3=self.opts)

    def one_pass(self, deadline):
        before = self.ctx.stats()
        arrays = self.fastread.read_files(self.urls, s3=self.opts)
        got = sum(a.nbytes for a in arrays)
        if got != self.pass_bytes:
            raise RuntimeError(f"read {got} bytes, the shards hold {self.pass_bytes}")
        after = self.ctx.stats()
        return self.samples, {
            "s3_requests": after.get("s3_requests", 0) - before.get("s3_requests", 0),
            "inflight_max": self.ctx.stat("s3_inflight_max"),
            "part_size": self.ctx.stat("part_size")}


def _shard_stream(obj):
    """s3torchconnector's README: each S3Reader as the {url, stream} that
    webdataset's tar_file_expander takes."""
    return {"url": obj.key, "stream": obj}


def _count_samples(batch):
    return len(batch)


class _TarSamples:
    """An IterableDataset of the samples of an S3IterableDataset's shards
    (webdataset's tar_file_expander + group_by_keys over the streams)."""

    def __init__(self, shards):
        self.shards = shards

    def __iter__(self):
        from webdataset.tariterators import group_by_keys, tar_file_expander
        for sample in group_by_keys(tar_file_expander(iter(self.shards))):
            yield len(sample["jpg"])


class S3TorchReader(Reader):
    def skip_reason(self):
        try:
            import s3torchconnector  # noqa: F401
            import torch  # noqa: F401
            import webdataset  # noqa: F401
        except ImportError as e:
            return f"no s3torchconnector/torch/webdataset: {e} (pip install s3torchconnector webdataset)"
        return None

    def setup(self):
        import torch.utils.data
        from s3torchconnector import S3ClientConfig, S3IterableDataset
        shards = S3IterableDataset.from_objects(
            self.urls, region=self.cfg["region"], endpoint=self.endpoint,
            transform=_shard_stream, enable_sharding=True,
            s3client_config=S3ClientConfig(force_path_style=True))

        class Samples(_TarSamples, torch.utils.data.IterableDataset):
            pass
        self.loader = torch.utils.data.DataLoader(
            Samples(shards), batch_size=BATCH, num_workers=self.cfg["loader_workers"],
            persistent_workers=True, collate_fn=_count_samples, prefetch_factor=2)

    def one_pass(self, deadline):
        return _count(self.loader, deadline), {}


class DaliWdsReader(Reader):
    def skip_reason(self):
        return _no_dali()

    def setup(self):
        from nvidia.dali import fn
        self.pipe = _wds_pipe(fn.readers.webdataset, self.urls)

    one_pass = FastreadDaliReader.one_pass


class Boto3Reader(Boto3Gets, Reader):
    """get_object of each key in a ThreadPoolExecutor(THREADS) (_harness.Boto3Gets)."""

    def one_pass(self, deadline):
        got = sum(self.pool.map(self._get, self.keys))
        if got != self.pass_bytes:
            raise RuntimeError(f"read {got} bytes, the shards hold {self.pass_bytes}")
        return self.samples, {"inflight_max": min(self.THREADS, len(self.keys))}


class _Cached(Reader):
    """A loader that downloads shards into a local cache and reads them
    there: each pass gets a fresh cache directory under the worker's
    scratch (--workdir/cache), removed after, so every pass downloads."""

    def cache_dir(self):
        d = tempfile.mkdtemp(prefix=f"{self.cfg['reader']}-", dir=self.cfg["scratch"])
        self._made = d
        return d

    def drop_cache(self):
        shutil.rmtree(self._made, ignore_errors=True)

    def count_pass(self, ds, loader_class, deadline):
        """One pass of loader_class over ds (a dataset on cache_dir()): its
        samples, the dataset and its cache dropped after, and the note."""
        try:
            loader = loader_class(ds, batch_size=BATCH, num_workers=self.cfg["loader_workers"],
                                  collate_fn=_count_samples)
            n = _count(loader, deadline)
        finally:
            del ds
            self.drop_cache()
        return n, {"note": self.note} if self.note else {}


class MosaicReader(_Cached):
    fmt = "mds"

    def skip_reason(self):
        try:
            self.note = import_streaming()
        except Exception as e:
            return f"mosaicml-streaming does not import: {type(e).__name__}: {str(e)[:300]}"
        return None

    def one_pass(self, deadline):
        import torch.utils.data
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
        return self.count_pass(
            StreamingDataset(remote=f"s3://{BUCKET}/{PREFIX['mds']}", local=self.cache_dir(),
                             batch_size=BATCH, shuffle=False),
            torch.utils.data.DataLoader, deadline)


class LitdataReader(_Cached):
    fmt = "litdata"
    NOTE = ("litdata's obstore path refuses an http:// endpoint (BadScheme: it passes obstore "
            "no allow_http); measured: its boto3 path, what it uses where obstore is absent")

    def skip_reason(self):
        try:
            import litdata  # noqa: F401
        except Exception as e:
            return f"litdata does not import: {type(e).__name__}: {str(e)[:300]}"
        return None

    def setup(self):
        if self.endpoint.startswith("http://"):
            import litdata.constants
            import litdata.streaming.downloader
            litdata.constants._OBSTORE_AVAILABLE = False
            litdata.streaming.downloader._OBSTORE_AVAILABLE = False
            self.note = self.NOTE
        else:
            self.note = ""

    def one_pass(self, deadline):
        from litdata import StreamingDataLoader, StreamingDataset
        return self.count_pass(
            StreamingDataset(f"s3://{BUCKET}/{PREFIX['litdata']}", cache_dir=self.cache_dir(),
                             storage_options={"endpoint_url": self.endpoint,
                                              "aws_access_key_id": self.cfg["access_key"],
                                              "aws_secret_access_key": self.cfg["secret_key"],
                                              "region_name": self.cfg["region"]}),
            StreamingDataLoader, deadline)


class CurlReader(Reader):
    PARALLEL = 64
    RANGE = 0          # bytes per ranged GET; 0: whole objects

    def skip_reason(self):
        return curl_skip_reason()

    def jobs(self):
        if not self.RANGE:
            return [(k, None) for k in self.keys]
        out = []
        for k in self.keys:
            size = self.cfg["sizes"][k]
            out += [(k, f"{a}-{min(a + self.RANGE, size) - 1}") for a in range(0, size, self.RANGE)]
        return out

    def one_pass(self, deadline):
        jobs = self.jobs()
        # One block per transfer, `next` between them: a range (like the
        # signing and the output) is an option of its transfer.
        per = (f'aws-sigv4 = "aws:amz:{self.cfg["region"]}:s3"\n'
               f'user = "{self.cfg["access_key"]}:{self.cfg["secret_key"]}"\n'
               'write-out = "%{http_code} %{size_download}\\n"\noutput = "/dev/null"\n'
               'silent\nshow-error\n')
        with tempfile.NamedTemporaryFile("w", suffix=".curl", delete=False) as f:
            for i, (k, rng) in enumerate(jobs):
                if i:
                    f.write("next\n")
                f.write(f'url = "{self.endpoint}/{BUCKET}/{k}"\n{per}')
                if rng:
                    f.write(f'range = "{rng}"\n')
            config = f.name
        try:
            cmd = ["curl", "--parallel", "--parallel-max", str(self.PARALLEL), "--config", config]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        finally:
            os.unlink(config)
        lines = [line.split() for line in r.stdout.splitlines() if line.strip()]
        want = "206" if self.RANGE else "200"
        bad = [code for code, _ in lines if code != want]
        got = sum(int(size) for _, size in lines)
        if r.returncode != 0 or bad or got != self.pass_bytes:
            raise RuntimeError(f"curl status {r.returncode}, {len(bad)} answers not {want} "
                               f"({sorted(set(bad))[:5]}), {got} of {self.pass_bytes} bytes: "
                               f"{r.stderr[-500:]}")
        return self.samples, {"inflight_max": min(self.PARALLEL, len(jobs)), "requests": len(jobs)}


class CurlRangesReader(CurlReader):
    RANGE = 8 << 20


READER_CLASSES = {"fastread-wds": FastreadWdsReader, "fastread-wds-noahead": FastreadWdsNoAheadReader,
                  "fastread-wds-ahead1": FastreadWdsAhead1Reader,
                  "fastread-dali": FastreadDaliReader,
                  "read_files": ReadFilesReader, "s3torch": S3TorchReader,
                  "dali-wds": DaliWdsReader, "boto3": Boto3Reader, "mosaic": MosaicReader,
                  "litdata": LitdataReader, "curl": CurlReader, "curl-ranges": CurlRangesReader}


# -- the run ----------------------------------------------------------------------

def run(args):
    from s3_server import SeaweedFS
    ensure_dataset(args.dataset, args.classes, args.per_class)
    samples = tree_samples(args.dataset)
    os.makedirs(args.workdir, exist_ok=True)
    formats = ensure_formats(args, samples)
    skips, results, workers = {}, [], {}
    with SeaweedFS(os.path.join(args.workdir, "weed")) as server, \
            tempfile.TemporaryDirectory(prefix="s3shards-", dir=args.workdir) as tmp:
        keys, sizes, format_bytes = {}, {}, {}
        for fmt, (local, err) in formats.items():
            if err:
                continue
            uploaded = ensure_uploaded(server, BUCKET, local, PREFIX[fmt])
            # The data a pass reads: the shards (not the formats' index files).
            keys[fmt] = [k for k in uploaded if k.endswith(SHARD_SUFFIX[fmt])]
            for k in keys[fmt]:
                sizes[k] = os.path.getsize(os.path.join(local, k[len(PREFIX[fmt]) + 1:]))
            format_bytes[fmt] = sum(sizes[k] for k in keys[fmt])
        base = {"keys": {f: keys.get(f, []) for f in PREFIX}, "sizes": sizes,
                "samples": len(samples), "format_bytes": {f: format_bytes.get(f, 0) for f in PREFIX},
                "region": server.region, "access_key": server.access_key,
                "secret_key": server.secret_key, "loader_workers": args.loader_workers,
                "scratch": tmp}
        stack = []
        try:
            endpoints = open_endpoints(stack, server.endpoint, args.delays)
            for d in args.delays:
                ep, how, _pid = endpoints[d]
                env = dict(server.env(), AWS_ENDPOINT_URL=ep, AWS_ENDPOINT_URL_S3=ep,
                           S3_ENDPOINT_URL=ep)   # MosaicML streaming's endpoint variable
                for r in args.readers:
                    fmt = FORMAT_OF.get(r, "wds")
                    if formats[fmt][1]:
                        skips[f"{r}@{d}"] = formats[fmt][1]
                        continue
                    workers[(r, d)] = Worker(__file__, r, d, dict(base, endpoint=ep, env=env,
                                                                   how=how), tmp)
            for w in workers.values():   # one at a time: setups index shards
                if not w.wait_ready(args.setup_timeout):
                    skips[f"{w.reader}@{w.delay}"] = w.skip
                    print(f"# {w.reader} @ {w.delay} ms: skipped: {w.skip}", file=sys.stderr)
            # Untimed passes first: connections, arenas, DataLoader workers
            # and pipelines in their steady state (a first epoch's costs,
            # such as the kernel zeroing fresh arena pages, are not).
            for _ in range(args.warmup):
                for w in workers.values():
                    if not w.skip:
                        m = w.measure(args.timeout, passes=1, seconds=args.seconds)
                        if "error" in m:
                            print(f"# warm-up {w.reader} @ {w.delay} ms: {m['error']}",
                                  file=sys.stderr)
            for rnd in range(args.rounds):
                for d in args.delays:
                    for r in args.readers:
                        w = workers.get((r, d))
                        if w is None or w.skip:
                            continue
                        m = measure_round(w, server, endpoints[d], args.timeout,
                                          passes=args.passes, seconds=args.seconds)
                        m.update(reader=r, delay_ms=d, round=rnd, via=endpoints[d][1])
                        results.append(m)
                        if "error" in m:
                            print(f"# {r} @ {d} ms round {rnd}: {m['error']}", file=sys.stderr)
                        else:
                            print(f"# round {rnd} {r} @ {d} ms: {m['bytes'] / m['seconds'] / 1e9:.3f} GB/s",
                                  file=sys.stderr)
        finally:
            close_all(workers, stack)
    mods = ("fastread", "boto3", "nvidia.dali", "s3torchconnector", "torch", "webdataset",
            "litdata")
    vers = versions(mods)
    try:
        import_streaming()
        import streaming
        vers["streaming"] = streaming.__version__
    except Exception:
        vers["streaming"] = None
    return dict(report_base(args, vers),
                dataset={"dir": args.dataset, "samples": len(samples),
                         "formats": {f: {"objects": len(keys.get(f, [])),
                                         "bytes": format_bytes.get(f, 0)} for f in PREFIX}},
                latency="delays > 0: the delay proxy (tests/s3_proxy.py in a process of its own)",
                skipped=skips, measurements=results)


def _median(ms, f):
    return statistics.median(f(m) for m in ms)


def summarize(report):
    rows = rows_by_reader(report)
    ds = report["dataset"]
    fm = ", ".join(f"{f} {v['objects']} objects {v['bytes'] / 1e9:.3f} GB"
                   for f, v in ds["formats"].items())
    lines = summary_head(report) + [
             f"dataset: {ds['samples']} samples ({ds['dir']}); shards: {fm}",
             f"latency: {report['latency']}",
             "",
             "| reader | delay ms | samples/s | GB/s | % of ceiling | client CPU s/GB | "
             "server CPU s/GB | proxy CPU s/GB | requests in flight | rounds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ceiling = {}
    for (reader, delay), ms in rows.items():
        if reader in CEILINGS:
            gbs = _median(ms, lambda m: m["bytes"] / m["seconds"] / 1e9)
            ceiling[delay] = max(ceiling.get(delay, 0.0), gbs)
    for (reader, delay) in sorted(rows, key=lambda k: (k[1], READERS.index(k[0]))):
        ms = rows[(reader, delay)]
        sps = _median(ms, lambda m: m["objects"] / m["seconds"])
        gbs = _median(ms, lambda m: m["bytes"] / m["seconds"] / 1e9)
        cpu = _median(ms, lambda m: m["cpu_s"] / (m["bytes"] / 1e9))
        scpu = _median(ms, lambda m: m["server_cpu_s"] / (m["bytes"] / 1e9))
        pcpu = _median(ms, lambda m: m["proxy_cpu_s"] / (m["bytes"] / 1e9))
        inflight = inflight_cell(ms)
        partial = "*" if any(m.get("partial") for m in ms) else ""
        pct = f"{100 * gbs / ceiling[delay]:.0f}%" if ceiling.get(delay) else "?"
        lines.append(f"| {reader} | {delay} | {sps:,.0f} | {gbs:.3f} | {pct} | {cpu:.2f} | "
                     f"{scpu:.2f} | {pcpu:.2f} | {inflight} | {len(ms)}{partial} |")
    lines += summary_problems(report)
    notes = sorted({m["note"] for m in report["measurements"] if m.get("note")})
    lines += [f"note: {n}" for n in notes]
    lines.append("medians over rounds (*: partial passes, stopped at --seconds); GB = 1e9 bytes "
                 "of the format's shards per pass; "
                 "% of ceiling: of the faster curl row at that delay; client CPU = the reader's "
                 "process tree")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="/var/tmp/fastread-s3shards/tree",
                    help="tree of `fastread make-dataset` (made if missing)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=500,
                    help="images per class (default 500: 5,000 images, ~0.46 GB)")
    ap.add_argument("--shard-mb", type=int, default=64, help="shard size, MB (1e6 bytes)")
    ap.add_argument("--workdir", default="/var/tmp/fastread-s3shards",
                    help="the shards and the server's data (reused: no second write or upload)")
    ap.add_argument("--passes", type=int, default=1, help="whole passes per measurement")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="time bound of one measurement: a reader of batches stops there "
                         "(a partial pass, marked so)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes per reader first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delays", default="0,25", help="added latency, ms, comma-separated")
    ap.add_argument("--readers", default=",".join(DEFAULT_READERS),
                    help=f"comma-separated subset of {','.join(READERS)}")
    ap.add_argument("--loader-workers", type=int, default=2,
                    help="DataLoader workers of s3torch, mosaic, litdata")
    ap.add_argument("--setup-timeout", type=float, default=300.0)
    ap.add_argument("--timeout", type=float, default=600.0, help="bound of one measurement, s")
    return parse_tail(ap, argv, READERS, delay=int)


def main(argv=None):
    return _harness.main(argv, parse_args, run, summarize, READER_CLASSES)


if __name__ == "__main__":
    sys.exit(main())

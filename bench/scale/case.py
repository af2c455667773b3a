"""One row of the scale family, in a process of its own (its parent polls
its threads and descriptors and takes its peak RSS from wait4).

    python bench/scale/case.py SPEC.json      # prints one line "SCALE-RESULT {json}"

SPEC: {"impl": ..., "kind": ..., "n": N, "data": {...}, "batch_size": B,
"workers": W or null, "nofile": soft RLIMIT_NOFILE or null, "max_batches":
null (one epoch) or a bound, "verify": bool, "variant": {...}}.

What is timed: the modules the impl needs are imported first (not timed:
"imports excluded"), then the clock starts; ``startup_s`` is the time to
build the reader or pipeline and get its first batch, ``epoch_s`` the
whole epoch (or max_batches batches) from the same start, and
``samples_per_s`` the samples after the first batch over the time after
it (steady state). ``base_rss_mb`` is VmRSS after the imports, before the
clock starts. With verify, every sample's first 8 bytes (its number, see
generate.py) are collected and the epoch must hold each sample once.

impls: fastread (Reader over files, a packed image, WebDataset, Squirrel,
S3 objects or S3 WebDataset shards), dali-file (fn.readers.file),
dali-wds (fn.readers.webdataset, with or without wds2idx index files),
webdataset (the webdataset library), mds (MosaicML streaming), litdata.
Each runner is a generator of per-batch sample arrays (lists of bytes-like
objects) or of sample counts when verify is off and counting is cheaper.
"""
import inspect
import json
import os
import resource
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def vm_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def vm_hwm_mb():
    """This process's peak RSS since its exec (VmHWM). Not ru_maxrss: Linux
    keeps the forking parent's high-water mark across exec, so a child of a
    large parent would report the parent's."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def accepts(fn, name):
    """Whether callable fn takes keyword ``name`` (today's API or a newer one)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# -- fastread -----------------------------------------------------------------------------

def _fastread_source(spec, path):
    import fastread

    kind, data, variant = spec["kind"], spec["data"], spec.get("variant") or {}
    if kind == "files":
        path["source"] = "file_root"
        return {"file_root": data["root"]}
    if kind == "image":
        path["source"] = "PackedImage"
        return {"image": data["image"]}
    if kind in ("wds", "s3-wds"):
        kw = {}
        if kind == "s3-wds":
            kw["s3"] = fastread.S3Options(**data["s3"])
        if variant.get("index_files"):
            if accepts(fastread.WebDataset, "index_paths"):
                kw["index_paths"] = data["index_paths"]
                path["index_files"] = "index_paths"
            else:
                raise Unsupported("WebDataset(index_paths=) not in this fastread")
        elif accepts(fastread.WebDataset, "index_paths"):
            path["index_files"] = "none given"
        src = fastread.WebDataset(data["shards"], list(data.get("ext", ["jpg", "cls"])), **kw)
        path["source"] = "/".join(c.__name__ for c in type(src).__mro__[:3])
        return {"source": src}
    if kind == "squirrel":
        src = fastread.SquirrelStore(data["root"], keys=("image", "label"),
                                     cache_dir=data["cache_dir"])
        path["source"] = "/".join(c.__name__ for c in type(src).__mro__[:3])
        return {"source": src}
    if kind == "s3-files":
        path["source"] = "file_root s3://"
        return {"file_root": data["url"], "engine": "s3", **data["s3"]}
    raise ValueError(f"fastread: unknown kind {kind!r}")


class Unsupported(Exception):
    """The variant needs an option this build does not have (the row says so)."""


def run_fastread(spec, path):
    import fastread

    variant = spec.get("variant") or {}
    shuffle = variant.get("shuffle", "global")
    # Before the source is built (an index of 10^6 samples takes a while).
    # Block shuffles are random_shuffle="block" (with shuffle_block /
    # shuffle_window, their defaults here).
    if shuffle == "block" and not accepts(fastread.Reader, "shuffle_block"):
        raise Unsupported("Reader(random_shuffle='block') not in this fastread")
    kw = _fastread_source(spec, path)
    if spec.get("workers"):
        kw["workers"] = spec["workers"]
    if shuffle == "block":
        kw["random_shuffle"] = "block"
    elif shuffle == "global":
        kw["random_shuffle"] = True
    for opt in ("max_open_files",):
        path[opt] = ("accepted" if accepts(fastread.Reader, opt) or
                     opt in getattr(fastread.EngineOptions, "__dataclass_fields__", {})
                     else "not in this fastread")
    reader = fastread.Reader(batch_size=spec["batch_size"], seed=0, **kw)
    path["workers"] = getattr(reader, "workers", None)
    path["shuffle"] = shuffle
    src = reader.source
    mem = getattr(reader, "memory", None)
    try:
        verify = spec.get("verify")
        for arrays, _labels in reader:
            if verify and spec["kind"] in ("wds", "s3-wds"):
                arrays = src.components(arrays, _labels)[0]
            elif verify and spec["kind"] == "squirrel":
                arrays = src.fields(arrays, _labels)[0]
            yield arrays if verify else len(arrays)
        if callable(mem):
            try:
                path["memory"] = {k: int(v) for k, v in dict(mem()).items()
                                  if isinstance(v, (int, np.integer))}
            except Exception as e:  # a newer API's shape: say so, do not fail the row
                path["memory"] = f"{type(e).__name__}: {e}"
    finally:
        reader.close()


# -- DALI ---------------------------------------------------------------------------------

def _dali_batches(pipe, n, batch_size, verify):
    pipe.build()
    left = n
    while left > 0:
        out = pipe.run()
        k = min(batch_size, left)
        left -= k
        if verify:
            t = out[0]
            yield [np.array(t[i]) for i in range(k)]
        else:
            yield k


def run_dali_file(spec, path):
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=spec["batch_size"], num_threads=spec.get("workers") or 4,
                  device_id=None, prefetch_queue_depth=2, seed=0)
    def pipe():
        data, labels = fn.readers.file(file_root=spec["data"]["root"], random_shuffle=True,
                                       name="Reader")
        return data, labels

    path["source"] = "fn.readers.file(random_shuffle=True)"
    yield from _dali_batches(pipe(), spec["n"], spec["batch_size"], spec.get("verify"))


def run_dali_wds(spec, path):
    from nvidia.dali import fn, pipeline_def

    data = spec["data"]
    kw = {}
    if (spec.get("variant") or {}).get("index_files"):
        kw["index_paths"] = data["index_paths"]
        path["index_files"] = "wds2idx v1.2"
    else:
        path["index_files"] = "none (DALI infers them)"

    @pipeline_def(batch_size=spec["batch_size"], num_threads=spec.get("workers") or 4,
                  device_id=None, prefetch_queue_depth=2, seed=0)
    def pipe():
        jpg, cls = fn.readers.webdataset(paths=data["shards"], ext=["jpg", "cls"],
                                         random_shuffle=True, name="Reader", **kw)
        return jpg, cls

    path["source"] = "fn.readers.webdataset(random_shuffle=True)"
    yield from _dali_batches(pipe(), spec["n"], spec["batch_size"], spec.get("verify"))


# -- the webdataset library -------------------------------------------------------------

def run_webdataset(spec, path):
    import webdataset as wds

    # Raw samples (dicts of bytes, no decoding), in order: the library
    # streams shards; its shuffle is a buffer, not an epoch permutation.
    ds = wds.WebDataset(spec["data"]["shards"], shardshuffle=False, empty_check=False)
    path["source"] = "webdataset.WebDataset(shardshuffle=False), raw samples in order"
    yield from _chunk(iter(ds), spec, lambda s: s["jpg"])


def _chunk(it, spec, pick):
    b = spec["batch_size"]
    verify = spec.get("verify")
    # next() only: litdata's __iter__ returns the dataset itself and starts
    # its epoch again, so a second `for s in it` would never end.
    while True:
        batch = []
        while len(batch) < b:
            try:
                batch.append(pick(next(it)))
            except StopIteration:
                break
        if not batch:
            return
        yield batch if verify else len(batch)
        if len(batch) < b:
            return


# -- peers in their own venv ------------------------------------------------------------

def run_mds(spec, path):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = StreamingDataset(local=spec["data"]["mds"], shuffle=True, shuffle_seed=0,
                          batch_size=spec["batch_size"])
    path["source"] = "streaming.StreamingDataset(local=, shuffle=True)"
    yield from _chunk(iter(ds), spec, lambda s: s["jpg"])


def run_litdata(spec, path):
    import litdata

    ds = litdata.StreamingDataset(input_dir=spec["data"]["litdata"], shuffle=True, seed=0)
    path["source"] = "litdata.StreamingDataset(shuffle=True)"
    yield from _chunk(iter(ds), spec, lambda s: s["jpg"])


RUNNERS = {"fastread": run_fastread, "dali-file": run_dali_file, "dali-wds": run_dali_wds,
           "webdataset": run_webdataset, "mds": run_mds, "litdata": run_litdata}
IMPORTS = {"fastread": ("fastread",), "dali-file": ("nvidia.dali",),
           "dali-wds": ("nvidia.dali",), "webdataset": ("webdataset",),
           "mds": ("streaming",), "litdata": ("litdata",)}


def _ids(batch):
    return [int.from_bytes(bytes(memoryview(a).cast("B")[:8]), "little") for a in batch]


def run(spec):
    row = {"impl": spec["impl"], "kind": spec["kind"], "n": spec["n"], "status": "ok",
           "path": {}}
    if spec.get("nofile"):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(spec["nofile"], hard) if hard != resource.RLIM_INFINITY else spec["nofile"]
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    row["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for mod in IMPORTS[spec["impl"]]:
        __import__(mod)
    row["base_rss_mb"] = vm_rss_mb()
    bound = spec.get("max_batches")
    samples = batches = 0
    seen = [] if spec.get("verify") else None
    t0 = time.perf_counter()
    t_first = None
    try:
        for b in RUNNERS[spec["impl"]](spec, row["path"]):
            k = b if isinstance(b, int) else len(b)
            if seen is not None:
                seen.extend(_ids(b))
            samples += k
            batches += 1
            if t_first is None:
                t_first = time.perf_counter()
                row["startup_s"] = t_first - t0
                row["rss_first_batch_mb"] = vm_rss_mb()
            if bound and batches >= bound:
                break
    except Unsupported as e:
        row.update(status="unsupported", error=str(e), hwm_mb=vm_hwm_mb())
        return row
    except Exception as e:
        row.update(status="failed", error=f"{type(e).__name__}: {e}"[:500],
                   traceback=traceback.format_exc()[-1500:])
    t_end = time.perf_counter()
    row.update(samples=samples, batches=batches, epoch_s=t_end - t0,
               bounded=bool(bound), rss_end_mb=vm_rss_mb(), hwm_mb=vm_hwm_mb())
    if t_first is not None and samples > 0:
        after = t_end - t_first
        first = min(spec["batch_size"], samples)
        row["samples_per_s"] = (samples - first) / after if after > 0 and samples > first \
            else samples / (t_end - t0)
    if row["status"] == "ok" and not bound and samples != spec["n"]:
        row.update(status="wrong", error=f"epoch gave {samples} samples, the set holds "
                                         f"{spec['n']}")
    if seen is not None and row["status"] == "ok":
        ids = np.asarray(seen, np.int64)
        uniq = np.unique(ids)
        row["verified"] = bool(len(uniq) == len(ids) and (bound or len(uniq) == spec["n"])
                               and (len(ids) == 0 or (uniq[0] >= 0 and uniq[-1] < spec["n"])))
        if not row["verified"]:
            row.update(status="wrong", error=f"{len(ids)} samples, {len(uniq)} distinct")
    return row


def main(argv):
    with open(argv[0]) as f:
        spec = json.load(f)
    row = run(spec)
    sys.stdout.flush()
    print("SCALE-RESULT " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

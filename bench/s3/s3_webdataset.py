"""WebDataset shards in S3 (SeaweedFS on loopback, started here through
tests/s3_server.py): samples per second of a fastread.Reader going through
the shards in order, reading them whole (s3_read="whole": each shard one
streamed object, cut in memory) against by member ranges
(s3_read="ranges": one ranged GET per sample), same shards, same run,
alternating rounds; plus ranges under a global shuffle, which whole shards
cannot serve. Bytes are checked against the local shards once.

    python bench/s3/s3_webdataset.py [--shards 8] [--shard-mb 16] [--sample-kb 100]
        [--batch 64] [--rounds 3]

This decided webdataset.S3_READ_RULE (the default of s3_read).
"""
import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import numpy as np  # noqa: E402

import fastread  # noqa: E402
import s3_server  # noqa: E402
from fastread.formats import WebDataset  # noqa: E402


def write_shards(root, shards, shard_bytes, sample_bytes, seed=0):
    """Tar shards of samples (a random .jpg of about sample_bytes and a
    .cls) to about shard_bytes each. Returns the paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for s in range(shards):
        path = os.path.join(root, f"shard-{s:06d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            total, i = 0, 0
            while total < shard_bytes:
                size = int(rng.integers(sample_bytes // 2, sample_bytes * 3 // 2))
                for ext, data in (("jpg", rng.integers(0, 256, size, np.uint8).tobytes()),
                                  ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:06d}_{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                total += size + 1024
                i += 1
        paths.append(path)
    return paths


def epoch(source, batch, **kw):
    r = fastread.Reader(source=source, batch_size=batch, **kw)
    t = time.perf_counter()
    n = 0
    for arrays, _ in r:
        n += len(arrays)
    dt = time.perf_counter() - t
    r.close()
    return n, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mb", type=int, default=16)
    ap.add_argument("--sample-kb", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="fastread-s3wds-") as tmp, \
            s3_server.SeaweedFS(os.path.join(tmp, "weed")) as srv:
        local = os.path.join(tmp, "shards")
        os.makedirs(local)
        paths = write_shards(local, args.shards, args.shard_mb << 20, args.sample_kb << 10)
        bucket = srv.make_bucket("wds-bench")
        opts = fastread.S3Options(endpoint_url=srv.endpoint, region=srv.region,
                                  access_key_id=srv.access_key, secret_access_key=srv.secret_key)
        urls = []
        for p in paths:
            with open(p, "rb") as f:
                fastread.s3.put_object(f"s3://{bucket}/{os.path.basename(p)}", f.read(), opts)
            urls.append(f"s3://{bucket}/{os.path.basename(p)}")
        t = time.perf_counter()
        sources = {m: WebDataset(urls, ["jpg", "cls"], s3=opts, s3_read=m)
                   for m in ("whole", "ranges")}
        index_s = (time.perf_counter() - t) / 2
        want = WebDataset(paths, ["jpg", "cls"])
        n = len(want)
        # Bytes once: both modes against the local shards.
        ref = [a.tobytes() for a, _ in zip(*next(iter(fastread.Reader(source=want,
                                                                       batch_size=n))))]
        for m, src in sources.items():
            got = next(iter(fastread.Reader(source=src, batch_size=n)))[0]
            assert [a.tobytes() for a in got] == ref, m
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(f"{args.shards} shards of ~{args.shard_mb} MB ({mb:.0f} MB, {n} samples of "
              f"~{args.sample_kb} KB), batch {args.batch}; indexing (streamed once): "
              f"{index_s:.2f} s per source")
        results = {"whole": [], "ranges": [], "ranges-shuffled": []}
        for r in range(args.rounds):
            for name, src, kw in (("whole", sources["whole"], {}),
                                  ("ranges", sources["ranges"], {}),
                                  ("ranges-shuffled", sources["ranges"],
                                   dict(random_shuffle=True, seed=r))):
                count, dt = epoch(src, args.batch, **kw)
                assert count == n
                results[name].append(n / dt)
                print(f"round {r}: {name:16s} {n / dt:9.0f} samples/s  {mb / dt:7.1f} MB/s")
        print("median samples/s: " + ", ".join(f"{k} {statistics.median(v):.0f}"
                                                for k, v in results.items()))


if __name__ == "__main__":
    main()

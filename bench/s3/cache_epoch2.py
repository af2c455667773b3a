"""Epoch 2 from the node-local object cache against the same tree read from
local disk with the same engine.

A real S3 server (SeaweedFS on loopback, tests/s3_server.py) gets --objects
objects of --size bytes; the same bytes are written as files under a local
directory. Epoch 1 reads every object with the s3 engine and cache_dir set
(all misses: fetched and stored). Then, in alternating rounds, the same
list is read (a) by URL through the s3 engine with the cache (all hits: the
cache's file engine, io_uring where it opens, reads the entries and checks
each one's size and checksum) and (b) by path from the local tree with that
file engine, same threads, same batches. Both are in the page cache.
A third reader, "fresh", is a new context each round, as a new process
(a DataLoader worker of the next epoch) would be: it checks every entry's
checksum on its first read (object_cache.h); "cache" is the context that
filled the cache, which checks sizes only.

    python bench/s3/cache_epoch2.py [--objects 2000] [--size 94208] [--batch 256]
        [--rounds 5] [--threads 4] [--dir /var/tmp]

Prints each round, then the medians and their ratio (cache / local).
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import fastread  # noqa: E402
import s3_server  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--size", type=int, default=92 * 1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--dir", default="/var/tmp", help="where the cache and the local tree go")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="fastread-cachebench-", dir=args.dir) as tmp, \
            s3_server.SeaweedFS(os.path.join(tmp, "weed")) as srv:
        bucket = srv.make_bucket("bench")
        rng = random.Random(1)
        local = os.path.join(tmp, "tree")
        os.makedirs(os.path.join(local, "obj"))
        keys = [f"obj/{i:06d}.jpg" for i in range(args.objects)]
        blobs = {}
        for k in keys:
            blobs[k] = rng.randbytes(args.size)
            with open(os.path.join(local, k), "wb") as f:
                f.write(blobs[k])
        srv.upload_tree(local, bucket)
        urls = [f"s3://{bucket}/{k}" for k in keys]
        paths = [os.path.join(local, k) for k in keys]
        opts = fastread.S3Options(endpoint_url=srv.endpoint, region=srv.region,
                                  access_key_id=srv.access_key, secret_access_key=srv.secret_key)
        cache_dir = os.path.join(tmp, "cache")
        cached = fastread.open_context("s3", s3=opts, cache_dir=cache_dir, threads=args.threads)
        t0 = time.perf_counter()
        for i in range(0, len(urls), args.batch):
            b = cached.read(urls[i:i + args.batch])
            assert not b.failures(), b.failures()
            for k, a in zip(keys[i:i + args.batch], b.arrays()):
                assert a.tobytes() == blobs[k]
        epoch1 = time.perf_counter() - t0
        st = cached.stats()
        assert st["cache_misses"] == len(urls), st
        file_engine = "io_uring" if cached.stat("cache_file.fixed_files") >= 0 or \
            fastread.engines()["io_uring"].files is True else "psync"
        plain = fastread.open_context(file_engine, threads=args.threads)

        def one_round(ctx, names):
            t = time.perf_counter()
            for i in range(0, len(names), args.batch):
                b = ctx.read(names[i:i + args.batch])
                assert not b.failures(), b.failures()
            return time.perf_counter() - t

        one_round(cached, urls)  # warm: the file engine opened, entries in the page cache
        one_round(plain, paths)
        total = args.objects * args.size
        times = {"cache": [], "fresh": [], "local": []}
        for r in range(args.rounds):
            fresh = fastread.Context("s3", **fastread.EngineOptions(
                s3=opts, cache_dir=cache_dir, threads=args.threads).resolve("s3"))
            for name, ctx, names in (("cache", cached, urls), ("fresh", fresh, urls),
                                     ("local", plain, paths)):
                s = one_round(ctx, names)
                times[name].append(s)
                print(f"round {r} {name:5s} {len(names) / s:10.0f} objects/s "
                      f"{total / s / 1e9:6.2f} GB/s")
        st = cached.stats()
        assert st["cache_misses"] == len(urls) and st["s3_requests"] == len(urls), st
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"epoch 1 (network, filling the cache): {len(urls) / epoch1:.0f} objects/s")
        print(f"objects {args.objects} x {args.size} B, batch {args.batch}, threads "
              f"{args.threads}, file engine {file_engine}")
        for k in ("cache", "fresh", "local"):
            print(f"median {k:5s} {len(urls) / med[k]:10.0f} objects/s "
                  f"{total / med[k] / 1e9:6.2f} GB/s")
        print(f"cache / local: {med['local'] / med['cache']:.3f}; "
              f"fresh / local: {med['local'] / med['fresh']:.3f}")


if __name__ == "__main__":
    main()

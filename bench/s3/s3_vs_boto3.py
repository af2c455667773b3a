"""Objects per second from a real S3 server (SeaweedFS on loopback, started
here through tests/s3_server.py): fastread's s3 engine (read_files, one
native call a batch) against boto3 get_object calls in a
ThreadPoolExecutor, same objects, same run, alternating rounds.

    python bench/s3/s3_vs_boto3.py [--objects 2000] [--size 94208] [--batch 256]
        [--boto-threads 32] [--rounds 3]

Prints one line per round and engine, then the medians. Both read every
object whole; bytes are checked once against what was uploaded.
"""
import argparse
import concurrent.futures
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
    ap.add_argument("--boto-threads", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="fastread-s3bench-") as tmp, \
            s3_server.SeaweedFS(tmp) as srv:
        bucket = srv.make_bucket("bench")
        rng = random.Random(1)
        blobs = {f"obj/{i:06d}.jpg": rng.randbytes(args.size) for i in range(args.objects)}
        c = srv.client(max_pool_connections=max(64, args.boto_threads))
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda kv: c.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                          blobs.items()))
        keys = sorted(blobs)
        urls = [f"s3://{bucket}/{k}" for k in keys]
        opts = fastread.S3Options(endpoint_url=srv.endpoint, region=srv.region,
                                  access_key_id=srv.access_key, secret_access_key=srv.secret_key)
        ctx = fastread.open_context("s3", s3=opts)
        # The same engine with no remembered sizes: every object probed
        # (first MiB into a buffer, then copied), as in a first epoch.
        resolved = fastread.EngineOptions(s3=opts).resolve("s3")
        unsized = fastread.Context("s3", **resolved, remember_sizes=0)

        def fastread_round(check=False, c=ctx):
            for i in range(0, len(urls), args.batch):
                batch = c.read(urls[i:i + args.batch])
                assert batch.failures() == [], batch.failures()
                if check:
                    for k, a in zip(keys[i:i + args.batch], batch.arrays()):
                        assert a.tobytes() == blobs[k]
                batch.release()

        def get(k):
            return c.get_object(Bucket=bucket, Key=k)["Body"].read()

        def boto_round(check=False):
            with concurrent.futures.ThreadPoolExecutor(args.boto_threads) as pool:
                for i in range(0, len(keys), args.batch):
                    got = list(pool.map(get, keys[i:i + args.batch]))
                    if check:
                        assert all(g == blobs[k] for g, k in zip(got, keys[i:i + args.batch]))

        fastread_round(check=True)  # warm-up and byte check
        boto_round(check=True)
        boto = f"boto3 x{args.boto_threads}"
        rates = {"fastread s3": [], "s3 sizes unknown": [], boto: []}
        for r in range(args.rounds):
            for name, fn in (("fastread s3", fastread_round),
                             ("s3 sizes unknown", lambda: fastread_round(c=unsized)),
                             (boto, boto_round)):
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                rates[name].append(len(keys) / dt)
                print(f"round {r}: {name:16s} {len(keys) / dt:9.0f} objects/s "
                      f"({len(keys) * args.size / dt / 1e6:7.1f} MB/s)", flush=True)
        print(f"{args.objects} objects of {args.size} bytes, batches of {args.batch}, "
              f"cpus {len(os.sched_getaffinity(0))}:")
        for name, v in rates.items():
            print(f"  {name:16s} median {statistics.median(v):9.0f} objects/s")
        print(f"  fastread: {ctx.stat('s3_requests')} requests, "
              f"{ctx.stat('s3_connections')} connections, "
              f"{ctx.stat('s3_inflight_max')} in flight at most, "
              f"{ctx.stat('s3_retries')} retries")


if __name__ == "__main__":
    main()

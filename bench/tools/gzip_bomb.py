"""Issue 43's gzip bomb, before and after: a ~2 MB gzip stream (one
member) that inflates to 2 GiB of zeros, as a Squirrel shard and as a
``.tar.gz`` WebDataset shard. Each is indexed in a fresh process, which
reports its peak RSS (ru_maxrss), its wall time and the error it raised.

``--before REV`` also runs the decompression of git revision REV
(``_gunzip_to`` of its ``formats/webdataset.py``, loaded beside the installed
fastread: the code as it was, without the bounds) on the same shards::

    python bench/tools/gzip_bomb.py --before 548de3b

Prints one JSON object per run. The figures in docs/benchmarks.md ("Untrusted
files") came from this script.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_bomb(path, gib, head=b""):
    """One gzip member of ``head`` then ``gib`` GiB of zeros, written in
    64 MiB steps."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(64 << 20)
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(gib * 16):
            f.write(z.compress(zeros))
        f.write(z.flush())
    return os.path.getsize(path)


CHILD = """
import json, os, resource, sys, time
t = time.perf_counter()
err = None
try:
{body}
except Exception as e:
    err = f"{{type(e).__name__}}: {{e}}"
print(json.dumps({{"seconds": round(time.perf_counter() - t, 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "error": err}}))
"""


def run(label, body, extra_env=None):
    code = CHILD.format(body=textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, **(extra_env or {}))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        out = {"failed": p.returncode, "stderr": p.stderr[-2000:]}
    out["run"] = label
    print(json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=int, default=2, help="GiB the bomb inflates to")
    ap.add_argument("--before", help="a git revision whose decompression to run too")
    ap.add_argument("--dir", help="where the shards and caches go (default: a temporary one)")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="fastread-bomb-")
    store = os.path.join(d, "store")
    os.makedirs(store, exist_ok=True)
    sq = os.path.join(store, "a.gz")
    size = make_bomb(sq, args.gib)
    tgz = os.path.join(d, "bomb.tar.gz")
    os.link(sq, tgz) if not os.path.exists(tgz) else None
    print(json.dumps({"bomb_bytes": size, "inflates_to": args.gib << 30}), flush=True)
    run("after: SquirrelStore", f"""
        import fastread.formats
        fastread.formats.SquirrelStore(shards=[{sq!r}], cache_dir={os.path.join(d, 'c1')!r})
    """)
    run("after: WebDataset .tar.gz", f"""
        import fastread.formats
        fastread.formats.WebDataset([{tgz!r}], ["jpg"], cache_dir={os.path.join(d, 'c2')!r})
    """)
    # A crafted one: a valid sample first, so only max_inflated (16 GiB by
    # default) bounds the inflating; the walk then fails at the zeros.
    import msgpack
    store2 = os.path.join(d, "store2")
    os.makedirs(store2, exist_ok=True)
    sq2 = os.path.join(store2, "a.gz")
    make_bomb(sq2, args.gib, head=msgpack.packb({"image": 1, "label": 2}))
    run("after: SquirrelStore, a valid sample then the zeros", f"""
        import fastread.formats
        fastread.formats.SquirrelStore(shards=[{sq2!r}], cache_dir={os.path.join(d, 'c4')!r})
    """)
    run("after: the same, max_inflated=256MiB", f"""
        import fastread.formats
        fastread.formats.SquirrelStore(shards=[{sq2!r}], cache_dir={os.path.join(d, 'c5')!r},
                                       max_inflated="256MiB")
    """)
    if args.before:
        old = os.path.join(d, "old_webdataset.py")
        with open(old, "wb") as f:
            f.write(subprocess.run(["git", "-C", ROOT, "show",
                                    f"{args.before}:src/fastread/formats/webdataset.py"],
                                   check=True, capture_output=True).stdout)
        run(f"before ({args.before}): _gunzip_to", f"""
            import importlib.util
            spec = importlib.util.spec_from_file_location("old_webdataset", {old!r})
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            os.makedirs({os.path.join(d, 'c3')!r}, exist_ok=True)
            mod._gunzip_to({sq!r}, {os.path.join(d, 'c3', 'copy')!r})
            err = "inflated whole: " + str(os.path.getsize({os.path.join(d, 'c3', 'copy')!r}))
            raise RuntimeError(err)
        """)
    if not args.dir:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

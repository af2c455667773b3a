"""Fuzzing fastread's parsers of user files: seeded mutations of valid
inputs, each read for one full epoch in a child process with memory and time
limits (tests/test_fuzz_formats.py runs a bounded number in CI;
docs/untrusted.md tells how to run more, and the coverage-guided runs).

A *target* is one parser: how to make its valid seed inputs, how to mutate
one (bit flips, interesting bytes, truncation, insertions, deletions,
duplicated spans, empty files, directories in place, and mutations that
know the format: tar sizes with the header checksum fixed, MessagePack
lengths, .npy shapes, packed-image indexes with their CRC fixed) and how to
read it (build the source, read every sample, cut it as a user would). Each
case is run in a fork of one prepared process (the *zygote*: fastread,
NumPy and msgpack imported once), with ``RLIMIT_AS`` and a wall-clock
alarm, and classified:

- ``ok``: it read (or refused nothing);
- ``clean``: it raised a ValueError or OSError (FormatError, NpyError,
  ImageError, ReadError, ...) whose message names the mutated file;
- ``unnamed``: such an error that does not name it;
- ``unclean``: any other exception (TypeError, KeyError, MemoryError,
  RecursionError, ...);
- ``crash``: the child died of a signal or exited without a result;
- ``hang``: it ran past the time limit.

A case is reproducible from (target, seed, case number) alone:
``python tests/fuzz_targets.py --target wds-tar --seed 43 --case 17 --show``.
Run as a script for figures (docs/untrusted.md)::

    python tests/fuzz_targets.py --cases 300 --seed 43
"""
import argparse
import gzip
import io
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import struct
import sys
import tarfile
import tempfile
import time
import traceback

# Set before NumPy is imported: OpenBLAS threads in the zygote would be
# copied into no fork (and cost memory in each).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

#: The address-space limit of a case (the issue's runs used 3 GB).
AS_LIMIT = 3 << 30
#: Wall-clock seconds a case may take before it counts as a hang.
TIME_LIMIT = 20
#: The bound on a case's peak resident memory (zygote's pages included).
RSS_BOUND = 256 << 20

INTERESTING = (0x00, 0xff, 0x7f, 0x80, 0x01, 0x20, 0x30, 0x37, 0x39, 0xc1, 0xdf, 0xdc)


# -- mutations ---------------------------------------------------------------------

def mutate_bytes(rng, data):
    """One to three generic mutations of ``data`` (bytes)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        n = len(b)
        if op == 0 and n:                       # bit flips
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(n)
                b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:                     # interesting bytes
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(n)] = rng.choice(INTERESTING)
        elif op == 2:                           # truncation
            del b[rng.randint(0, n):]
        elif op == 3:                           # insertion
            at = rng.randint(0, n)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 600)))
        elif op == 4 and n:                     # deletion
            at = rng.randrange(n)
            del b[at:at + rng.randint(1, 700)]
        elif op == 5 and n:                     # a span duplicated (overlapping members)
            at = rng.randrange(n)
            span = b[at:at + rng.randint(1, 1500)]
            to = rng.randint(0, len(b))
            b[to:to] = span
        elif op == 6:                           # junk appended
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000)))
        elif op == 7 and n >= 8:                # an 8-byte field set to a huge or negative value
            at = rng.randrange(n - 7)
            b[at:at + 8] = struct.pack("<q", rng.choice((-1, -2**63, 2**62, 2**31, 2**32 - 1)))
    return bytes(b)


def fix_tar_checksums(b):
    """Recomputes the checksum of every block that looks like a ustar
    header, so that a mutation inside one reaches past the checksum."""
    b = bytearray(b)
    for pos in range(0, len(b) - 511, 512):
        if b[pos + 257:pos + 262] == b"ustar":
            b[pos + 148:pos + 156] = b" " * 8
            b[pos + 148:pos + 156] = b"%06o\0 " % (sum(b[pos:pos + 512]) & 0o777777)
    return bytes(b)


def mutate_tar(rng, data):
    """A size field (octal, base-256, negative), a type flag or a name
    changed in a header, checksum fixed; or generic mutations, sometimes
    with the checksums fixed after."""
    heads = [p for p in range(0, len(data) - 511, 512) if data[p + 257:p + 262] == b"ustar"]
    b = bytearray(data)
    if heads and rng.random() < 0.5:
        pos = rng.choice(heads)
        what = rng.randrange(4)
        if what == 0:
            b[pos + 124:pos + 136] = rng.choice([b"77777777777\0", b"%011o\0" % rng.randrange(
                1 << 33), b"\x80" + (1 << 60).to_bytes(11, "big"), b"\xff" * 12,
                b"00000000000\0", b"99999999999\0"])
        elif what == 1:
            b[pos + 156] = rng.choice(b"0125679xgLKA\0")
        elif what == 2:
            name = rng.choice([b"", b"a", b"__meta__", b"x.y.z.jpg", b"../../etc/passwd",
                               b"\xff\xfe.jpg", b"d/" * 49 + b"j.jpg"])
            b[pos:pos + 100] = name[:100].ljust(100, b"\0")
        else:
            b[pos + 345:pos + 500] = bytes(rng.randrange(256) for _ in range(155))
        return fix_tar_checksums(b)
    out = mutate_bytes(rng, data)
    return fix_tar_checksums(out) if rng.random() < 0.5 else out


def mutate_msgpack(rng, data):
    """A length or count byte of a MessagePack header set to a large value,
    or generic mutations."""
    b = bytearray(data)
    spots = [i for i, c in enumerate(b) if c in (0xc4, 0xc5, 0xc6, 0xdc, 0xdd, 0xde, 0xdf,
                                                  0xd9, 0xda, 0xdb) or 0x80 <= c <= 0x9f]
    if spots and rng.random() < 0.5:
        i = rng.choice(spots)
        c = b[i]
        width = {0xc4: 1, 0xd9: 1, 0xc5: 2, 0xda: 2, 0xdc: 2, 0xde: 2}.get(c, 4 if c >= 0xc4
                                                                          else 0)
        if width:
            b[i + 1:i + 1 + width] = rng.choice([b"\xff" * width, b"\x7f" + b"\xff" * (width - 1),
                                                 bytes(width)])
        else:
            b[i] = (c & 0xf0) | rng.randrange(16)
        return bytes(b)
    return mutate_bytes(rng, data)


JSON_VALUES = (None, -1, 2**64, "x", [], {}, [1, 2], 0, 1.5, True, 4096, [[]] * 3, "[" * 50,
               "0x10", {"logical": 0}, [{"logical": "a", "physical": 0, "length": 1}])


def mutate_json(rng, doc):
    """A value somewhere in a JSON document (two levels deep at most)
    replaced by one of JSON_VALUES; ``doc`` is changed in place."""
    node = doc
    for _ in range(rng.randint(1, 3)):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = rng.choice(keys)
        child = node[key]
        if isinstance(child, (dict, list)) and child and rng.random() < 0.5:
            node = child
            continue
        node[key] = rng.choice(JSON_VALUES)
        break
    return doc


SHAPES = ["(0, 2**62, 2**62)", "(-1,)", "(2**40,)", "()", "(0,)", "(1,) * 70", "(3, 4)",
          "(1.5,)", "[2]", "'x'", "(True,)", "(2**63,)"]
DESCRS = ["'<f4'", "'|V0'", "'|O'", "'<U0'", "'>i8'", "'q9'", "[('a', '<i4')]", "'|S0'", "5"]


def mutate_npy(rng, data):
    """A header rewritten with another shape, dtype or order (kept 1.0 and
    padded as np.save pads), or generic mutations."""
    if rng.random() < 0.5:
        shape = eval(rng.choice(SHAPES)) if rng.random() < 0.8 else rng.choice(SHAPES)
        text = "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (
            rng.choice(DESCRS), rng.choice(["False", "True", "0"]),
            shape if isinstance(shape, str) else repr(shape))
        text = text.ljust(118) + "\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + \
            data[128:128 + rng.choice([0, 4, 8, 24, len(data)])]
    return mutate_bytes(rng, data)


# -- targets -----------------------------------------------------------------------

def _tar_bytes(members, fmt=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _wds_members(rng):
    out = []
    for k in range(rng.randint(2, 5)):
        out += [(f"s{k}.jpg", bytes(rng.randrange(256) for _ in range(rng.randint(0, 700)))),
                (f"s{k}.cls", str(k).encode())]
    return out


class Target:
    """One parser. ``seeds(rng)``: a list of valid inputs, each a dict of
    file name -> bytes; ``mutate(rng, files)``: the name of the file it
    mutated (the one the errors must name) and the new files; ``run(paths,
    work)``: read the input (``paths``: file name -> path) for one epoch."""

    name = ""
    main = ""          # the file the mutations change, unless mutate says otherwise

    def mutate(self, rng, files):
        files = dict(files)
        files[self.main] = self.mutate_one(rng, files[self.main])
        return self.main, files

    def mutate_one(self, rng, data):
        return mutate_bytes(rng, data)


def _epoch(src, cut=None):
    """Every sample of ``src`` read once, in batches, as a Reader's epoch
    reads them (native reader threads), each batch cut by ``cut``."""
    import fastread

    n = 0
    for arrays, labels in fastread.source.read_in_order(src, 16, engine="psync", workers=1):
        if cut is not None:
            cut(arrays, np.arange(n, n + len(arrays)))
        n += len(arrays)
    return n


class WdsTar(Target):
    name, main = "wds-tar", "a.tar"

    def seeds(self, rng):
        return [{"a.tar": _tar_bytes(_wds_members(rng), fmt)}
                for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)] + \
               [{"a.tar": _tar_bytes([("L" * 150 + "/x.jpg", b"J" * 600), ("L" * 150 + "/x.cls",
                                                                            b"1")],
                                     tarfile.PAX_FORMAT)}]

    def mutate_one(self, rng, data):
        return mutate_tar(rng, data)

    def run(self, paths, work):
        from fastread.formats import WebDataset

        src = WebDataset([paths[self.main]], ["jpg", "cls"], cache_dir=os.path.join(work, "c"))
        return _epoch(src, src.components)


class WdsTarGz(WdsTar):
    name, main = "wds-tar-gz", "a.tar.gz"

    def seeds(self, rng):
        return [{"a.tar.gz": gzip.compress(s["a.tar"], mtime=0)} for s in super().seeds(rng)]

    def mutate_one(self, rng, data):
        if rng.random() < 0.5:   # the tar inside mutated, then compressed again
            return gzip.compress(mutate_tar(rng, gzip.decompress(data)), mtime=0)
        return mutate_bytes(rng, data)


def _msgpack_samples(rng):
    import msgpack

    def array(a):
        return {b"nd": True, b"type": a.dtype.str, b"kind": b"", b"shape": list(a.shape),
                b"data": a.tobytes()}

    out = b""
    for k in range(rng.randint(1, 4)):
        img = np.frombuffer(bytes(rng.randrange(256) for _ in range(24)), np.uint8).reshape(2, 3, 4)
        out += msgpack.packb({"image": array(img), "label": k, "meta": {"k": [1, 2.5, "x"]}},
                             use_bin_type=True)
    return out


class Squirrel(Target):
    name, main = "squirrel", "a.gz"

    def seeds(self, rng):
        plain = [_msgpack_samples(rng) for _ in range(3)]
        return [{"a.gz": gzip.compress(p, mtime=0)} for p in plain] + [{"a.gz": plain[0]}]

    def mutate_one(self, rng, data):
        if data[:2] == b"\x1f\x8b" and rng.random() < 0.6:
            return gzip.compress(mutate_msgpack(rng, gzip.decompress(data)), mtime=0)
        return mutate_msgpack(rng, data)

    def run(self, paths, work):
        from fastread.formats import SquirrelStore

        src = SquirrelStore(shards=[paths[self.main]], keys=("image", "label"),
                            cache_dir=os.path.join(work, "c"))
        return _epoch(src, src.fields)


class CifarBin(Target):
    name, main = "cifar-bin", "data_batch_1.bin"

    def seeds(self, rng):
        recs = [bytes([rng.randrange(10)]) + bytes(rng.randrange(256) for _ in range(3072))
                for _ in range(3)]
        return [{self.main: b"".join(recs)}, {self.main: recs[0]}]

    def run(self, paths, work):
        import fastread
        from fastread.formats import cifar

        src = fastread.formats.Cifar10(None, files=[paths[self.main]])
        return _epoch(src, lambda arrays, _: cifar.to_hwc(arrays))


class CifarPickle(Target):
    name, main = "cifar-py", "data_batch_1"

    def seeds(self, rng):
        out = []
        for protocol in (2, 4, 5):
            n = rng.randint(1, 3)
            data = np.frombuffer(bytes(rng.randrange(256) for _ in range(n * 3072)),
                                 np.uint8).reshape(n, 3072)
            entry = {b"batch_label" if protocol == 2 else "batch_label": "x",
                     "labels": [rng.randrange(10) for _ in range(n)], "data": data}
            out.append({self.main: pickle.dumps(entry, protocol=max(protocol, 3))})
        return out

    run = CifarBin.run


class Npy(Target):
    name, main = "npy", "a.npy"

    def seeds(self, rng):
        out = []
        for a in (np.arange(6, dtype="<i4").reshape(2, 3), np.zeros((2, 2), ">f8", order="F"),
                  np.zeros(0, np.uint8), np.array(3.5), np.zeros(3, [("a", "<i2"), ("b", "u1")])):
            f = io.BytesIO()
            np.save(f, np.asfortranarray(a) if a.ndim > 1 and not a.flags.c_contiguous else a)
            out.append({self.main: f.getvalue()})
        return out

    def mutate_one(self, rng, data):
        return mutate_npy(rng, data)

    def run(self, paths, work):
        import fastread
        from fastread.npy import NpyIndex, array_view

        p = paths[self.main]
        idx = NpyIndex.build([p], threads=1)
        (data,) = fastread.read_files([p], engine="psync")
        array_view(data, idx[0]).tobytes()
        return 1


class Features(Npy):
    """A .npy file as a FeatureStore (its own header parse and the row
    layout), every row gathered on the host."""
    name = "features-npy"

    def seeds(self, rng):
        out = []
        for a in (np.arange(12, dtype="<f4").reshape(3, 4), np.zeros((5, 2, 3), ">i2"),
                  np.arange(7, dtype=np.uint8)):
            f = io.BytesIO()
            np.save(f, a)
            out.append({self.main: f.getvalue()})
        return out

    def run(self, paths, work):
        import fastread

        store = fastread.FeatureStore(paths[self.main], device_id=-1, backend="host")
        try:
            store.gather(np.arange(store.rows), device="cpu")
        finally:
            store.close()
        return store.rows


class Packed(Target):
    """A packed image and its index: one of the two mutated (the index
    also as JSON, its CRC fixed up, so the fields are what is tested)."""
    name = "packed-image"

    def seeds(self, rng):
        import fastread

        d = tempfile.mkdtemp(prefix="fuzz-pack-")
        try:
            for c in range(2):
                os.makedirs(os.path.join(d, "tree", f"c{c}"))
                for j in range(2):
                    with open(os.path.join(d, "tree", f"c{c}", f"{j}.jpg"), "wb") as f:
                        f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 5000))))
            img = fastread.pack(os.path.join(d, "tree"), os.path.join(d, "x.img"),
                                progress=False, engine="psync")
            with open(img.path, "rb") as f, open(img.index_path, "rb") as g:
                return [{"x.img": f.read(), "x.img.index": g.read()}]
        finally:
            shutil.rmtree(d)

    def mutate(self, rng, files):
        from fastread import image as image_mod

        files = dict(files)
        which = rng.choice(["x.img", "x.img.index", "x.img.index"])
        data = files[which]
        if which == "x.img.index" and rng.random() < 0.5:
            doc = json.loads(data[data.index(b"\n") + 1:])
            files[which] = image_mod._encode_index(mutate_json(rng, doc))
        else:
            files[which] = mutate_bytes(rng, data)
        return which, files

    def run(self, paths, work):
        import fastread

        img = fastread.PackedImage(paths["x.img"], index=paths["x.img.index"])
        fastread.verify(img, engine="psync")
        return len(img)


class Bmap(Target):
    name, main = "bmap", "b.json"

    def seeds(self, rng):
        doc = {"a.jpg": {"startblock": 10, "endblock": 12, "size": 9000, "lba_size": 4096,
                         "extents": [{"logical": 0, "physical": 40960, "length": 12288,
                                      "flags": ["last"]}]},
               "b.jpg": {"startblock": "20", "endblock": "0x15"}}
        return [{self.main: json.dumps(doc).encode()}]

    def mutate_one(self, rng, data):
        if rng.random() < 0.5:
            return json.dumps(mutate_json(rng, json.loads(data))).encode()
        return mutate_bytes(rng, data)

    def run(self, paths, work):
        import fastread

        return len(fastread.load_bmap(paths[self.main]))


class FileListTarget(Target):
    """DALI's file_list text (``<path> <label>`` per line)."""
    name, main = "file-list", "list.txt"

    def seeds(self, rng):
        return [{self.main: b"a.jpg 0\nsub/b c.jpg 1\n\xe9.jpg 2\n", "a.jpg": b"x"}]

    def run(self, paths, work):
        import fastread

        paths_, labels = fastread.scan(work, file_list=paths[self.main])
        return len(paths_)


TARGETS = {t.name: t for t in (WdsTar(), WdsTarGz(), Squirrel(), CifarBin(), CifarPickle(),
                               Npy(), Features(), Packed(), Bmap(), FileListTarget())}


# -- one case ----------------------------------------------------------------------

def case_rng(target, seed, case):
    return random.Random(f"{seed}:{target}:{case}")


def make_case(target, seeds, seed, case, work):
    """Writes case ``case`` under ``work``: ``(paths, mutated path)``."""
    rng = case_rng(target.name, seed, case)
    base = seeds[rng.randrange(len(seeds))]
    kind = rng.random()
    if kind < 0.02:          # the file empty
        files, which = dict(base), target.main or sorted(base)[0]
        files[which] = b""
    else:
        which, files = target.mutate(rng, base)
    paths = {}
    for name, data in files.items():
        p = os.path.join(work, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if name == which and 0.02 <= kind < 0.03:
            os.mkdir(p)      # a directory in place of the file
        else:
            with open(p, "wb") as f:
                f.write(data)
        paths[name] = p
    return paths, paths[which]


def classify(exc, path):
    msg = str(exc)
    if not isinstance(exc, (ValueError, OSError)) or isinstance(exc, RecursionError):
        return "unclean"
    if path not in msg:
        return "unnamed"
    return "clean"


_WHERE = re.compile(r"at byte \d+|\[[^\]]*\]|record \d+|sample|member|key|field|line \d+|"
                    r"offset|header|extent|'[a-z_]+'")


def run_case(target, seeds, seed, case, work, seeds_only=False):
    """The case in this process: a result dict (never raises)."""
    os.makedirs(work, exist_ok=True)
    make = make_seed_case if seeds_only else make_case
    paths, mutated = make(target, seeds, seed, case, work)
    try:
        n = target.run(paths, work)
        return {"outcome": "ok", "samples": n}
    except BaseException as e:  # noqa: BLE001 - every exception is classified
        out = classify(e, mutated)
        res = {"outcome": out, "type": type(e).__name__, "error": str(e)[:1500],
               "where": bool(_WHERE.search(str(e)))}
        if out != "clean":
            res["traceback"] = traceback.format_exc()[-3000:]
        return res


def _child(target, seeds, seed, case, work, wfd, seeds_only):
    """In the fork: limits, the case, its result on the pipe, exit."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGALRM, signal.SIG_DFL)   # kills it, even inside a system call
        signal.alarm(TIME_LIMIT)
        res = run_case(target, seeds, seed, case, work, seeds_only)
        os.write(wfd, json.dumps(res).encode()[:60000])
    finally:
        os._exit(0)


def make_seed_case(target, seeds, seed, case, work):
    paths = {}
    for name, data in seeds[case].items():
        paths[name] = os.path.join(work, name)
        with open(paths[name], "wb") as f:
            f.write(data)
    return paths, paths[target.main or sorted(paths)[0]]


def run_cases(target, seed, cases, root, *, seeds_only=False):
    """Runs ``cases`` cases of ``target`` (numbers 0..cases-1), each in a
    fork of this process; yields (case, result) with ``peak_rss`` (bytes).
    ``seeds_only``: the seeds unmutated instead, one case each."""
    seeds = target.seeds(random.Random(f"{seed}:{target.name}:seeds"))
    if seeds_only:
        cases = range(len(seeds))
    for case in cases:
        work = os.path.join(root, f"{target.name}-{case}")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(target, seeds, seed, case, work, w, seeds_only)
        os.close(w)
        deadline = time.monotonic() + TIME_LIMIT + 10
        while True:
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                break
            if time.monotonic() > deadline:    # the alarm did not end it: kill it
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)
        with os.fdopen(r, "rb") as f:
            raw = f.read()
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGALRM, signal.SIGKILL):
            res = {"outcome": "hang", "signal": os.WTERMSIG(status)}
        elif os.WIFSIGNALED(status) or not raw:
            res = {"outcome": "crash", "status": status}
        else:
            res = json.loads(raw)
        res["peak_rss"] = usage.ru_maxrss * 1024
        shutil.rmtree(work, ignore_errors=True)
        yield case, res


def summary(results):
    """Counts and figures of ``[(target, case, result)]``."""
    out = {"cases": len(results), "peak_rss_max": 0}
    for k in ("ok", "clean", "unnamed", "unclean", "crash", "hang"):
        out[k] = sum(r["outcome"] == k for _, _, r in results)
    errors = [r for _, _, r in results if r["outcome"] in ("clean", "unnamed", "unclean")]
    out["errors"] = len(errors)
    out["named_pct"] = 100.0 * sum(r["outcome"] == "clean" for r in errors) / max(1, len(errors))
    out["where_pct"] = 100.0 * sum(bool(r.get("where")) for r in errors) / max(1, len(errors))
    out["peak_rss_max"] = max((r["peak_rss"] for _, _, r in results), default=0)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", choices=sorted(TARGETS),
                    help="a target (repeatable; default: all)")
    ap.add_argument("--cases", type=int, default=300, help="cases per target")
    ap.add_argument("--seed", type=int, default=43)
    ap.add_argument("--case", type=int, help="run this one case only")
    ap.add_argument("--show", action="store_true", help="with --case: print its result "
                    "and leave its files in --dir")
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--seeds", action="store_true",
                    help="read each target's seeds unmutated instead (all must read)")
    args = ap.parse_args(argv)
    names = args.target or sorted(TARGETS)
    import fastread  # noqa: F401 - imported once, in the zygote
    import msgpack  # noqa: F401
    root = args.dir or tempfile.mkdtemp(prefix="fastread-fuzz-")
    if args.case is not None and args.show:
        t = TARGETS[names[0]]
        seeds = t.seeds(random.Random(f"{args.seed}:{t.name}:seeds"))
        print(json.dumps(run_case(t, seeds, args.seed, args.case,
                                  os.path.join(root, f"{t.name}-{args.case}")), indent=1))
        return 0
    cases = [args.case] if args.case is not None else range(args.cases)
    results, t0 = [], time.monotonic()
    for name in names:
        t1 = time.monotonic()
        mine = [(name, c, r) for c, r in run_cases(TARGETS[name], args.seed, cases, root,
                                                    seeds_only=args.seeds)]
        results += mine
        s = summary(mine)
        print(f"{name:14s} {s['cases']:5d} cases {time.monotonic() - t1:6.1f} s: ok {s['ok']}, "
              f"errors {s['errors']} ({s['named_pct']:.1f}% name the file, "
              f"{s['where_pct']:.1f}% say where), unnamed {s['unnamed']}, "
              f"unclean {s['unclean']}, crashes {s['crash']}, hangs {s['hang']}, "
              f"peak RSS {s['peak_rss_max'] / 2**20:.0f} MiB", flush=True)
        for c, r in ((c, r) for _, c, r in mine if r["outcome"] not in ("ok", "clean")):
            print(f"  case {c}: {r['outcome']} {r.get('type', '')}: {r.get('error', '')[:300]}")
    s = summary(results)
    print(f"all: {s['cases']} cases in {time.monotonic() - t0:.0f} s, {s['errors']} errors, "
          f"{s['named_pct']:.1f}% naming the file, {s['where_pct']:.1f}% saying where; "
          f"{s['unnamed']} unnamed, {s['unclean']} unclean, {s['crash']} crashes, "
          f"{s['hang']} hangs, peak RSS {s['peak_rss_max'] / 2**20:.0f} MiB "
          f"(bound {RSS_BOUND >> 20} MiB)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "results": results}, f)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    bad = s["unnamed"] + s["unclean"] + s["crash"] + s["hang"]
    if args.seeds:
        bad = s["cases"] - s["ok"]
    return 1 if bad or s["peak_rss_max"] > RSS_BOUND else 0


if __name__ == "__main__":
    sys.exit(main())

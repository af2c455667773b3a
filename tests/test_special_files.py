"""Special files in path lists and trees, and files changing under a reader.

Every case runs in a fresh interpreter with a timeout, so a read that blocks
(a FIFO, /dev/zero) fails its test instead of hanging the suite. The answer
is always the file's exact bytes or a ReadError naming the path; the other
samples of the batch are never disturbed.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import fastread
from conftest import available_engines

ENGINES = [e for e in available_engines() if e in ("psync", "io_uring", "xnvme-file")]
# io_uring reads files of unknown size through direct descriptors on machines
# of 4 CPUs or more and through ordinary ones below: both, on any machine.
DIRECT = "io_uring/direct"
if "io_uring" in ENGINES:
    ENGINES.append(DIRECT)
TIMEOUT = 30

PRELUDE = """
import errno, json, os, sys, fastread
def outcome(paths, engine):
    # Per path: ["ok", bytes as latin-1] or ["err", errno, message, failing path]
    out = []
    for p in paths:
        try:
            a = fastread.read_files([p], engine=engine)
            out.append(["ok", a[0].tobytes().decode("latin-1")])
        except fastread.ReadError as e:
            out.append(["err", e.errno, str(e), os.fsdecode(e.filename)])
    return out
"""


def run_case(code, timeout=TIMEOUT):
    src = textwrap.dedent(PRELUDE) + textwrap.dedent(code)
    env = dict(os.environ)
    if repr(DIRECT) in src:  # io_uring, its unsized reads forced through direct descriptors
        src = src.replace(repr(DIRECT), repr("io_uring"))
        env["FASTREAD_ENGINE_ARGS"] = "unsized=direct"
    try:
        p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout}s (a read blocked): {e.stderr!r}")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def make_files(d, n=3):
    paths = []
    for i in range(n):
        p = os.path.join(d, f"good{i}.jpg")
        with open(p, "wb") as f:
            f.write(bytes([65 + i]) * (100 + i))
        paths.append(p)
    return paths


@pytest.mark.parametrize("engine", ENGINES)
def test_fifo_socket_devices_and_directories_fail_per_sample(tmp_path, engine):
    good = make_files(tmp_path)
    fifo = str(tmp_path / "fifo.jpg")
    os.mkfifo(fifo)
    sock_path = str(tmp_path / "sock.jpg")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(sock_path)
    d = tmp_path / "dir.jpg"
    d.mkdir()
    specials = {fifo: "a FIFO", sock_path: "a socket", "/dev/zero": "a character device",
                "/dev/urandom": "a character device", str(d): "a directory"}
    paths = [good[0], *specials, good[1]]
    try:
        res = run_case(f"""
            paths = {paths!r}
            single = outcome(paths, {engine!r})
            # The whole list in one batch: every special one fails, the rest are exact.
            try:
                fastread.read_files(paths, engine={engine!r})
                batch = None
            except fastread.ReadError as e:
                batch = sorted([os.fsdecode(p), err] for p, err in e.failures)
            print(json.dumps([single, batch]))
        """)
    finally:
        sock.close()
    single, batch = res
    assert single[0] == ["ok", "A" * 100] and single[-1] == ["ok", "B" * 101]
    for (path, kind), got in zip(specials.items(), single[1:-1]):
        assert got[0] == "err" and got[3] == path, got
        assert path in got[2] and kind in got[2], got
    assert sorted(p for p, _ in batch) == sorted(specials)


@pytest.mark.parametrize("engine", ENGINES)
def test_fifo_with_a_writer_does_not_block(tmp_path, engine):
    fifo = str(tmp_path / "fifo.jpg")
    os.mkfifo(fifo)
    res = run_case(f"""
        import threading
        fd = os.open({fifo!r}, os.O_RDWR)  # a writer that never closes
        os.write(fd, b"partial data")
        print(json.dumps(outcome([{fifo!r}], {engine!r})))
    """)
    assert res[0][0] == "err" and "a FIFO" in res[0][2]


@pytest.mark.parametrize("engine", ENGINES)
def test_symlinks_dangling_and_looping(tmp_path, engine):
    good = make_files(tmp_path, 1)[0]
    link = tmp_path / "link.jpg"
    link.symlink_to(good)
    dangling = tmp_path / "dangling.jpg"
    dangling.symlink_to(tmp_path / "missing")
    a, b = tmp_path / "loop_a.jpg", tmp_path / "loop_b.jpg"
    a.symlink_to(b)
    b.symlink_to(a)
    res = run_case(f"print(json.dumps(outcome({[str(link), str(dangling), str(a)]!r}, {engine!r})))")
    assert res[0] == ["ok", "A" * 100]
    assert res[1][:2] == ["err", 2] and "dangling symlink" in res[1][2]
    assert res[2][:2] == ["err", 40] and str(a) in res[2][2]  # ELOOP


@pytest.mark.parametrize("engine", ENGINES)
def test_odd_names_spaces_newlines_and_non_utf8(tmp_path, engine):
    d = os.fsencode(str(tmp_path))
    names = [b"with space.jpg", b"new\nline.jpg", b"latin1-\xe9\xff.jpg", b"what?.jpg",
             b"tab\there.jpg", b" leading.jpg"]
    paths = []
    for i, n in enumerate(names):
        p = os.path.join(d, n)
        with open(p, "wb") as f:
            f.write(bytes([i]) * (i + 10))
        paths.append(p)
    # bytes paths and their str (surrogateescape) forms both work
    res = run_case(f"""
        paths = {paths!r}
        got = fastread.read_files(paths, engine={engine!r})
        got2 = fastread.read_files([os.fsdecode(p) for p in paths], engine={engine!r})
        print(json.dumps([[a.tobytes().hex() for a in got], [a.tobytes().hex() for a in got2]]))
    """)
    want = [(bytes([i]) * (i + 10)).hex() for i in range(len(names))]
    assert res == [want, want]


@pytest.mark.parametrize("engine", ENGINES)
def test_very_long_path(tmp_path, engine):
    # 700+ bytes: past xNVMe's 383-byte URIs, within PATH_MAX.
    d = str(tmp_path)
    while len(d) < 700:
        d = os.path.join(d, "d" * 60)
        os.mkdir(d)
    p = os.path.join(d, "f.jpg")
    with open(p, "wb") as f:
        f.write(b"long path bytes")
    res = run_case(f"print(json.dumps(outcome([{p!r}], {engine!r})))")
    assert res == [["ok", "long path bytes"]]
    # Longer than PATH_MAX: a per-sample ENAMETOOLONG naming it.
    too_long = "/" + "x" * 5000
    res = run_case(f"print(json.dumps(outcome([{too_long!r}], {engine!r})))")
    assert res[0][:2] == ["err", 36] and res[0][3] == too_long


def tree_case(tmp_path, engine, change, epochs=2):
    """A Reader over a small tree reads an epoch (so it knows the sizes),
    then `change` (code using `victim` and `paths`) runs, then more epochs:
    returns per epoch ["ok", [bytes...]] or ["err", errno, msg, path]."""
    root = tmp_path / "tree"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(4):
            (root / f"c{c}" / f"{j}.jpg").write_bytes(bytes([c * 4 + j]) * (50 + j))
    return run_case(f"""
        import shutil
        results = []
        with fastread.Reader({str(root)!r}, batch_size=3, engine={engine!r}) as r:
            paths = list(r.paths)  # a PathTable: a sequence, not a list
            victim = paths[4]
            def one_epoch():
                got = []
                try:
                    for arrays, _ in r:
                        got.extend(a.tobytes().decode("latin-1") for a in arrays)
                    return ["ok", got]
                except fastread.ReadError as e:
                    return ["err", e.errno, str(e), os.fsdecode(e.filename)]
            results.append(one_epoch())
{textwrap.indent(textwrap.dedent(change), " " * 12)}
            for _ in range({epochs}):
                results.append(one_epoch())
        print(json.dumps([paths, results]))
    """)


def expected_epoch(paths):
    out = []
    for p in paths:
        c, j = int(p.split(os.sep)[-2][1:]), int(os.path.basename(p)[0])
        out.append(chr(c * 4 + j) * (50 + j))
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_file_vanishes_between_epochs(tmp_path, engine):
    paths, res = tree_case(tmp_path, engine, "os.remove(victim)")
    assert res[0] == ["ok", expected_epoch(paths)]
    for r in res[1:]:
        assert r[:2] == ["err", 2] and r[3] == paths[4]


@pytest.mark.parametrize("engine", ENGINES)
def test_file_truncated_or_grown_reads_as_it_is_now(tmp_path, engine):
    paths, res = tree_case(tmp_path, engine, """
        open(victim, "r+b").truncate(7)
        with open(paths[5], "ab") as f:
            f.write(b"z" * 100000)
    """)
    want = expected_epoch(paths)
    assert res[0] == ["ok", want]
    want[4] = want[4][:7]
    want[5] = want[5] + "z" * 100000
    assert res[1] == ["ok", want] and res[2] == ["ok", want]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("replacement", ["directory", "fifo", "chardev_link", "socket"])
def test_file_replaced_between_epochs(tmp_path, engine, replacement):
    make = {"directory": "os.mkdir(victim)",
            "fifo": "os.mkfifo(victim)",
            "chardev_link": "os.symlink('/dev/zero', victim)",
            "socket": "import socket; s = socket.socket(socket.AF_UNIX); s.bind(victim)"}
    kind = {"directory": "a directory", "fifo": "a FIFO", "chardev_link": "a character device",
            "socket": "a socket"}
    paths, res = tree_case(tmp_path, engine, f"os.remove(victim)\n{make[replacement]}\n")
    assert res[0] == ["ok", expected_epoch(paths)]
    for r in res[1:]:
        assert r[0] == "err" and r[3] == paths[4], r
        assert kind[replacement] in r[2], r


@pytest.mark.parametrize("engine", ENGINES)
def test_failure_does_not_disturb_the_next_batch(tmp_path, engine):
    paths, res = tree_case(tmp_path, engine, """
        os.remove(victim)
        os.mkfifo(victim)
        # After the failing batch, the epoch goes on with the next batches.
        it = iter(r)
        first = next(it)
        try:
            next(it)
            raise SystemExit("the batch with the FIFO did not fail")
        except fastread.ReadError as e:
            assert e.filename == victim, e
        rest = [a.tobytes().decode("latin-1") for arrays, _ in it for a in arrays]
        results.append(["rest", rest])
    """, epochs=0)
    assert res[1] == ["rest", expected_epoch(paths)[6:]]


@pytest.mark.parametrize("engine", ENGINES)
def test_tree_with_special_entries(tmp_path, engine):
    """A class directory holding, besides files, a directory named like a
    sample, a FIFO, a socket, a dangling symlink and a symlink to a FIFO:
    scan lists what fn.readers.file would (files and symlinks), the
    directory, FIFO and socket are skipped, and each listed entry that is no
    readable file fails its own sample, naming it, without blocking."""
    c0 = tmp_path / "tree" / "c0"
    c0.mkdir(parents=True)
    (c0 / "a.jpg").write_bytes(b"aaa")
    (c0 / "dir.jpg").mkdir()
    os.mkfifo(c0 / "fifo.jpg")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(c0 / "sock.jpg"))
    (c0 / "dangling.jpg").symlink_to(tmp_path / "missing")
    os.mkfifo(tmp_path / "elsewhere")
    (c0 / "to_fifo.jpg").symlink_to(tmp_path / "elsewhere")
    (c0 / "z.jpg").write_bytes(b"zz")
    root = str(tmp_path / "tree")
    try:
        res = run_case(f"""
            paths, _ = fastread.scan({root!r})
            print(json.dumps([paths, outcome(paths, {engine!r})]))
        """)
    finally:
        sock.close()
    paths, got = res
    names = [os.path.basename(p) for p in paths]
    assert names == ["a.jpg", "dangling.jpg", "to_fifo.jpg", "z.jpg"]
    assert got[0] == ["ok", "aaa"] and got[3] == ["ok", "zz"]
    assert got[1][:2] == ["err", 2] and "dangling symlink" in got[1][2]
    assert got[2][:2] == ["err", 22] and "a FIFO" in got[2][2] and got[2][3] == paths[2]


# -- the index builds of every format, and the other parsers of user files -------

# Each opens a path of the kind it reads where a special file stands; the
# answer must be an error naming that path and what it is, within the
# timeout (fastread._safe_open). {p} is the special path, {good} a regular
# .npy file beside it, {img} a packed image (its index {img}.index), {d} the
# directory.
OPENERS = {
    "webdataset": "fastread.formats.WebDataset([{p!r}], ['jpg'], cache_dir={d!r})",
    "webdataset-gz": "fastread.formats.WebDataset([{p!r} + '.gz'], ['jpg'], cache_dir={d!r})",
    "squirrel": "fastread.formats.SquirrelStore(shards=[{p!r}], keys=('x',), cache_dir={d!r})",
    "npy": "fastread.npy.NpyIndex.build([{good!r}, {p!r}])",
    "cifar-bin": "fastread.formats.Cifar10(None, files=[{p!r} + '.bin'])",
    "cifar-py": "fastread.formats.Cifar10(None, files=[{p!r}])",
    "image": "fastread.PackedImage({p!r}, index={img!r} + '.index')",
    "image-index": "fastread.PackedImage({img!r}, index={p!r})",
    "features": "fastread.FeatureStore({p!r}, 'float32', (1,), device_id=-1)",
    "bmap": "fastread.load_bmap({p!r})",
    "file-list": "fastread.scan({d!r}, file_list={p!r})",
    "decode": "raise OSError(fastread.decode.preprocess_one({p!r}, "
              "fastread.decode.Preprocess())[2])",
}
SPECIALS = ("fifo", "fifo_with_writer", "socket", "directory", "chardev_link", "link_to_fifo")
KIND = {"fifo": "a FIFO", "fifo_with_writer": "a FIFO", "socket": "a socket",
        "directory": "a directory", "chardev_link": "a character device",
        "link_to_fifo": "a FIFO"}


def make_special(d, name, special):
    """The special file ``special`` at ``d/name`` (and at ``name + '.gz'``
    and ``+ '.bin'``, for the openers that need those suffixes)."""
    for path in (os.path.join(d, name + s) for s in ("", ".gz", ".bin")):
        if special in ("fifo", "fifo_with_writer"):
            os.mkfifo(path)
        elif special == "socket":
            s = socket.socket(socket.AF_UNIX)
            s.bind(path)
            s.close()   # the socket file stays
        elif special == "directory":
            os.mkdir(path)
        elif special == "chardev_link":
            os.symlink("/dev/zero", path)
        elif special == "link_to_fifo":
            os.mkfifo(path + ".target")
            os.symlink(path + ".target", path)
    return os.path.join(d, name)


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    d = tmp_path_factory.mktemp("pack")
    (d / "tree" / "c0").mkdir(parents=True)
    (d / "tree" / "c0" / "a.jpg").write_bytes(b"abc")
    return fastread.pack(str(d / "tree"), str(d / "p.img"), progress=False).path


@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_index_builds_refuse_special_files_by_name(tmp_path, small_pack, opener, special):
    import numpy as np

    d = str(tmp_path)
    p = make_special(d, "shard", special)
    good = os.path.join(d, "good.npy")
    np.save(good, np.zeros(1, np.float32))
    code = OPENERS[opener].format(p=p, good=good, d=d, img=small_pack)
    res = run_case(f"""
        import fastread.decode, fastread.formats, fastread.npy
        if {special == "fifo_with_writer"!r}:
            fd = os.open({p!r}, os.O_RDWR)   # a writer that never closes
            os.write(fd, b"partial data")
        try:
            {code}
            print(json.dumps(["ok"]))
        except (OSError, ValueError) as e:
            print(json.dumps([type(e).__name__, str(e)]))
    """)
    assert res[0] != "ok", f"{opener} accepted {special} {p}"
    assert p in res[1] and KIND[special] in res[1], res


def test_special_file_error_is_a_read_error_that_pickles(tmp_path):
    """What a DataLoader worker or a Ray task raises comes back whole."""
    import pickle

    from fastread._safe_open import open_file
    from fastread.errors import SpecialFileError

    fifo = str(tmp_path / "f.tar")
    os.mkfifo(fifo)
    with pytest.raises(SpecialFileError) as e:
        open_file(fifo)
    err = pickle.loads(pickle.dumps(e.value))
    assert isinstance(err, fastread.ReadError) and err.kind == "a FIFO"
    assert err.filename == fifo and err.errno == 22 and str(err) == str(e.value)
    assert "not a regular file: a FIFO" in str(err)
    with pytest.raises(SpecialFileError) as e:
        open_file(str(tmp_path))
    assert e.value.errno == 21 and "a directory" in str(e.value)

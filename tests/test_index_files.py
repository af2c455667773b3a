"""WebDataset index files (fastread.formats._index_files, `fastread index`):
both formats round-trip and match the index built from the shards; DALI's
own fn.readers.webdataset reads our wds2idx files; a stale index (shard
rewritten) is refused when given and rebuilt when found; the node-local
cache is hit on the second open and memory-mapped; bad index files are named
in errors; a 10^7-sample synthetic index opens and reads with bounded RSS;
DALI wds2idx files parsed in C give what the Python reference gives (and
the same refusals, naming the file and the line); component offsets kept
in tar blocks where they fit, bytes where not, both round-tripping through
.fridx (version 1 and 2 files still read; version 3 writes lengths as uint32)."""
import glob
import os
import tarfile

import numpy as np
import pytest
from conftest import write_tar

from fastread.cli import main as cli
from fastread.datasets.webdataset import make_webdataset
from fastread.formats import FormatError
from fastread.formats import _index_files as ix
from fastread.formats.webdataset import WebDataset

EXT = ["jpg", "cls"]
OLD = 1_500_000_000  # shards' mtime set in the past: not "racy", so cacheable


def _age(paths):
    for p in paths:
        os.utime(p, (OLD, OLD))


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "wds"
    make_webdataset(root, shards=3, per_shard=30, width=16, height=12, seed=2)
    paths = sorted(glob.glob(str(root / "*.tar")))
    extra = write_tar(root / "zz.tar", [("a.b/k1.jpg", b"J"), ("a.b/k1.cls", b"1"),
                                        ("k2.jpg", b"JJ"), ("L" * 120 + ".cls", b"2")],
                     fmt=tarfile.GNU_FORMAT)
    paths.append(extra)
    _age(paths)
    return paths


def same(a, b):
    assert len(a) == len(b)
    assert a.index.start.tolist() == b.index.start.tolist()
    assert a.index.length.tolist() == b.index.length.tolist()
    assert np.asarray(a.component_offsets).tolist() == np.asarray(b.component_offsets).tolist()
    assert np.asarray(a.component_lengths).tolist() == np.asarray(b.component_lengths).tolist()
    assert list(a.names) == list(b.names)
    idx = np.arange(len(a))
    assert [x.tobytes() for x in a.read(idx)] == [x.tobytes() for x in b.read(idx)]


def test_fridx_round_trip(shards, tmp_path):
    built = WebDataset(shards, EXT, index_cache="off")
    out = tmp_path / "idx"
    assert cli(["index", *shards, "--ext", "jpg,cls", "--out", str(out)]) == 0
    per = [str(out / (os.path.basename(p) + ".fridx")) for p in shards]
    one = WebDataset(shards, EXT, index_paths=per, index_cache="off")
    assert one.index_origin == "index_paths"
    same(built, one)
    combined = str(tmp_path / "all.fridx")
    assert cli(["index", *shards, "--ext", "jpg", "--ext", "cls", "--combined", combined]) == 0
    whole = WebDataset(shards, EXT, index_paths=combined, index_cache="off")
    same(built, whole)
    assert whole.index_bytes()["index_mapped"]
    # Another spec is refused, naming the file.
    with pytest.raises(ix.StaleIndexError, match=r"all\.fridx.*index built for"):
        WebDataset(shards, ["jpg"], index_paths=combined, index_cache="off")


def test_wds2idx_round_trip_and_python_equivalence(shards, tmp_path):
    assert cli(["index", *shards, "--format", "wds2idx", "--out", str(tmp_path)]) == 0
    idx = [str(tmp_path / (os.path.basename(p).split(".")[0] + ".idx")) for p in shards]
    first = open(idx[0]).readline().split()
    assert first[0] == "v1.2" and int(first[1]) == 30
    for grouping in ("webdataset", "dali"):
        built = WebDataset(shards, EXT, grouping=grouping, index_cache="off", indexer="python")
        read = WebDataset(shards, EXT, grouping=grouping, index_paths=idx, index_cache="off")
        assert read.index.start.tolist() == built.index.start.tolist()
        assert np.asarray(read.component_offsets).tolist() == \
            np.asarray(built.component_offsets).tolist()
        idxs = np.arange(len(read))
        assert [x.tobytes() for x in read.read(idxs)] == [x.tobytes() for x in built.read(idxs)]


def test_dali_reads_our_wds2idx(shards, tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    plain = shards[:3]
    assert cli(["index", *plain, "--format", "wds2idx", "--out", str(tmp_path)]) == 0
    idx = [str(tmp_path / (os.path.basename(p).split(".")[0] + ".idx")) for p in plain]
    n = 90

    def run(**kw):
        @pipeline_def(batch_size=n, num_threads=2, device_id=None)
        def pipe():
            return tuple(fn.readers.webdataset(paths=plain, ext=EXT, **kw))
        p = pipe()
        p.build()
        return [[np.array(t[i]).tobytes() for i in range(n)] for t in p.run()]

    assert run(index_paths=idx) == run()
    ours = WebDataset(plain, EXT, grouping="dali", index_paths=idx, index_cache="off")
    arrays = ours.read(np.arange(n))
    comps = ours.components(arrays, np.arange(n))
    assert [[a.tobytes() for a in c] for c in comps] == run(index_paths=idx)


def test_stale_refused_or_rebuilt(shards, tmp_path):
    cache = str(tmp_path / "cache")
    out = tmp_path / "idx"
    assert cli(["index", *shards, "--ext", "jpg,cls", "--out", str(out)]) == 0
    assert cli(["index", *shards, "--format", "wds2idx", "--out", str(out)]) == 0
    fridx = [str(out / (os.path.basename(p) + ".fridx")) for p in shards]
    dali = [str(out / (os.path.basename(p).split(".")[0] + ".idx")) for p in shards]
    first = WebDataset(shards, EXT, index_cache=cache)
    assert first.index_origin == "built"
    # Rewrite the last shard: other members, another size.
    write_tar(shards[-1], [("q%d.jpg" % i, b"new" * 50) for i in range(5)])
    _age(shards[-1:])
    os.utime(shards[-1], (OLD + 7, OLD + 7))
    with pytest.raises(ix.StaleIndexError, match=r"stale index: shard .*zz\.tar"):
        WebDataset(shards, EXT, index_paths=fridx, index_cache="off")
    with pytest.raises(ix.StaleIndexError, match=r"zz\.idx.*stale or foreign"):
        WebDataset(shards, EXT, index_paths=dali, index_cache="off")
    again = WebDataset(shards, EXT, index_cache=cache)
    assert again.index_origin == "built"   # the cache entry's key changed with the shard
    fresh = WebDataset(shards, EXT, index_cache="off", indexer="python")
    same(again, fresh)
    # Same size, new mtime: stale all the same.
    before = os.path.getsize(shards[-1])
    write_tar(shards[-1], [("r%d.jpg" % i, b"old" * 50) for i in range(5)])
    assert os.path.getsize(shards[-1]) == before
    os.utime(shards[-1], (OLD + 9, OLD + 9))
    same(WebDataset(shards, EXT, index_cache=cache),
         WebDataset(shards, EXT, index_cache="off", indexer="python"))


def test_beside_files_used_and_stale_ones_ignored(shards):
    assert cli(["index", *shards, "--ext", "jpg,cls"]) == 0
    src = WebDataset(shards, EXT, index_cache="off")
    assert src.index_origin == "beside"
    write_tar(shards[0], [("x.jpg", b"1"), ("x.cls", b"2")])
    os.utime(shards[0], (OLD + 3, OLD + 3))
    again = WebDataset(shards, EXT, index_cache="off")
    assert again.index_origin == "built" and len(again) == 1 + 30 * 2 + 3
    same(again, WebDataset(shards, EXT, index_cache="off", indexer="python"))


def test_cache_hit_on_second_open(shards, tmp_path):
    cache = str(tmp_path / "cache")
    a = WebDataset(shards, EXT, index_cache=cache)
    assert a.index_origin == "built"
    assert len(os.listdir(cache)) == 1
    b = WebDataset(shards, EXT, index_cache=cache)
    assert b.index_origin == "cache" and b.index_bytes()["index_mapped"]
    same(a, b)
    # Another spec: another entry.
    c = WebDataset(shards, ["cls"], index_cache=cache)
    assert c.index_origin == "built" and len(os.listdir(cache)) == 2
    # The environment names the directory; "off" disables it.
    os.environ["FASTREAD_INDEX_CACHE_DIR"] = str(tmp_path / "env")
    try:
        WebDataset(shards, EXT)
        assert len(os.listdir(tmp_path / "env")) == 1
    finally:
        del os.environ["FASTREAD_INDEX_CACHE_DIR"]
    # Shards just written are not cached (their identity could repeat).
    fresh = write_tar(tmp_path / "new.tar", [("n.jpg", b"1")])
    WebDataset([fresh], EXT, index_cache=str(tmp_path / "racy"))
    assert not os.path.exists(tmp_path / "racy") or not os.listdir(tmp_path / "racy")
    # Least recently used entries past the bound go.
    ix.cache_prune(cache, keep=1)
    assert len(os.listdir(cache)) == 1
    # A damaged entry is rebuilt and replaced, not read.
    entry = os.path.join(cache, sorted(os.listdir(cache))[0])
    with open(entry, "r+b") as f:
        f.seek(70)
        f.write(b"garbage")
    for e in os.listdir(cache):
        p = os.path.join(cache, e)
        with open(p, "r+b") as f:
            f.seek(70)
            f.write(b"garbage")
    d = WebDataset(shards, EXT, index_cache=cache)
    assert d.index_origin == "built"
    same(a, d)


def test_bad_index_files_named(shards, tmp_path):
    one = shards[:1]
    good = str(tmp_path / "g.fridx")
    assert cli(["index", *one, "--ext", "jpg,cls", "--combined", good]) == 0
    data = open(good, "rb").read()
    cases = {"trunc.fridx": data[:len(data) // 2], "magic.fridx": b"FRIDX\0v9" + data[8:],
             "short.fridx": data[:30], "hdr.fridx": data[:80] + b"X" + data[81:]}
    for name, blob in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        with pytest.raises(FormatError, match=name.replace(".", r"\.")):
            WebDataset(one, EXT, index_paths=[str(p)], index_cache="off")
    for name, text in {"v9.idx": "v9 3\n", "count.idx": "v1.2 5\njpg 512 3 a.jpg\n",
                       "fields.idx": "v1.2 1\njpg 512\n",
                       "past.idx": "v1.1 1\njpg 512 999999999\n",
                       "nohdr.idx": "v1.1 1\njpg 700 3\n"}.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(FormatError, match=name.replace(".", r"\.")):
            WebDataset(one, EXT, index_paths=[str(p)], index_cache="off")
    with pytest.raises(ValueError, match="2 index files for 1 shards"):
        WebDataset(one, EXT, index_paths=[good, good], index_cache="off")
    assert cli(["index", str(tmp_path / "missing.tar"), "--ext", "jpg"]) == 1


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_of(path):
    """Bytes of ``path``'s mappings resident in this process (smaps)."""
    total, mine = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[2] + head[3]:
                mine = len(head) >= 6 and head[5] == path
            elif mine and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def test_ten_million_sample_index_opens_bounded(tmp_path):
    """A synthetic 10^7-sample index (arrays made directly, one sparse shard):
    opened from its file with the columns mapped, a few samples read and a
    shuffled epoch's first batch; RSS grows by a few pages, not by a
    column (bench/scale/index.py --synthetic measures 10^8)."""
    n = 10_000_000
    shard = tmp_path / "huge.tar"
    with open(shard, "wb") as f:
        f.truncate(n * 1024 + 1024)   # sparse: no disk used
    os.utime(shard, (OLD, OLD))
    size, mtime = ix.identity(str(shard))
    start = np.arange(n, dtype=np.int64) * 1024 + 512
    index = ix.WdsIndex({"ext": ["bin"], "case_sensitive": True, "grouping": "webdataset",
                         "missing": "empty"},
                        [{"path": str(shard), "size": size, "mtime_ns": mtime}],
                        np.array([n]), start, np.full(n, 512, np.int64),
                        np.zeros((n, 1), np.int32), np.full((n, 1), 512, np.uint32))
    path = str(tmp_path / "huge.fridx")
    index.write(path)
    del index, start
    before = _rss()
    src = WebDataset([str(shard)], ["bin"], index_paths=path, index_cache="off")
    assert len(src) == n
    picks = np.array([0, 12345, n - 1])
    arrays = src.read(picks)
    assert [a.size for a in arrays] == [512] * 3 and not any(a.any() for a in arrays)
    grown = _rss() - before
    mem = src.index_bytes()
    assert mem["index_mapped"] and mem["index_samples"] == n
    # Nothing per sample is made at open (shard numbers and labels are
    # mapped columns too): a few pages, not the 29 B a sample of before.
    assert grown <= 2 * n, f"RSS grew {grown} bytes for {n} samples"
    from fastread import Reader
    mapped = _rss_of(path)
    with Reader(source=src, batch_size=1, random_shuffle=True, seed=3, prefetch=1,
                workers=1) as r:
        mem = r.memory()
        assert mem["index_samples"] == n and mem["index_bytes"] >= 16 * n
        arrays, labels = next(iter(r))
        assert len(labels) == 1 and len(arrays[0]) == 512
        # The batches queued map the pages around their samples (the
        # kernel's fault-around, 64 KiB a fault; no read-ahead: MADV_RANDOM),
        # whatever n: a few MB here (34 MB with batches of 4), less than one
        # 4-byte column (40 MB), let alone the index (320 MB).
        paged = _rss_of(path) - mapped
    assert paged < 40 << 20, f"the first shuffled batch mapped {paged} bytes of the index"
    assert src.names[n - 1].endswith(f"huge.tar[{n - 1}]")
    print(f"RSS growth {grown / n:.1f} B a sample; a shuffled batch mapped {paged} B of the "
          f"index; {mem}")
    del src


def _wds2idx_cases():
    """wds2idx texts: valid ones (v1.1, v1.2, blank lines, tabs, CR) and
    malformed ones, plus seeded edits of them."""
    base = ["v1.2 3\njpg 512 10 a/s0.jpg cls 1536 1 a/s0.cls\n\njpg 2560 3 a/s1.jpg\n"
            "cls 3584 4 s2.cls\n",
            "v1.1\t2\r\njpg 512 10\tcls 1536 1\r\njpg 2560 3",
            "v1.2 0\n", "", "v2 1\n", "v1.2 1\njpg 512\n", "v1.2 2\njpg 512 1 a.jpg\n",
            "v1.1 1\njpg x 3\n", "v1.1 1\njpg 5 -3\n"]
    rng = np.random.default_rng(11)
    out = list(base)
    for _ in range(400):
        t = bytearray(base[int(rng.integers(2))].encode())
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(len(t)))
            t[at] = int(rng.choice(list(b" \t\n0123456789.vx-")))
        out.append(t.decode("latin-1"))
    return out


def test_wds2idx_native_parse_matches_the_reference(tmp_path):
    """fr_wds2idx_parse against the Python reference: the same members
    where both accept; the native one accepts nothing the reference
    refuses (it is stricter: decimal digits only), and its errors name the
    file and the line."""
    from fastread import _formats
    agree = refused = 0
    for i, text in enumerate(_wds2idx_cases()):
        data = text.encode("latin-1")
        try:
            ref = ix._parse_wds2idx_python(f"case{i}.idx", data)
        except FormatError:
            ref = None
        try:
            got = _formats.parse_wds2idx(data)
        except ValueError as e:
            line, msg = e.args
            assert line >= 1 and msg.startswith(f"line {line}:"), msg
            got = None
        if got is None:
            refused += 1
            continue
        assert ref is not None, (text, got)
        for a, b in zip(ref, got):
            assert (a == b) if isinstance(a, bytes) else np.asarray(a).tolist() == b.tolist()
        agree += 1
    assert agree >= 20 and refused >= 20   # the edits exercised both ways
    p = tmp_path / "bad.idx"
    p.write_text("v1.2 2\njpg 512 3 a.jpg\n\njpg 1024 3\n")
    with pytest.raises(FormatError, match=r"bad\.idx: line 4: a group of 3 fields, not 4"):
        ix.read_wds2idx(str(p), str(p))


def test_wds2idx_read_natively_and_by_the_reference_alike(shards, tmp_path):
    assert cli(["index", *shards, "--format", "wds2idx", "--out", str(tmp_path)]) == 0
    for shard in shards:
        idx = str(tmp_path / (os.path.basename(shard) + ".idx"))
        if not os.path.exists(idx):
            idx = str(tmp_path / (os.path.basename(shard).split(".")[0] + ".idx"))
        a = ix.read_wds2idx(idx, shard)
        b = ix.read_wds2idx(idx, shard, parser="python")
        assert a[0] == b[0] and all(x.tolist() == y.tolist() for x, y in zip(a[1:], b[1:]))


SPEC1 = {"ext": ["bin"], "case_sensitive": True, "grouping": "webdataset", "missing": "empty"}


def _part(offs):
    n = len(offs)
    return {"start": np.arange(n, dtype=np.int64) * 4096, "length": np.full(n, 4096),
            "comp_off": np.asarray(offs, np.int64).reshape(n, 1),
            "comp_len": np.full((n, 1), 7, np.uint64)}


@pytest.mark.parametrize("offs, unit", [([0, 512, -1, 1024], 512), ([0, 513, -1], 1),
                                        ([0, 512 * 0xFFFF], 1), ([], 512)])
def test_component_offsets_in_blocks_where_they_fit(tmp_path, offs, unit):
    shards = [{"path": "s.tar", "size": 1, "mtime_ns": 1}]
    index = ix.WdsIndex.from_parts(SPEC1, shards, [_part(offs)])
    assert index.comp_unit == unit
    assert index.comp_off.dtype == (np.uint16 if unit == 512 else np.int32)
    assert index.comp_offsets().reshape(-1).tolist() == offs
    # start 8, length 4 (uint32: version 3), shard number 4, label 4.
    assert index.bytes_per_sample() == 8 + 4 + 4 + 4 + index.comp_off.itemsize + 4
    path = str(tmp_path / "x.fridx")
    index.write(path)
    back = ix.open_fridx(path)
    assert back.comp_unit == unit and back.comp_offsets().reshape(-1).tolist() == offs
    assert back.file_ids.tolist() == [0] * len(offs)
    assert back.labels.tolist() == list(range(len(offs)))
    if len(offs) > 1:
        assert back.comp_offsets(np.array([1])).reshape(-1).tolist() == [offs[1]]


def _rewrite_header(path, edit):
    """The .fridx at ``path`` with its JSON header changed by ``edit`` (the
    columns left where they are; the CRC recomputed)."""
    import json
    import zlib
    raw = bytearray(open(path, "rb").read())
    hlen = int(np.frombuffer(raw, "<u8", 1, 8)[0])
    header = json.loads(bytes(raw[64:64 + hlen]))
    edit(header)
    blob = json.dumps(header, separators=(",", ":")).encode().ljust(hlen)
    assert len(blob) == hlen
    raw[8:24] = np.array([hlen, zlib.crc32(blob)], "<u8").tobytes()
    raw[64:64 + hlen] = blob
    open(path, "wb").write(bytes(raw))


def test_fridx_version_1_read_and_damage_refused(tmp_path):
    shards = [{"path": "s.tar", "size": 1, "mtime_ns": 1}]
    index = ix.WdsIndex.from_parts(SPEC1, shards, [_part([0, 513, -1])])
    index.length = index.length.astype(np.int64)   # version 1's lengths
    path = str(tmp_path / "v1.fridx")
    index.write(path)

    def v1(h):   # as version 1 wrote it: no comp_unit, no file_ids/labels columns
        h["version"] = 1
        del h["comp_unit"], h["columns"]["file_ids"], h["columns"]["labels"]
    _rewrite_header(path, v1)
    back = ix.open_fridx(path)
    assert back.comp_unit == 1 and back.comp_offsets().reshape(-1).tolist() == [0, 513, -1]
    assert back.file_ids.tolist() == [0, 0, 0] and back.labels.tolist() == [0, 1, 2]
    blocks = str(tmp_path / "blocks.fridx")
    ix.WdsIndex.from_parts(SPEC1, shards, [_part([0, 512])]).write(blocks)
    _rewrite_header(blocks, lambda h: h.update(comp_unit=7))
    with pytest.raises(FormatError, match=r"blocks\.fridx.*comp_unit 7"):
        ix.open_fridx(blocks)


def test_fridx_version_3_lengths_and_older_versions(tmp_path):
    # Version 3 keeps the sample lengths as uint32 where they fit (32 B a
    # sample for two components), and the table reader reads them in place;
    # a version-2 file (int64 lengths) still reads the same; a length of
    # 4 GiB or more stays int64; unknown versions and a uint32 length column
    # in a version-2 file are refused naming the file.
    shards = [{"path": "s.tar", "size": 1, "mtime_ns": 1}]
    index = ix.WdsIndex.from_parts(SPEC1, shards, [_part([0, 512, -1])])
    assert index.length.dtype == np.uint32
    path = str(tmp_path / "v3.fridx")
    index.write(path)
    back = ix.open_fridx(path)
    assert back.length.dtype == np.dtype("<u4") and back.length.tolist() == [4096] * 3
    assert back.bytes_per_sample() == 8 + 4 + 4 + 4 + 2 + 4

    v2 = str(tmp_path / "v2.fridx")
    old = ix.WdsIndex.from_parts(SPEC1, shards, [_part([0, 512, -1])])
    old.length = old.length.astype(np.int64)     # as version 2 wrote it
    old.write(v2)
    _rewrite_header(v2, lambda h: h.update(version=2))
    back2 = ix.open_fridx(v2)
    assert back2.length.dtype == np.dtype("<i8") and back2.length.tolist() == [4096] * 3
    assert back2.comp_offsets().tolist() == back.comp_offsets().tolist()

    big = _part([0, 512])
    big["length"] = np.array([4096, 1 << 32])
    wide = ix.WdsIndex.from_parts(SPEC1, shards, [big])
    assert wide.length.dtype == np.int64
    wide.write(str(tmp_path / "wide.fridx"))
    assert ix.open_fridx(str(tmp_path / "wide.fridx")).length.tolist() == [4096, 1 << 32]

    bad = str(tmp_path / "bad.fridx")
    index.write(bad)
    _rewrite_header(bad, lambda h: h.update(version=2))
    with pytest.raises(FormatError, match=r"bad\.fridx.*column 'length' of dtype <u4 in a "
                                          r"version-2 index"):
        ix.open_fridx(bad)
    index.write(bad)
    _rewrite_header(bad, lambda h: h.update(version=4))
    with pytest.raises(FormatError, match=r"bad\.fridx.*unsupported index version 4 "
                                          r"\(versions 1, 2, 3 are read\)"):
        ix.open_fridx(bad)


def test_uint32_lengths_reach_the_native_reader_uncopied(tmp_path):
    # The table reader borrows the index's own uint32 length column
    # (fr_reader_open_table32): no widened copy, none counted, and the
    # samples read are the tar's.
    from fastread import Reader
    shard = tmp_path / "a.tar"
    write_tar(shard, [(f"k{i:03d}.bin", b"y" * (i + 1)) for i in range(40)])
    _age([str(shard)])
    for given in (None, "fridx"):
        kw = dict(index_cache="off")
        if given:
            path = str(tmp_path / "a.fridx")
            WebDataset([str(shard)], ["bin"], **kw).index.write(path)
            kw["index_paths"] = path
        src = WebDataset([str(shard)], ["bin"], **kw)
        ids, starts, lengths = src.native_table()
        assert lengths.dtype == np.uint32 and lengths is src.index.length
        assert src.index_bytes()["index_numbering_bytes"] == 0
        assert src.index_bytes()["index_bytes_per_sample"] == 8 + 4 + 4 + 4 + 2 + 4
        with Reader(source=src, batch_size=8, random_shuffle=True, seed=2) as r:
            got = {}
            for arrays, labels in r:
                (parts,) = src.components(arrays, np.asarray(labels, np.int64))
                got.update((int(i), bytes(a)) for i, a in zip(labels, parts))
        assert got == {i: b"y" * (i + 1) for i in range(40)}


def test_damaged_shard_numbers_are_named(tmp_path):
    """A .fridx whose shard numbers do not hold their samples (the columns
    carry no checksum: they are not read at open) fails the batch that
    meets them, naming the index, instead of reading another shard."""
    shard = tmp_path / "a.tar"
    write_tar(shard, [("k%d.bin" % i, b"x" * 3) for i in range(4)])
    _age([str(shard)])
    path = str(tmp_path / "a.fridx")
    WebDataset([str(shard)], ["bin"], index_cache="off").index.write(path)
    import json
    raw = bytearray(open(path, "rb").read())
    hlen = int(np.frombuffer(raw, "<u8", 1, 8)[0])
    off = json.loads(bytes(raw[64:64 + hlen]))["columns"]["file_ids"]["offset"]
    raw[off + 4 * 2:off + 4 * 3] = np.array([5], "<u4").tobytes()
    open(path, "wb").write(bytes(raw))
    src = WebDataset([str(shard)], ["bin"], index_paths=path, index_cache="off")
    assert src.local_index[np.array([0, 1])].tolist() == [0, 1]
    with pytest.raises(FormatError, match=r"a\.fridx.*damaged index: sample 2"):
        src.local_index[np.array([1, 2])]

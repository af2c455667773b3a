"""Data sets of N tiny samples for the scale family (issue 37), fast and cached.

Every sample is SAMPLE_BYTES bytes of a deterministic pattern (sample i's
first 8 bytes are i, little-endian), so per-sample and per-shard costs show
and the bytes do not. Each maker writes under its own directory, then a
marker file ``.scale-dataset.json`` with its parameters, written last: a
directory whose marker matches is reused as is, anything else is removed
and written again.

    files     a tree, ``folders`` class directories of ``NNNNNNNN.jpg`` files
    image     a packed image (fastread's layout: a header block, samples at
              512-byte alignment, a JSON index); ``sparse=True`` leaves the
              samples as holes (all zeros) so 10^7+ samples cost no disk
    wds       WebDataset tar shards of ``per_shard`` samples (``.jpg`` +
              ``.cls``), written as raw tar blocks (no tarfile per member),
              with a DALI wds2idx v1.2 index file beside each (``.idx``)
    squirrel  a squirrel MessagePack store (``shard_NNNNN.gz``, msgpack-numpy
              arrays, as squirrel-core writes them)

Run as a script to make one: ``python bench/scale/generate.py wds DIR 100000``.
"""
import gzip
import json
import os
import shutil
import struct
import sys
import uuid
import zlib

import numpy as np

SAMPLE_BYTES = 100
ALIGNMENT = 512
MARKER = ".scale-dataset.json"
VERSION = 1
EXT = ("jpg", "cls")


def sample_bytes(i):
    """Sample i's bytes: i as 8 little-endian bytes, then a pattern."""
    return struct.pack("<Q", i) + _PATTERN[(i & 0xFF):(i & 0xFF) + SAMPLE_BYTES - 8]


_PATTERN = bytes(range(256)) * 2


def label_of(i, classes):
    return i % classes


def _reuse(root, params):
    try:
        with open(os.path.join(root, MARKER)) as f:
            return json.load(f) == params
    except (OSError, ValueError):
        return False


def _fresh(root):
    if os.path.lexists(root):
        if os.path.isdir(root) and not os.path.islink(root):
            shutil.rmtree(root)
        else:
            os.unlink(root)
    os.makedirs(root)


def _mark(root, params):
    tmp = os.path.join(root, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(params, f)
    os.replace(tmp, os.path.join(root, MARKER))


def folders_for(n):
    """Class directories of a tree of n files: 1,000 at 10^5+ (ImageNet's
    shape), fewer for small n (at least 10 files a folder)."""
    return max(1, min(1000, n // 100))


def make_files(root, n):
    """A tree of n files in folders_for(n) class directories. Returns root."""
    folders = folders_for(n)
    params = {"kind": "files", "version": VERSION, "n": n, "folders": folders,
              "sample_bytes": SAMPLE_BYTES}
    if _reuse(root, params):
        return root
    _fresh(root)
    per = -(-n // folders)
    i = 0
    for c in range(folders):
        d = os.path.join(root, f"{c:04d}")
        os.mkdir(d)
        for _ in range(min(per, n - i)):
            with open(os.path.join(d, f"{i:08d}.jpg"), "wb") as f:
                f.write(sample_bytes(i))
            i += 1
    _mark(root, params)
    return root


def image_paths(root):
    return os.path.join(root, "data.img"), os.path.join(root, "data.img.index")


def _digits(values, width):
    """``values`` as zero-padded decimal ASCII, one row of ``width`` bytes each."""
    out = np.empty((len(values), width), np.uint8)
    v = values.copy()
    for k in range(width - 1, -1, -1):
        out[:, k] = v % 10 + 48
        v //= 10
    return out


def _name_table(ids, per):
    """The names make_files' tree has ("FFFF/NNNNNNNN.jpg") as a NameTable,
    built by arithmetic: 10^8 Python strings would take minutes and ~10 GB."""
    from fastread.names import NameTable

    width = 4 + 1 + 8 + 4
    rows = np.empty((len(ids), width), np.uint8)
    step = 1 << 22
    for a in range(0, len(ids), step):
        part = ids[a:a + step]
        rows[a:a + len(part), 0:4] = _digits(part // per, 4)
        rows[a:a + len(part), 4] = ord("/")
        rows[a:a + len(part), 5:13] = _digits(part, 8)
        rows[a:a + len(part), 13:] = np.frombuffer(b".jpg", np.uint8)
    return NameTable(rows.reshape(-1), np.arange(len(ids) + 1, dtype=np.int64) * width)


def make_image(root, n, sparse=False, index_format="auto"):
    """A packed image of n samples (names and labels those of make_files'
    tree of n) at ``root/data.img``. sparse: samples are holes (zeros) and
    the file is ftruncate'd to size: 10^7 samples cost 5 GB of apparent
    size and no blocks. index_format: as pack's ("auto": binary, index
    version 3, from BINARY_FROM samples on; older builds: JSON). Returns the
    image path."""
    import fastread.image as fi

    params = {"kind": "image", "version": VERSION, "n": n, "sparse": bool(sparse),
              "alignment": ALIGNMENT, "sample_bytes": SAMPLE_BYTES,
              "index": index_format}   # images made before binary indexes are remade
    img, idx = image_paths(root)
    if _reuse(root, params):
        return img
    _fresh(root)
    folders = folders_for(n)
    per = -(-n // folders)
    image_size = ALIGNMENT * (n + 1)
    image_id = uuid.uuid4().bytes
    ids = np.arange(n, dtype=np.int64)
    offsets = ALIGNMENT * (ids + 1)
    lengths = np.full(n, SAMPLE_BYTES, np.int64)
    labels = (ids // per).astype(np.int32)
    fd = os.open(img, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, image_size)
        if sparse:
            zero = zlib.crc32(bytes(SAMPLE_BYTES))
            sums = np.full(n, zero, np.uint32)
        else:
            sums = np.empty(n, np.uint32)
            chunk = 65536
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                block = np.zeros((b - a, ALIGNMENT), np.uint8)
                for j in range(a, b):
                    s = sample_bytes(j)
                    block[j - a, :SAMPLE_BYTES] = np.frombuffer(s, np.uint8)
                    sums[j] = zlib.crc32(s)
                os.pwrite(fd, block.tobytes(), int(offsets[a]))
        os.pwrite(fd, fi._header_block(ALIGNMENT, n, image_size, image_id), 0)
    finally:
        os.close(fd)
    doc = {"format": fi.INDEX_FORMAT, "version": fi.INDEX_VERSION, "image_id": image_id.hex(),
           "image_size": image_size, "alignment": ALIGNMENT, "checksum": fi.CHECKSUM,
           "count": n, "file_root": None}
    binary = getattr(fi, "BINARY_FROM", None)
    with open(idx, "wb") as f:
        if binary is not None and (index_format == "binary" or (
                index_format == "auto" and n >= binary)):
            # What pack writes at this size (index version 3), made without
            # a Python object per sample.
            from fastread.image_index import write_index
            doc.update(names=_name_table(ids, per), labels=labels, offsets=offsets,
                       lengths=lengths, checksums=sums)
            write_index(f, doc, binary=True)
        else:   # a JSON index (what pack writes below BINARY_FROM, and older builds)
            doc.update(names=[f"{int(i) // per:04d}/{int(i):08d}.jpg" for i in ids],
                       labels=labels.tolist(), offsets=offsets.tolist(),
                       lengths=lengths.tolist(), checksums=sums.tolist())
            f.write(fi._encode_index(doc))
    _mark(root, params)
    return img


# -- WebDataset ------------------------------------------------------------------------

def _tar_header(name, size):
    """A ustar header block for a regular file (mode 0644, mtime 0)."""
    h = bytearray(512)
    nb = name.encode()
    if len(nb) > 99:
        raise ValueError(f"tar member name too long: {name!r}")
    h[0:len(nb)] = nb
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b"        "
    h[156:157] = b"0"
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _pad(size):
    return -size % 512


def wds_shard_paths(root):
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))


def make_wds(root, n, per_shard, classes=1000):
    """n samples in ceil(n / per_shard) tar shards ``shard-NNNNNN.tar``, each
    sample a ``KEY.jpg`` (SAMPLE_BYTES) and ``KEY.cls`` (the label, ASCII),
    plus a DALI wds2idx v1.2 index ``shard-NNNNNN.idx`` beside each (one
    line per sample: ``ext offset size name`` per component, offsets of the
    members' data). Returns the shard paths."""
    params = {"kind": "wds", "version": VERSION, "n": n, "per_shard": per_shard,
              "classes": classes, "sample_bytes": SAMPLE_BYTES}
    if _reuse(root, params):
        return wds_shard_paths(root)
    _fresh(root)
    nshards = -(-n // per_shard)
    for s in range(nshards):
        parts, lines, pos = [], [], 0
        a, b = s * per_shard, min(n, (s + 1) * per_shard)
        for i in range(a, b):
            key = f"{i:09d}"
            comps = []
            for ext, data in (("jpg", sample_bytes(i)),
                              ("cls", str(label_of(i, classes)).encode())):
                name = f"{key}.{ext}"
                parts.append(_tar_header(name, len(data)))
                parts.append(data + bytes(_pad(len(data))))
                comps.append(f"{ext} {pos + 512} {len(data)} {name}")
                pos += 512 + len(data) + _pad(len(data))
            lines.append(" ".join(comps))
        parts.append(bytes(1024))
        base = os.path.join(root, f"shard-{s:06d}")
        with open(base + ".tar", "wb") as f:
            f.write(b"".join(parts))
        with open(base + ".idx", "w") as f:
            f.write(f"v1.2 {len(lines)}\n" + "\n".join(lines) + "\n")
    _mark(root, params)
    return wds_shard_paths(root)


def index_path_of(shard):
    return shard[:-len(".tar")] + ".idx"


# -- Squirrel ---------------------------------------------------------------------------

def _msgpack_array(a):
    # msgpack-numpy's encoding of an ndarray, as squirrel-core writes it.
    return {b"nd": True, b"type": a.dtype.str, b"kind": b"", b"shape": list(a.shape),
            b"data": a.tobytes()}


def make_squirrel(root, n, per_shard, classes=1000):
    """A squirrel MessagePack store: ceil(n / per_shard) gzip'd shards
    ``shard_NNNNN.gz`` of samples {"image": uint8 array of SAMPLE_BYTES,
    "label": int}. Returns root."""
    import msgpack

    params = {"kind": "squirrel", "version": VERSION, "n": n, "per_shard": per_shard,
              "classes": classes, "sample_bytes": SAMPLE_BYTES}
    if _reuse(root, params):
        return root
    _fresh(root)
    pack = msgpack.Packer(use_bin_type=True)
    for s in range(-(-n // per_shard)):
        out = []
        for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
            img = np.frombuffer(sample_bytes(i), np.uint8)
            out.append(pack.pack({"image": _msgpack_array(img),
                                  "label": label_of(i, classes)}))
        with open(os.path.join(root, f"shard_{s:05d}.gz"), "wb") as f:
            f.write(gzip.compress(b"".join(out), compresslevel=1, mtime=0))
    _mark(root, params)
    return root


MAKERS = {"files": make_files, "image": make_image, "wds": make_wds, "squirrel": make_squirrel}


def main(argv):
    if len(argv) < 3 or argv[0] not in MAKERS:
        print(f"usage: generate.py {{{','.join(MAKERS)}}} DIR N [PER_SHARD]", file=sys.stderr)
        return 2
    kind, root, n = argv[0], argv[1], int(float(argv[2]))
    args = (int(argv[3]),) if len(argv) > 3 else ((1000,) if kind in ("wds", "squirrel") else ())
    out = MAKERS[kind](root, n, *args)
    print(f"{len(out)} shards in {root}" if isinstance(out, list) else out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Packed images: pack -> read round trips for every engine (buffered and
O_DIRECT, directly and through Reader / DALI), verify, and the failure
modes: interrupted pack, corrupt index, image/index mismatch, truncation."""
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

import fastread
from fastread.image import ImageError, PackedImage, pack, verify

from conftest import range_engine_params


@pytest.fixture(scope="module")
def packed(edge_tree, disk_tmp):
    root, content = edge_tree
    out = os.path.join(disk_tmp, "edge.img")
    img = pack(root, out, batch_size=7, progress=False)
    return root, content, img


def _expected(root, content):
    paths, labels = fastread.scan(root)
    return paths, labels, [content[p] for p in paths]


def test_layout_and_index(packed):
    root, content, img = packed
    paths, labels, _ = _expected(root, content)
    assert len(img) == len(paths)
    assert img.names == [os.path.relpath(p, root) for p in paths]
    assert img.labels.dtype == np.int32 and (img.labels == labels).all()
    assert (img.offsets % 4096 == 0).all() and img.offsets.min() >= 4096
    assert img.image_size % 4096 == 0
    assert os.path.getsize(img.path) == img.image_size
    assert [int(x) for x in img.lengths] == [len(content[p]) for p in paths]
    assert [int(c) for c in img.checksums] == [zlib.crc32(content[p]) for p in paths]


@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.parametrize("engine", range_engine_params())
def test_round_trip_byte_equal(packed, engine, o_direct):
    root, content, img = packed
    _paths, _labels, want = _expected(root, content)
    order = np.random.default_rng(0).permutation(len(img))
    arrays = img.read(order, engine=engine, o_direct=o_direct, queue_depth=4)
    assert [a.dtype for a in arrays] == [np.uint8] * len(arrays)
    assert [a.tobytes() for a in arrays] == [want[i] for i in order]  # true lengths


@pytest.mark.parametrize("engine", range_engine_params())
def test_reader_over_image_matches_reader_over_files(packed, engine):
    root, content, img = packed
    kw = dict(batch_size=4, shard_id=1, num_shards=2, random_shuffle=True, seed=3,
              stick_to_shard=False, engine=engine)
    file_engine = engine if fastread.engines()[engine].files is True else "auto"  # range-only engines
    with fastread.Reader(root, **{**kw, "engine": file_engine}) as files, \
            fastread.Reader(image=img, o_direct=True, **kw) as image:
        assert len(files) == len(image)
        for epoch in range(2):
            files.set_epoch(epoch)
            image.set_epoch(epoch)
            got = [(bytes(a), int(lab)) for arrs, labs in image for a, lab in zip(arrs, labs)]
            want = [(bytes(a), int(lab)) for arrs, labs in files for a, lab in zip(arrs, labs)]
            assert got == want


def test_context_read_ranges_errors(packed):
    _root, _content, img = packed
    ctx = fastread.open_context("auto")
    b = ctx.read_ranges(img.path + ".nope", [4096], [10])
    assert b.failures()[0][1] == 2  # ENOENT, per sample
    with pytest.raises(ValueError, match="offsets but"):
        ctx.read_ranges(img.path, [0, 4096], [1])
    with pytest.raises(ValueError, match=">= 0"):
        ctx.read_ranges(img.path, [-1], [1])


def test_verify_and_corrupt_sample(packed, disk_tmp, tmp_path):
    root, _content, img = packed
    assert verify(img) == []
    out = str(tmp_path / "bad.img")
    pack(root, out, progress=False)
    bad = PackedImage(out)
    i = int(np.argmax(bad.lengths))
    with open(out, "r+b") as f:
        f.seek(int(bad.offsets[i]) + 17)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert [name for name, _why in verify(out)] == [bad.names[i]]
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "verify", out, "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and bad.names[i] in r.stdout and "checksum mismatch" in r.stdout


def test_repack_to_the_same_path_then_read_in_the_same_process(edge_tree, tmp_path):
    """pack() replaces an image by rename: this process's contexts, which
    keep the old image open, read the new one (they read the replaced file's
    bytes before: every sample a checksum mismatch)."""
    root, content = edge_tree
    out = str(tmp_path / "again.img")
    first = pack(root, out, progress=False)
    assert verify(first) == []
    small = tmp_path / "small"
    (small / "a").mkdir(parents=True)
    (small / "a" / "x.jpg").write_bytes(b"new image, new bytes" * 100)
    again = pack(str(small), out, progress=False)
    assert verify(again) == []


def test_cli_pack_and_verify(edge_tree, tmp_path):
    root, _content = edge_tree
    out = str(tmp_path / "cli.img")
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "pack", root, out, "--quiet",
                        "--alignment", "8192"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert PackedImage(out).alignment == 8192
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "verify", out, "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "all samples match" in r.stdout
    assert sorted(os.listdir(tmp_path)) == ["cli.img", "cli.img.index"]


class _Stop(Exception):
    pass


def test_interrupted_pack_leaves_no_image(edge_tree, tmp_path):
    root, _content = edge_tree
    out = str(tmp_path / "int.img")

    def stop(i):
        if i == 2:
            raise _Stop()

    with pytest.raises(_Stop):
        pack(root, out, batch_size=3, on_batch=stop, progress=False)
    assert os.listdir(tmp_path) == []  # no image, no index, no temporaries


def test_interrupted_repack_keeps_the_old_image(edge_tree, tmp_path):
    root, _content = edge_tree
    out = str(tmp_path / "re.img")
    pack(root, out, progress=False)
    before = open(out, "rb").read(), open(out + ".index", "rb").read()

    def stop(i):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(root, out, batch_size=3, on_batch=stop, progress=False)
    assert (open(out, "rb").read(), open(out + ".index", "rb").read()) == before
    assert sorted(os.listdir(tmp_path)) == ["re.img", "re.img.index"]
    assert verify(out) == []


def test_pack_fails_on_unreadable_sample(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.jpg").write_bytes(b"x" * 100)
    os.symlink(str(tmp_path / "missing"), str(root / "a" / "y.jpg"))
    with pytest.raises(fastread.ReadError, match="y.jpg"):
        pack(str(root), str(tmp_path / "o.img"), progress=False)
    assert os.listdir(tmp_path) == ["root"]


def test_block_device_must_be_explicit(edge_tree, tmp_path):
    root, _content = edge_tree
    with pytest.raises(ValueError, match="not a block device"):
        pack(root, str(tmp_path / "f.img"), block_device=True)


@pytest.fixture
def copy(packed, tmp_path):
    _root, _content, img = packed
    out = str(tmp_path / "c.img")
    with open(img.path, "rb") as f, open(out, "wb") as g:
        g.write(f.read())
    with open(img.index_path, "rb") as f, open(out + ".index", "wb") as g:
        g.write(f.read())
    PackedImage(out)  # a faithful copy opens
    return out


@pytest.mark.parametrize("where", ["body", "header", "truncated", "appended"])
def test_corrupt_index(copy, where):
    idx = copy + ".index"
    data = bytearray(open(idx, "rb").read())
    if where == "body":
        data[len(data) // 2] ^= 0x01
    elif where == "header":
        data[3] = ord("X")
    elif where == "truncated":
        data = data[:-10]
    else:
        data += b" "
    open(idx, "wb").write(bytes(data))
    with pytest.raises(ImageError, match="index .* is corrupt"):
        PackedImage(copy)


def test_missing_index(copy):
    os.unlink(copy + ".index")
    with pytest.raises(FileNotFoundError, match="index"):
        PackedImage(copy)


def test_index_of_another_image(copy, edge_tree, tmp_path):
    root, _content = edge_tree
    other = str(tmp_path / "other.img")
    pack(root, other, progress=False)  # same data, another image id
    with pytest.raises(ImageError, match="does not belong to image"):
        PackedImage(copy, index=other + ".index")


def test_truncated_image(copy):
    size = os.path.getsize(copy)
    os.truncate(copy, size - 4096)
    with pytest.raises(ImageError, match="truncated"):
        PackedImage(copy)


def test_not_an_image(copy):
    with open(copy, "r+b") as f:
        f.write(b"\0" * 16)
    with pytest.raises(ImageError, match="not a fastread packed image"):
        PackedImage(copy)


def test_image_truncated_after_open_fails_the_sample(copy):
    img = PackedImage(copy)
    last = int(np.argmax(img.offsets))
    os.truncate(copy, int(img.offsets[last]))
    with pytest.raises(fastread.ReadError, match=r"\[" + img.names[last].replace(".", r"\.")):
        img.read([last])


def test_o_direct_alignment_mismatch(edge_tree, tmp_path):
    root, _content = edge_tree
    out = str(tmp_path / "a512.img")
    img = pack(root, out, alignment=512, progress=False)
    with pytest.raises(ValueError, match="alignment 512"):
        img.read([0], o_direct=True)
    assert len(img.read([1, 2])) == 2  # buffered reads need no alignment


def test_dali_image_reader_matches_file_reader(packed):
    pytest.importorskip("nvidia.dali", reason="nvidia.dali is not installed")
    from nvidia.dali import fn, pipeline_def

    from fastread.dali import readers

    root, _content, img = packed

    def run(reader_fn):
        @pipeline_def(batch_size=5, num_threads=1, device_id=None)
        def pipe():
            return reader_fn()

        p = pipe()
        p.build()
        out = []
        for _epoch in range(2):
            while True:
                try:
                    data, labels = p.run()
                except StopIteration:
                    p.reset()
                    break
                out += [(bytes(np.asarray(data[i])), int(np.asarray(labels[i])[0]))
                        for i in range(len(data))]
        return out

    kw = dict(random_shuffle=True, shard_id=0, num_shards=2, seed=5, epoch_end="stop")
    want = run(lambda: readers.file(file_root=root, **kw))
    got = run(lambda: readers.image(image=img.path, o_direct=True, **kw))
    assert got == want and len(got) > 0


def test_range_only_engine_refuses_files(packed):
    from fastread.engine import RANGE_ONLY
    root, _, _ = packed
    status = fastread.engines()
    # A range-only engine that runs here reads ranges, and says why not files.
    usable = [name for name in RANGE_ONLY if status[name].ranges is True]
    if not usable:
        pytest.skip(f"no range-only engine runs here: {[status[n].ranges for n in RANGE_ONLY]}")
    for name in usable:
        assert status[name].files == RANGE_ONLY[name]
    for name in usable:
        with pytest.raises(ValueError, match="ranges"):
            fastread.Reader(root, engine=name)


def test_index_on_the_image_path_is_refused_up_front(edge_tree, tmp_path):
    """pack renames the image onto `out`, then the index onto its path: the
    same path for both would leave only the index (and blame truncation)."""
    root, _content = edge_tree
    out = str(tmp_path / "same.img")
    with pytest.raises(ValueError, match="same file") as e:
        pack(root, out, index=out, progress=False)
    assert out in str(e.value)
    assert os.listdir(tmp_path) == []
    # The same file by another spelling, and an existing image by a hard link.
    with pytest.raises(ValueError, match="same file"):
        pack(root, out, index=str(tmp_path / "." / "same.img"), progress=False)
    pack(root, out, progress=False)
    before = open(out, "rb").read()
    os.link(out, str(tmp_path / "link.img"))
    with pytest.raises(ValueError, match="same file"):
        pack(root, out, index=str(tmp_path / "link.img"), progress=False)
    assert open(out, "rb").read() == before and verify(out) == []
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "pack", root, out, "--quiet",
                        "--index", out], capture_output=True, text=True)
    assert r.returncode == 1 and "same file" in r.stderr and out in r.stderr
    assert open(out, "rb").read() == before


def _dead_pid():
    """A pid no process has: a child that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_pack_removes_temporaries_of_a_killed_pack(edge_tree, tmp_path):
    """SIGTERM ran no cleanup and left a full-size hidden temporary image; the
    next pack of that image removes it (its process is gone) -- but not the
    temporaries of a live pack, nor of another image."""
    root, _content = edge_tree
    out = str(tmp_path / "img.bin")
    script = ("import os, signal, sys\n"
              "from fastread.image import pack\n"
              "pack(sys.argv[1], sys.argv[2], progress=False, batch_size=2,\n"
              "     on_batch=lambda b: os.kill(os.getpid(), signal.SIGTERM))\n")
    r = subprocess.run([sys.executable, "-c", script, root, out], capture_output=True)
    assert r.returncode == -15, r.stderr
    left = [n for n in os.listdir(tmp_path) if n.startswith(".img.bin.tmp-")]
    assert len(left) == 1, os.listdir(tmp_path)
    dead = _dead_pid()
    stale_index = tmp_path / f".img.bin.index.tmp-{dead}-0123abcd"
    stale_index.write_bytes(b"x")
    alive = tmp_path / f".img.bin.tmp-{os.getppid()}-0123abcd"   # pytest's parent: alive
    alive.write_bytes(b"x")
    other = tmp_path / f".other.bin.tmp-{dead}-0123abcd"
    other.write_bytes(b"x")
    pack(root, out, progress=False)
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["img.bin", "img.bin.index", alive.name, other.name])
    assert verify(out) == []


@pytest.mark.parametrize("which", ["image", "index"])
def test_missing_directory_is_named_before_reading(edge_tree, tmp_path, which):
    """The error named the hidden temporary (.img.bin.tmp-...), and for the
    index only after the whole data set had been read."""
    root, _content = edge_tree
    out, index = str(tmp_path / "img.bin"), None
    if which == "image":
        out = str(tmp_path / "nodir" / "img.bin")
    else:
        index = str(tmp_path / "nodir" / "img.index")

    def never(b):
        raise AssertionError("the data set was read")

    with pytest.raises(FileNotFoundError) as e:
        pack(root, out, index=index, progress=False, on_batch=never)
    assert (out if which == "image" else index) in str(e.value) and ".tmp-" not in str(e.value)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError) as e:
        pack(root, str(tmp_path / "file" / "img.bin"), progress=False, on_batch=never)
    assert "file/img.bin" in str(e.value) and ".tmp-" not in str(e.value)
    r = subprocess.run([sys.executable, "-m", "fastread.cli", "pack", root,
                        str(tmp_path / "nodir" / "img.bin"), "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "nodir/img.bin" in r.stderr and ".tmp-" not in r.stderr

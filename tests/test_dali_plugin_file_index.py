"""fn.fastread.readers.file over a mapped file listing (file_index=,
fastread.dali._listing, dali_plugin/mapped_file_list.h): the same samples,
labels, shards, padding, shuffles and checkpoints as files= and labels=;
a listing truncated, damaged or replaced is refused naming it; a file gone
missing fails naming its path."""
import os
import shutil

import numpy as np
import pytest

from dali_helpers import (assert_checkpoint_resumes, batches, case_id, make_pipe,
                          write_class_tree)
from nvidia.dali import fn  # noqa: E402 (dali_helpers skips without DALI)

import fastread.dali  # noqa: E402
from fastread.dali import _listing  # noqa: E402
from fastread.index import scan  # noqa: E402


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_class_tree(tmp_path_factory.mktemp("listing_tree"), seed=11, max_size=3000)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("FASTREAD_INDEX_CACHE_DIR", str(d))
    return d


def listed(tree, cache, labels=None):
    paths, scanned = scan(tree)
    labs = scanned if labels is None else labels
    return paths, labs, _listing.listing_args(paths, labs, directory=str(cache))


CASES = [
    dict(),
    dict(pad_last_batch=True),
    dict(num_shards=3, shard_id=2),
    dict(num_shards=4, shard_id=1, stick_to_shard=True, pad_last_batch=True),
    dict(random_shuffle=True, seed=5),
    dict(num_shards=2, shard_id=1, random_shuffle=True, seed=3, pad_last_batch=True),
]


@pytest.mark.parametrize("kw", CASES, ids=case_id)
def test_listing_reads_what_files_reads(tree, cache, kw):
    # Labels of their own (not the positions) so the label column is read.
    paths, _, _ = listed(tree, cache)
    labels = (np.arange(len(paths)) * 7 + 3).astype(np.int32)
    _, _, args = listed(tree, cache, labels)
    assert os.path.getsize(args["file_index"]) == args["index_bytes"]
    mapped = make_pipe(lambda: fn.fastread.readers.file(name="R", **args, **kw), 3)
    given = make_pipe(lambda: fn.fastread.readers.file(
        files=list(paths), labels=labels.tolist(), name="R", **kw), 3)
    assert mapped.reader_meta("R") == given.reader_meta("R")
    assert batches(mapped, 30) == batches(given, 30)


def test_wrapper_writes_and_reuses_the_listing(tree, cache, monkeypatch):
    monkeypatch.setattr(_listing, "MIN_FILES", 1)
    graph = lambda: fastread.dali.readers.file(file_root=tree, name="R", native=True)  # noqa
    first = batches(make_pipe(graph, 4), 12)
    entries = sorted(os.listdir(cache))
    assert len(entries) == 1 and entries[0].startswith("files-")
    inode = os.stat(cache / entries[0]).st_ino
    # DALI's own reader: the same bytes and labels.
    dalis = make_pipe(lambda: fn.readers.file(file_root=tree, name="R"), 4)
    assert first == batches(dalis, 12)
    # The same list again: the kept entry (not rewritten), the same samples.
    again = batches(make_pipe(graph, 4), 12)
    assert again == first and sorted(os.listdir(cache)) == entries
    assert os.stat(cache / entries[0]).st_ino == inode   # a rewrite replaces the file


def test_cache_off_passes_files(tree, monkeypatch):
    monkeypatch.setattr(_listing, "MIN_FILES", 1)
    monkeypatch.setenv("FASTREAD_INDEX_CACHE_DIR", "off")
    paths, labels = scan(tree)
    assert _listing.listing_args(paths, labels) is None
    graph = lambda: fastread.dali.readers.file(file_root=tree, name="R", native=True)  # noqa
    dalis = make_pipe(lambda: fn.readers.file(file_root=tree, name="R"), 4)
    assert batches(make_pipe(graph, 4), 8) == batches(dalis, 8)


def test_checkpoint_resumes(tree, cache):
    _, _, args = listed(tree, cache)
    assert_checkpoint_resumes(
        lambda: fn.fastread.readers.file(name="R", random_shuffle=True, seed=2, **args),
        make_pipe)


def _build(args):
    make_pipe(lambda: fn.fastread.readers.file(**args), 2)


def test_truncated_listing_is_refused_naming_it(tree, cache):
    _, _, args = listed(tree, cache)
    with open(args["file_index"], "r+b") as f:
        f.truncate(args["index_bytes"] - 5)
    with pytest.raises(RuntimeError, match=f"file_index='{args['file_index']}'.*rewritten"):
        _build(args)


def test_replaced_listing_is_refused_naming_it(tree, cache):
    paths, labels, args = listed(tree, cache)
    # Another list of the same size (other labels): another header line.
    other = _listing.listing_args(paths, labels + 1, directory=str(cache))
    assert other["index_bytes"] == args["index_bytes"] and other["index_head"] != args["index_head"]
    shutil.copyfile(other["file_index"], args["file_index"])
    with pytest.raises(RuntimeError, match=f"file_index='{args['file_index']}'.*rewritten"):
        _build(args)


def test_damaged_listing_is_refused_naming_it(tree, cache):
    _, _, args = listed(tree, cache)
    n, d = args["index_count"], args["index_dirs"]
    # name_offsets[1] past the names' end: fr_reader_open_tree's walk refuses it.
    at = _listing.HEAD_BYTES + 8 * (d + 1) + 8
    with open(args["file_index"], "r+b") as f:
        f.seek(at)
        f.write(np.uint64(1 << 40).tobytes())
    with pytest.raises(RuntimeError, match=f"file_index='{args['file_index']}'"):
        _build(args)
    # Bytes past the columns (the size passed matches the file): not a listing.
    _, _, args = listed(tree, cache / "2")
    with open(args["file_index"], "ab") as f:
        f.write(b"\0" * 8)
    grown = dict(args, index_bytes=args["index_bytes"] + 8)
    with pytest.raises(RuntimeError, match=f"file_index='{args['file_index']}'.*do not fill"):
        _build(grown)
    assert n > 0


def test_listing_excludes_files_and_root(tree, cache):
    paths, labels, args = listed(tree, cache)
    with pytest.raises(RuntimeError, match="file_index=.*no image=, image_index=, file_root="):
        _build(dict(args, files=list(paths)))
    with pytest.raises(RuntimeError, match="file_index=.*file_root="):
        _build(dict(args, file_root=tree))


def test_missing_file_fails_naming_it(tree, tmp_path, cache):
    root = tmp_path / "copy"
    shutil.copytree(tree, root)
    paths, labels = scan(str(root))
    args = _listing.listing_args(paths, labels, directory=str(cache))
    victim = paths[9]
    p = make_pipe(lambda: fn.fastread.readers.file(prefetch_queue_depth=1, workers=1, **args), 4)
    p.run()
    os.remove(victim)
    with pytest.raises(RuntimeError, match=victim):
        for _ in range(10):
            p.run()


def test_listings_are_pruned_with_the_index_cache(tree, cache):
    from fastread.formats._index_files import cache_prune
    paths, labels = scan(tree)
    made = [_listing.listing_args(paths, labels + k, directory=str(cache))["file_index"]
            for k in range(3)]
    os.utime(made[0], (1, 1))   # the least recently used
    cache_prune(str(cache), keep=2)
    assert sorted(os.listdir(cache)) == sorted(os.path.basename(p) for p in made[1:])

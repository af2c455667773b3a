"""Sample sources: FileList, FileRanges, PackedImage and sources of one's own,
as Reader, read() and read_in_order consume them; and sources that break
the contract."""
import os

import numpy as np
import pytest

import fastread
from fastread import _core
from fastread.source import FileList, FileRanges, SampleSource, check_source, read_in_order


def epoch(reader):
    arrays, labels = [], []
    for a, lab in reader:
        arrays.extend(x.tobytes() for x in a)
        labels.extend(lab.tolist())
    return arrays, labels


# -- a record format as a source --------------------------------------------------

RECORD = 1 + 40  # CIFAR-10 binary layout, shrunk: one label byte, then the pixels


class LabelledRecords(FileRanges):
    """Fixed-size records (label byte + payload) in one file: what a CIFAR
    binary reader would be. Only the format is parsed here; the reading is
    FileRanges'."""

    def __init__(self, path):
        size = os.path.getsize(path)
        if size % RECORD:
            raise ValueError(f"{path}: {size} bytes is not a whole number of {RECORD}-byte records")
        n = size // RECORD
        with open(path, "rb") as f:
            raw = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, RECORD)
        super().__init__(path, offsets=np.arange(n) * RECORD + 1, lengths=np.full(n, RECORD - 1),
                         labels=raw[:, 0], names=[f"record{i}" for i in range(n)])


@pytest.fixture(scope="module")
def records(disk_tmp):
    rng = np.random.default_rng(11)
    n = 37
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    payloads = rng.integers(0, 256, (n, RECORD - 1), dtype=np.uint8)
    path = os.path.join(disk_tmp, "records.bin")
    with open(path, "wb") as f:
        f.write(np.concatenate([labels[:, None], payloads], axis=1).tobytes())
    return path, labels, payloads


def test_record_source_reads_records_with_their_labels(records):
    path, labels, payloads = records
    src = LabelledRecords(path)
    assert len(src) == 37 and src.reads_ranges
    assert src.sizes.tolist() == [RECORD - 1] * 37
    with fastread.Reader(source=src, batch_size=8) as r:
        got, got_labels = epoch(r)
    assert got == [p.tobytes() for p in payloads]
    assert got_labels == labels.tolist()


def test_record_source_shards_and_shuffles_like_files(records):
    path, labels, payloads = records
    everything = sorted(p.tobytes() for p in payloads)
    shards = []
    for shard in range(3):
        with fastread.Reader(source=LabelledRecords(path), batch_size=5, shard_id=shard,
                             num_shards=3, random_shuffle=True, seed=2) as r:
            shards.append(epoch(r)[0])
    assert sorted(x for s in shards for x in s) == everything
    assert shards[0] != sorted(shards[0])  # shuffled


def test_record_source_one_shot_read_and_errors_name_the_record(records, tmp_path):
    path, labels, payloads = records
    src = LabelledRecords(path)
    assert [a.tobytes() for a in src.read([3, -1])] == [payloads[3].tobytes(),
                                                        payloads[-1].tobytes()]
    with pytest.raises(IndexError):
        src.read([37])
    # A source whose ranges outlive the file (truncated after parsing).
    short = tmp_path / "short.bin"
    short.write_bytes(open(path, "rb").read())
    cut = LabelledRecords(str(short))
    os.truncate(short, RECORD * 10)
    with pytest.raises(fastread.ReadError, match=r"short\.bin\[record3[0-9]\]"):
        cut.read([5, 30])


def test_odd_record_file_is_refused_by_the_format(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(RECORD + 3))
    with pytest.raises(ValueError, match="whole number"):
        LabelledRecords(str(bad))


# -- a source written from scratch -----------------------------------------------

class Subset(SampleSource):
    """Some samples of another source, renumbered: a source that delegates
    its reads (open_native and read_batch) rather than inheriting them."""

    def __init__(self, base, keep):
        self.base, self.keep = base, np.asarray(keep, dtype=np.int64)
        self.names = [base.names[i] for i in self.keep]
        self.labels = np.asarray(base.labels)[self.keep]

    def open_native(self, engine, options, *, prefetch, workers):
        return FileList(self.names, self.labels).open_native(engine, options, prefetch=prefetch,
                                                             workers=workers)

    def read_batch(self, context, indices):
        return self.base.read_batch(context, self.keep[indices])


def test_custom_source_through_reader_and_read(edge_tree):
    root, content = edge_tree
    files = FileList.scan(root)
    sub = Subset(files, [1, 4, 9, 20])
    want = [content[files.names[i]] for i in (1, 4, 9, 20)]
    with fastread.Reader(source=sub, batch_size=3) as r:
        got, labels = epoch(r)
    assert got == want and labels == [int(files.labels[i]) for i in (1, 4, 9, 20)]
    assert [a.tobytes() for a in sub.read([3, 0])] == [want[3], want[0]]


def test_filelist_matches_scan_and_directory_reader(edge_tree):
    root, content = edge_tree
    paths, labels = fastread.scan(root)
    files = FileList.scan(root)
    assert files.paths == paths and files.labels.tolist() == labels.tolist()
    assert files.sizes is None
    with fastread.Reader(root, batch_size=4, random_shuffle=True, seed=5) as a, \
            fastread.Reader(source=files, batch_size=4, random_shuffle=True, seed=5) as b:
        assert epoch(a) == epoch(b)
    assert FileList(paths).labels.tolist() == list(range(len(paths)))


def test_packed_image_is_a_range_source(edge_tree, disk_tmp):
    root, content = edge_tree
    img = fastread.pack(root, os.path.join(disk_tmp, "source-test.img"), progress=False)
    assert isinstance(img, FileRanges) and img.sizes.tolist() == img.lengths.tolist()
    with fastread.Reader(source=img, batch_size=5) as a, \
            fastread.Reader(image=img.path, batch_size=5) as b:
        assert epoch(a) == epoch(b) == ([content[p] for p in fastread.scan(root)[0]],
                                        fastread.scan(root)[1].tolist())


def test_read_in_order_yields_every_batch_once(edge_tree):
    root, content = edge_tree
    files = FileList.scan(root)
    batches = list(read_in_order(files, 7))
    assert [len(a) for a, _ in batches] == [7] * (len(files) // 7) + [len(files) % 7]
    assert [x.tobytes() for a, _ in batches for x in a] == [content[p] for p in files.paths]
    assert np.concatenate([lab for _, lab in batches]).tolist() == files.labels.tolist()
    with pytest.raises(ValueError, match="batch_size"):
        next(read_in_order(files, 0))


def test_read_in_order_names_a_failed_file(tmp_path):
    good = tmp_path / "a.jpg"
    good.write_bytes(b"abc")
    files = FileList([str(good), str(tmp_path / "gone.jpg")])
    with pytest.raises(fastread.ReadError, match="gone.jpg"):
        list(read_in_order(files, 2))


# -- sources that break the contract ---------------------------------------------

class Broken(FileList):
    """A FileList whose declared facts can be set wrong."""

    def __init__(self, paths, sizes=None, labels=None, native_paths=None):
        super().__init__(paths)
        self._sizes = sizes
        if labels is not None:
            self.labels = labels
        self._native_paths = native_paths

    @property
    def sizes(self):
        return self._sizes

    def open_native(self, engine, options, *, prefetch, workers):
        paths = self.names if self._native_paths is None else self._native_paths
        return _core.NativeReader(paths, engine, prefetch=prefetch, workers=workers, **options)


@pytest.fixture
def three_files(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"f{i}.jpg"
        p.write_bytes(bytes([i]) * (i + 1))
        paths.append(str(p))
    return paths


def test_sizes_of_the_wrong_count_are_refused(three_files):
    with pytest.raises(ValueError, match=r"source Broken.*: 2 sizes for 3 samples"):
        fastread.Reader(source=Broken(three_files, sizes=[1, 2]), batch_size=2)


def test_negative_size_names_the_sample(three_files):
    with pytest.raises(ValueError, match=r"f1\.jpg has size -5"):
        fastread.Reader(source=Broken(three_files, sizes=[1, -5, 3]), batch_size=2)


def test_sizes_that_are_not_integers_are_refused(three_files):
    with pytest.raises(ValueError, match="sizes must be a 1-D sequence of integers"):
        check_source(Broken(three_files, sizes=["big", "small", "tiny"]))


def test_labels_of_the_wrong_count_are_refused(three_files):
    with pytest.raises(ValueError, match="2 labels .* for 3 samples"):
        fastread.Reader(source=Broken(three_files, labels=np.array([0, 1])), batch_size=2)
    with pytest.raises(ValueError, match="labels must be integers"):
        check_source(Broken(three_files, labels=np.array([0.5, 1, 2])))


def test_native_reader_over_other_samples_is_refused(three_files):
    with pytest.raises(ValueError, match="opened a native reader over 2 samples but names 3"):
        fastread.Reader(source=Broken(three_files, native_paths=three_files[:2]), batch_size=2)


def test_not_a_source_is_a_type_error(three_files):
    with pytest.raises(TypeError, match="source must be a fastread.SampleSource"):
        fastread.Reader(source=three_files, batch_size=2)


def test_abstract_source_cannot_be_instantiated():
    class NoReads(SampleSource):
        names, labels = ["x"], np.zeros(1)

    with pytest.raises(TypeError, match="abstract"):
        NoReads()


def test_samples_chosen_one_way_only(edge_tree, three_files):
    root, _ = edge_tree
    files = FileList(three_files)
    with pytest.raises(ValueError, match="source and file_root exclude each other"):
        fastread.Reader(root, source=files)
    with pytest.raises(ValueError, match="image and files exclude each other"):
        fastread.Reader(files=three_files, image="x.img")
    with pytest.raises(ValueError, match="labels= and file_filters= apply only"):
        fastread.Reader(source=files, labels=[0, 1, 2])
    with pytest.raises(ValueError, match="index= applies only with image="):
        fastread.Reader(source=files, index="x.index")


def test_file_ranges_validate_their_ranges(tmp_path):
    p = str(tmp_path / "r.bin")
    with pytest.raises(ValueError, match="offsets must be >= 0"):
        FileRanges(p, [0, -8], [1, 1])
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        FileRanges(p, [0, 8], [1, -1])
    with pytest.raises(ValueError, match="1 lengths for 2 samples"):
        FileRanges(p, [0, 8], [1])
    with pytest.raises(ValueError, match="3 names for 2 ranges"):
        FileRanges(p, [0, 8], [1, 1], names=["a", "b", "c"])
    with pytest.raises(ValueError, match="offsets must be a 1-D sequence of integers"):
        FileRanges(p, [[0, 8]], [1, 1])


def test_o_direct_needs_aligned_ranges(tmp_path):
    p = tmp_path / "r.bin"
    p.write_bytes(bytes(16384))
    ranges = FileRanges(str(p), [0, 4096, 4100], [10, 10, 10], names=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"r\.bin\[c\] starts at 4100"):
        fastread.Reader(source=ranges, batch_size=2, o_direct=True)
    aligned = FileRanges(str(p), [0, 4096], [10, 10])
    assert [a.tobytes() for a in aligned.read([0, 1], engine="psync", o_direct=True)] == \
        [bytes(10)] * 2


def test_sources_sit_below_their_consumers():
    # Layers, bottom up: source -> image (a source) -> reader (consumes any
    # source) -> dali; nothing below imports what is above it, at any depth.
    from test_layering import python_import_graph

    graph = python_import_graph()

    def reaches(a, b):
        seen, todo = set(), [a]
        while todo:
            m = todo.pop()
            if m == b:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return False

    below_above = [("fastread.source", "fastread.image"), ("fastread.source", "fastread.reader"),
                   ("fastread.image", "fastread.reader"), ("fastread.reader", "fastread.dali"),
                   ("fastread.dali._common", "fastread.dali.readers"),
                   ("fastread.dali._common", "fastread.dali._image"),
                   ("fastread.datasets._shared", "fastread.datasets.jpeg"),
                   # shards and epochs below the readers and the scan that
                   # re-exports them; the batch sources below the DALI
                   # readers and the torch loaders; the loaders apart.
                   ("fastread.sampling", "fastread.index"), ("fastread.sampling", "fastread.reader"),
                   ("fastread.dali.sources", "fastread.dali._common"),
                   ("fastread.dali.sources", "fastread.torch"),
                   ("fastread.formats.in_memory", "fastread.formats.cifar"),
                   ("fastread.torch.records", "fastread.torch.images"),
                   ("fastread.torch.images", "fastread.torch.records"),
                   ("fastread.files", "fastread.source"), ("fastread.engine", "fastread.files")]
    for low, high in below_above:
        assert not reaches(low, high), f"{low} imports {high} (directly or through others)"
    assert reaches("fastread.reader", "fastread.source")
    assert reaches("fastread.reader", "fastread.sampling")
    assert reaches("fastread.torch", "fastread.torch.images")
    assert reaches("fastread.torch", "fastread.torch.records")

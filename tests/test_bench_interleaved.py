"""fastread.bench.interleaved, the pieces the interleaved-rounds scripts share
(bench/dali/bench_native.py, bench/dali/bench_image.py,
bench/dali/wds_native.py): --modes parsing, the rounds' order, the report's
medians and ratios. No DALI: the pipelines are stand-ins."""
import pytest

from fastread.bench.interleaved import parse_modes, report_rows, run_rounds, warm_page_cache


def test_parse_modes_keeps_labels_and_types_the_arguments():
    got = parse_modes("dali,native:threads=2+o_direct=TRUE+engine=psync+skip=-1,external:x=false")
    assert got == [("dali", "dali", {}),
                   ("native:threads=2+o_direct=TRUE+engine=psync+skip=-1", "native",
                    {"threads": 2, "o_direct": True, "engine": "psync", "skip": -1}),
                   ("external:x=false", "external", {"x": False})]


def test_parse_modes_refuses_an_unknown_mode_naming_it():
    with pytest.raises(SystemExit, match="unknown modes bogus; known: dali, native"):
        parse_modes("dali,bogus:x=1", known=("dali", "native"))
    assert parse_modes("native", known=("dali", "native")) == [("native", "native", {})]


class FakePipe:
    """A stand-in pipeline: batches of `size` samples."""

    def __init__(self, size):
        self.size = size

    def run(self):
        return None, [0] * self.size


def test_run_rounds_interleaves_and_counts_every_sample(capsys):
    built = []

    def build(name, kw):
        built.append((name, kw))
        return FakePipe(kw.get("size", 4))

    modes = parse_modes("a,b:size=2")
    rates, cpu = run_rounds(modes, build, rounds=3, warmup=1, batches=5)
    assert built == [("a", {}), ("b", {"size": 2})] * 3  # A B A B A B
    assert list(rates) == ["a", "b:size=2"] and all(len(v) == 3 for v in rates.values())
    assert all(r > 0 for v in rates.values() for r in v)
    assert all(c >= 0 for v in cpu.values() for c in v)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:3] for ln in lines] == [["round", str(r), m] for r in (1, 2, 3)
                                                 for m in ("a", "b:size=2")]


def test_report_rows_medians_paired_ratios_and_ceiling():
    rates = {"base": [100.0, 200.0, 300.0], "fast": [300.0, 300.0, 900.0],
             "top": [400.0, 400.0, 400.0]}
    cpu = {"base": [10.0, 10.0, 10.0], "fast": [5.0, 5.0, 5.0], "top": [2.0, 2.0, 2.0]}
    base, fast, top = report_rows(rates, cpu, base="base", ceiling="top")
    # fast: median 300 over base's 200 = 1.50x; per round 3, 1.5, 3 -> paired 3.00x;
    # 300 of the ceiling's 400 = 75%; CPU 10/5 = 2x.
    assert fast.split()[:3] == ["fast", "300", "img/s"]
    assert "1.50x (paired  3.00x)" in fast and "75.0%" in fast and "(2.00x)" in fast
    assert "runs: 300, 300, 900" in fast
    assert "1.00x (paired  1.00x)" in base and "50.0%" in base
    assert "100.0%" in top and "(5.00x)" in top
    # No base: no ratios, the medians and runs still.
    plain, = report_rows({"m": [1.0, 3.0]}, {"m": [1.0, 1.0]})
    assert "x (paired" not in plain and plain.split()[:2] == ["m", "2"]


def test_warm_page_cache_reads_every_file_and_names_a_missing_one(tmp_path):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 100)
    warm_page_cache([str(a)])
    with pytest.raises(FileNotFoundError, match="missing"):
        warm_page_cache([str(a), str(tmp_path / "missing")])


def test_build_pipeline_outputs_bytes_or_shapes(tmp_path):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    import numpy as np
    from nvidia.dali import fn

    from fastread.bench.interleaved import build_pipeline

    (tmp_path / "c").mkdir()
    want = [bytes(range(i + 1)) for i in range(4)]
    for i, data in enumerate(want):
        (tmp_path / "c" / f"{i}.jpg").write_bytes(data)

    def read():
        return fn.readers.file(file_root=str(tmp_path))

    common = dict(batch=4, threads=1, depth=2, gpu=False, decode=False)
    data, labels = build_pipeline(read, **common).run()
    assert [np.array(data[i]).tobytes() for i in range(4)] == want
    shapes, _ = build_pipeline(read, shapes_only=True, **common).run()
    assert [np.array(shapes[i]).tolist() for i in range(4)] == [[len(w)] for w in want]

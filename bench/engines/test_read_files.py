"""Reading batches of 64 files: fastread.read_files per engine (buffered and
O_DIRECT) against the seed's Python loop.

Each timed round reads the same FASTREAD_BENCH_BATCHES batches one after the
other, so one timing covers e.g. 100 batches (6400 files); img/s and GB/s of
the mean and best rounds go into ``extra_info``. These are measurements, not
tests: nothing here asserts a speed. After the first round the files are in
the page cache, so the buffered numbers are warm-cache numbers; O_DIRECT
reads bypass the cache and go to the device every round.
"""
import os

import numpy as np
import pytest

import fastread


def _engine_params():
    params = []
    for name, st in fastread.engines().items():
        marks = [] if st.files is True else [pytest.mark.skip(reason=f"engine {name}: {st.files}")]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def _measure(benchmark, batches, rounds, read_batch):
    files = sum(len(b) for b in batches)
    nbytes = sum(os.path.getsize(p) for b in batches for p in b)

    def one_round():
        total = 0
        for batch in batches:
            arrays = read_batch(batch)
            total += len(arrays)
        return total

    benchmark.extra_info.update({"batches": len(batches), "batch_size": len(batches[0]),
                                 "files_per_round": files})
    got = benchmark.pedantic(one_round, rounds=rounds, warmup_rounds=1, iterations=1)
    assert got == files
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None and stats.mean > 0:
        benchmark.extra_info.update({
            "img_per_s": files / stats.mean,
            "img_per_s_best": files / stats.min,
            "gb_per_s": nbytes / stats.mean / 1e9,
            "bytes_per_round": nbytes,
        })


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "o_direct"])
@pytest.mark.parametrize("engine", _engine_params())
def test_read_files(benchmark, batches, rounds, engine, direct):
    benchmark.group = "read 64 files"
    try:
        fastread.read_files(batches[0], engine=engine, o_direct=direct)
    except OSError as e:
        pytest.skip(f"{engine} {'O_DIRECT' if direct else 'buffered'} cannot read here: {e}")
    _measure(benchmark, batches, rounds,
             lambda batch: fastread.read_files(batch, engine=engine, o_direct=direct))


def test_python_loop(benchmark, batches, rounds):
    """The seed's loop: one np.fromfile per sample."""
    benchmark.group = "read 64 files"
    _measure(benchmark, batches, rounds,
             lambda batch: [np.fromfile(p, dtype=np.uint8) for p in batch])

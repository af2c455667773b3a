"""bench/gpu/ddp_check.py's checks find overlapping, missing and unevenly
batched shards (the script itself runs under torchrun on the GPU machine)."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def ddp():
    spec = importlib.util.spec_from_file_location(
        "ddp_check", os.path.join(HERE, "..", "bench", "gpu", "ddp_check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def epoch(ids, batches):
    return [dict(batches=batches, ids=[(i, 1) for i in ids], bytes=len(ids), seconds=1.0)]


ALL = {(i, 1) for i in range(10)}


def test_good_shards_pass(ddp):
    per_rank = [epoch(range(0, 5), 2), epoch(range(5, 10), 2)]
    assert ddp.check("reader", "FILL", per_rank, ALL, 2, 4) == []


def test_overlap_missing_and_extra_are_found(ddp):
    per_rank = [epoch(range(0, 6), 2), epoch([5, 6, 7, 8, 42], 2)]
    problems = ddp.check("reader", "FILL", per_rank, ALL, 2, 4)
    assert any("both delivered 1 samples" in p for p in problems)
    assert any("1 samples missing, 1 not in the set" in p for p in problems)


def test_unequal_batch_counts_fail_except_partial(ddp, capsys):
    per_rank = [epoch(range(0, 5), 2), epoch(range(5, 10), 3)]
    assert any("batch counts differ" in p for p in ddp.check("x", "FILL", per_rank, ALL, 2, 4))
    assert ddp.check("x", "PARTIAL", per_rank, ALL, 2, 4) == []
    assert "PARTIAL" in capsys.readouterr().out


def test_drop_may_miss_less_than_a_batch_per_rank(ddp):
    per_rank = [epoch(range(0, 4), 1), epoch(range(5, 9), 1)]
    assert ddp.check("x", "DROP", per_rank, ALL, 2, 4) == []
    assert ddp.check("x", "FILL", per_rank, ALL, 2, 4) != []

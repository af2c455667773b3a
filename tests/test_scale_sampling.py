"""The sample orders at scale (docs/scale.md): what one rank's epoch order
holds at 10^7-10^8 samples, bounded per sample, not a Python object each."""
import tracemalloc

import numpy as np

from fastread.sampling import EpochOrder


def test_shuffle_buffer_order_holds_8_bytes_a_sample_of_its_shard():
    # The buffer's draw is sequential (fr_buffer_shuffle): the shard's order
    # is held whole, one int64 a sample, and made through one int64 input
    # (16 bytes a sample at the peak): 10^7 samples, 2 shards.
    n = 10 ** 7
    tracemalloc.start()
    try:
        o = EpochOrder(n, shard_id=1, num_shards=2, shuffle=True, seed=3, shuffle_buffer=8192,
                       batch_size=256)
        first = o.batch(0)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert o.memory() == 8 * (n // 2)
    assert kept <= 8 * (n // 2) + (1 << 20) and peak <= 16 * (n // 2) + (1 << 20)
    assert len(first) == 256 and np.all((first >= n // 2) & (first < n))
    assert len(np.unique(first)) == 256


def test_full_shuffle_order_is_bounded_whatever_n():
    # 10^8 samples: the order is computed per slice (fr_order), 512 KiB at most.
    n = 10 ** 8
    tracemalloc.start()
    try:
        o = EpochOrder(n, shard_id=3, num_shards=8, shuffle=True, seed=1, batch_size=256)
        b = o.batch(o.batches() - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert o.memory() <= 512 * 1024 and peak <= 1 << 20
    assert len(b) and len(np.unique(b)) == len(b)

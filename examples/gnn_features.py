"""GNN mini-batches with features from storage: sampled node ids on the GPU
-> their feature rows on the GPU, in a ``torch.utils.data`` loop.

    python examples/gnn_features.py                        # a synthetic graph, GPU if there is one
    python examples/gnn_features.py --device cpu --nodes 20000
    python examples/gnn_features.py --features feat.npy    # your own (N, F) features

Each step: a DataLoader yields a batch of seed nodes; a one-hop neighbour
sampler (on the device, from a CSR adjacency) picks ``--fanout`` neighbours
per seed; ``FeatureStore.gather`` fetches the rows of the seeds and their
neighbours from the feature file straight into device memory (GPU-initiated
reads and an HBM cache with the proxy backend); a GraphSAGE-style layer
(mean of neighbours, concatenated with the node's own features) trains on
them. ``--check`` compares every gathered batch with NumPy's memmap.
"""
import argparse
import os
import tempfile
import time

import numpy as np
import torch

from fastread.features import FeatureStore


def synthetic_graph(nodes, features, avg_degree, path, seed=0):
    """A power-law graph (CSR) and an (nodes, features) float32 .npy file."""
    rng = np.random.default_rng(seed)
    if not os.path.exists(path):
        feats = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                          shape=(nodes, features))
        for lo in range(0, nodes, 1 << 16):
            hi = min(nodes, lo + (1 << 16))
            feats[lo:hi] = rng.standard_normal((hi - lo, features), dtype=np.float32)
        feats.flush()
        del feats
    degree = np.minimum(rng.zipf(2.0, nodes), 50 * avg_degree).astype(np.int64)
    degree = np.maximum(1, degree * avg_degree // max(1, int(degree.mean())))
    indptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(degree, out=indptr[1:])
    # Neighbours drawn with a Zipf-like popularity: a few hub nodes are everyone's neighbours.
    indices = (rng.zipf(1.5, int(indptr[-1])) - 1) % nodes
    labels = rng.integers(0, 8, nodes)
    return indptr, indices.astype(np.int64), labels


def sample_neighbours(indptr, indices, seeds, fanout, gen):
    """``fanout`` neighbours per seed (with replacement), on the seeds' device."""
    start, deg = indptr[seeds], indptr[seeds + 1] - indptr[seeds]
    r = torch.rand((len(seeds), fanout), device=seeds.device, generator=gen)
    pick = start[:, None] + (r * deg[:, None]).long()
    return indices[pick]  # (batch, fanout)


class Sage(torch.nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.lin = torch.nn.Linear(2 * features, hidden)
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, x_self, x_neigh):
        h = torch.cat([x_self, x_neigh.mean(dim=1)], dim=1)
        return self.out(torch.relu(self.lin(h)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", help="an (N, F) .npy feature file (default: a synthetic graph)")
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128, help="feature width of the synthetic graph")
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanout", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default=None, help="FeatureStore backend (default: auto)")
    p.add_argument("--cache-bytes", default=None, help="HBM cache, e.g. 2G")
    p.add_argument("--workdir", default=tempfile.gettempdir())
    p.add_argument("--check", action="store_true", help="compare every batch with np.memmap")
    args = p.parse_args(argv)
    dev = torch.device(args.device)

    path = args.features or os.path.join(args.workdir, f"gnn-{args.nodes}x{args.dim}.npy")
    if not args.features:
        synthetic_graph(args.nodes, args.dim, args.degree, path)  # writes the features once
    store = FeatureStore(path, backend=args.backend, cache_bytes=args.cache_bytes,
                         device_id=-1 if dev.type == "cpu" else dev.index or 0)
    nodes, dim = store.shape
    indptr, indices, labels = synthetic_graph(nodes, dim, args.degree, path)  # the graph
    print(f"{store}: backend {store.backend}; {nodes:,} nodes, {len(indices):,} edges")
    indptr, indices = torch.from_numpy(indptr).to(dev), torch.from_numpy(indices).to(dev)
    labels = torch.from_numpy(labels).to(dev)
    reference = np.load(path, mmap_mode="r") if args.check else None

    # The torch.utils.data part: seed nodes in shuffled batches.
    train = torch.arange(nodes)
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True,
                                         drop_last=True)
    model = Sage(dim, 256, 8).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = 0
    t0 = time.perf_counter()
    for step, seeds in enumerate(loader):
        if step == args.steps:
            break
        seeds = seeds.to(dev, non_blocking=True)
        neigh = sample_neighbours(indptr, indices, seeds, args.fanout, gen)
        ids = torch.cat([seeds, neigh.reshape(-1)])          # sampled node ids, on the device
        x = store.gather(ids)                                # their features, on the device
        if reference is not None:
            np.testing.assert_array_equal(x.cpu().numpy(), reference[ids.cpu().numpy()])
        x_self, x_neigh = x[:len(seeds)], x[len(seeds):].view(len(seeds), args.fanout, dim)
        loss = torch.nn.functional.cross_entropy(model(x_self, x_neigh), labels[seeds])
        opt.zero_grad()
        loss.backward()
        opt.step()
        rows += len(ids)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    dt = time.perf_counter() - t0
    st = store.stats()
    print(f"{rows:,} feature rows in {dt:.2f} s ({rows / dt / 1e6:.2f}M rows/s incl. training); "
          f"tiers {st['tiers']}, {st['bytes_read'] / 1e6:.1f} MB read; memory "
          f"{store.memory()['total'] / 1e6:.1f} MB")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

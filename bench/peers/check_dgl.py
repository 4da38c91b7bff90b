"""Checks that the DGL peer (bench/peers/dgl_worker.py) computes what PyG's twin
(bench/pyg_models.py) computes, so that timing one against the other compares the same
model: PyG's model is built (seed 0), every floating tensor of its state_dict then moved
off its initial value (biases, eps and batch-norm statistics start at 0 or 1, where a
wrong mapping would go unseen), its eval-mode logits taken on the edge_index form; the
same weights go to the DGL worker (in DGL's venv, bench/peers/dgl_env.py), which runs its
twin in eval mode; the two logits are compared.

Runs in mgg's venv with bench/ on sys.path:

    python bench/peers/check_dgl.py [GRAPH.npz ...]   (default shared/data/cora.npz)

prints, for each graph and each of gcn, sage, gin, gat: max_abs (largest absolute
difference of the logits), max_rel (max_abs / largest absolute PyG logit) and agree (the
fraction of nodes whose argmax agrees). They are the same functions in float32, summed in
another order: on cora and amazon_computers max_rel <= 1.4e-6 for every model (GIN: 0),
argmax agreement 1.0. No layer differs in eval mode: GraphConv(norm='both') on the graph
with one self loop per node is GCNConv (symmetric graphs: out- and in-degree agree; on a
directed graph DGL's source side would take out-degrees where PyG takes in-degrees);
SAGEConv keeps lin_l's bias on fc_self, the sum is the same. In training the dropout
masks differ (another RNG stream, another order of draws), so trained weights do not
match bit for bit; the functions trained are the same.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1]
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

MODELS = ("gcn", "sage", "gin", "gat")


def write_peer_file(ds, path) -> None:
    """The peer file (dgl_worker.py's input) of an mgg Dataset: its edges src -> dst, x
    dense float32, y int64, the training nodes' indices, num_classes."""
    import scipy.sparse as sp

    if ds.x is None or ds.y is None or ds.train_mask is None:
        raise ValueError(f"{ds.name}: x, y and train_mask needed (bench/common.py complete)")
    if ds.y.ndim != 1:
        raise ValueError(f"{ds.name}: multi-label y {ds.y.shape}: the peers take classes")
    x = ds.x.toarray() if sp.issparse(ds.x) else np.asarray(ds.x)
    src, dst = ds.graph.edges()
    np.savez(
        path,
        src=np.asarray(src, dtype=np.int64),
        dst=np.asarray(dst, dtype=np.int64),
        x=np.ascontiguousarray(x, dtype=np.float32),
        y=np.asarray(ds.y, dtype=np.int64),
        train=np.flatnonzero(ds.train_mask).astype(np.int64),
        num_classes=np.int64(ds.num_classes),
    )


def _perturbed(model, seed: int = 1):
    """Every floating tensor of the state moved off its initial value (seeded)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if k.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
            else:
                t.add_(0.1 * torch.randn(t.shape, generator=g))
    return model


def check(peer_path, model: str, graph) -> dict:
    """PyG's twin vs DGL's on the peer file's features, same weights: max_abs, max_rel
    (max_abs / max |PyG logit|), agree (argmax agreement fraction)."""
    import torch
    from pyg_models import pyg_graph, pyg_model

    from peers.dgl_env import run_worker

    with np.load(peer_path, allow_pickle=False) as z:
        x = torch.from_numpy(z["x"])
        c = int(z["num_classes"])
    torch.manual_seed(0)
    net = _perturbed(pyg_model(model, x.shape[1], c)).eval()
    with torch.no_grad():
        ref = net(x, pyg_graph(graph, "edge_index")).numpy()
    with tempfile.TemporaryDirectory(prefix="mgg-dgl-check-") as tmp:
        weights, out = Path(tmp) / "weights.npz", Path(tmp) / "logits.npy"
        np.savez(weights, **{k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
        run_worker("forward", peer_path, model, weights, out)
        got = np.load(out)
    if got.shape != ref.shape:
        raise RuntimeError(f"{model}: DGL logits {got.shape}, PyG's {ref.shape}")
    diff = float(np.abs(got - ref).max())
    return {
        "max_abs": diff,
        "max_rel": diff / max(float(np.abs(ref).max()), 1e-30),
        "agree": float((got.argmax(1) == ref.argmax(1)).mean()),
    }


def main(argv: list[str]) -> None:
    from mgg.graph.formats import read_npz

    from common import SHARED_DATA, complete

    paths = argv or [str(SHARED_DATA / "cora.npz")]
    for path in paths:
        ds = complete(read_npz(path))
        with tempfile.TemporaryDirectory(prefix="mgg-dgl-peer-") as tmp:
            peer = Path(tmp) / "peer.npz"
            write_peer_file(ds, peer)
            for m in MODELS:
                r = check(peer, m, ds.graph)
                print(json.dumps({"graph": Path(path).stem, "model": m, **r}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""DGL's side of the DGL peer: runs INSIDE the DGL venv (bench/peers/dgl_env.py), so it
imports nothing of mgg, and of bench/ only step_costs (torch 2.1 and numpy < 2 there).

    dgl_worker.py time PEER.npz MODEL EPOCHS
        trains EPOCHS + 2 full-graph steps and prints one JSON line: {"step_s": median
        of the steps after the first 2, "threads", "dgl", "torch"}.
    dgl_worker.py profile PEER.npz MODEL EPOCHS
        the same steps, then EPOCHS more under torch's profiler: {"step_s", "gemm_ms",
        "aten_ms", "profiled_ms"} (bench/step_costs.aten_split).
    dgl_worker.py forward PEER.npz MODEL WEIGHTS.npz OUT.npy
        builds the model, loads weights named as PyG's twin's state_dict
        (bench/pyg_models.py), runs it in eval mode without grad, saves the logits
        [N, C] float32 to OUT.npy and prints one JSON line: {"shape": [N, C]}.

PEER.npz: ``src``, ``dst`` int64 [E] (edges src -> dst), ``x`` float32 [N, F], ``y`` int64
[N], ``train`` int64 indices, ``num_classes`` int scalar.

MODEL is the DGL twin of ``pyg_models.pyg_model``: gcn (GraphConv norm='both' x 2, 16
hidden, on the graph with one self loop per node, as PyG's GCNConv adds them), sage
(SAGEConv 'mean' x 2, 16 hidden), gin (GINConv sum, learn_eps, MLP Linear-BatchNorm1d-
ReLU-Linear, 64 hidden, input dropout 0.9), gat (GATConv 8 heads x 8 then 1 head averaged,
attention dropout 0.6, ELU, on the graph with self loops). Dropout on each layer's input
(p_in for the first) as the PyG twin; Adam as ``pyg_models.pyg_optimizer``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from dgl.nn import GATConv, GINConv, GraphConv, SAGEConv  # noqa: E402
from torch import nn  # noqa: E402

MODELS = ("gcn", "sage", "gin", "gat")
LOOPS = {"gcn": True, "sage": False, "gin": False, "gat": True}  # self loops added once


def dgl_model(name: str, f: int, c: int) -> nn.Module:
    """The DGL twin of pyg_models.pyg_model(name, f, c)."""

    def mlp(a, b):
        return nn.Sequential(nn.Linear(a, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, b))

    if name == "gcn":
        convs, act, p_in, p = [GraphConv(f, 16), GraphConv(16, c)], F.relu, 0.5, 0.5
    elif name == "sage":
        convs, act, p_in, p = [SAGEConv(f, 16, "mean"), SAGEConv(16, c, "mean")], F.relu, 0.5, 0.5
    elif name == "gin":
        convs = [
            GINConv(mlp(f, 64), "sum", learn_eps=True),
            GINConv(mlp(64, c), "sum", learn_eps=True),
        ]
        act, p_in, p = F.relu, 0.9, 0.5
    elif name == "gat":
        convs = [
            GATConv(f, 8, num_heads=8, feat_drop=0.0, attn_drop=0.6),
            GATConv(64, c, num_heads=1, feat_drop=0.0, attn_drop=0.6),
        ]
        act, p_in, p = F.elu, 0.6, 0.6
    else:
        raise SystemExit(f"dgl_worker: unknown model {name!r}: one of {', '.join(MODELS)}")
    last = len(convs) - 1

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(convs)

        def forward(self, g, x):
            for i, conv in enumerate(self.convs):
                x = conv(g, F.dropout(x, p if i else p_in, self.training))
                if name == "gat":  # [N, heads, C]: heads concatenated, the last averaged
                    x = x.mean(1) if i == last else x.flatten(1)
                if i < last:
                    x = act(x)
            return x

    return Net()


def optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """pyg_models.pyg_optimizer: Adam, lr 0.01 (GAT 0.005), weight decay 5e-4 (GCN: on
    the first layer only)."""
    if name == "gcn":
        first = list(model.convs[0].parameters())
        rest = [q for conv in model.convs[1:] for q in conv.parameters()]
        groups = [{"params": first, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0}]
    else:
        groups = [{"params": list(model.parameters()), "weight_decay": 5e-4}]
    return torch.optim.Adam(groups, lr=0.005 if name == "gat" else 0.01)


def pyg_to_dgl(name: str, w: dict) -> dict:
    """DGL state_dict of the twin from PyG's state_dict ``w`` (name -> array)."""
    out, used = {}, set()

    def take(key):
        used.add(key)
        return torch.from_numpy(np.asarray(w[key]))

    layers = sorted({int(k.split(".")[1]) for k in w if k.startswith("convs.")})
    for i in layers:
        pre = f"convs.{i}."
        if name == "gcn":  # PyG lin.weight [out, in]; GraphConv.weight [in, out]
            out[pre + "weight"] = take(pre + "lin.weight").t().contiguous()
            out[pre + "bias"] = take(pre + "bias")
        elif name == "sage":  # PyG: lin_l(mean of neighbours) + lin_r(root), bias on lin_l
            out[pre + "fc_neigh.weight"] = take(pre + "lin_l.weight")
            out[pre + "fc_self.weight"] = take(pre + "lin_r.weight")
            out[pre + "fc_self.bias"] = take(pre + "lin_l.bias")
        elif name == "gin":
            out[pre + "eps"] = take(pre + "eps")
            for k in [k for k in w if k.startswith(pre + "nn.")]:
                out[pre + "apply_func." + k[len(pre + "nn.") :]] = take(k)
        elif name == "gat":  # PyG >= 2.5: lin.weight (shared src/dst); before: lin_src
            lin = pre + ("lin.weight" if pre + "lin.weight" in w else "lin_src.weight")
            out[pre + "fc.weight"] = take(lin)
            out[pre + "attn_l"] = take(pre + "att_src")
            out[pre + "attn_r"] = take(pre + "att_dst")
            out[pre + "bias"] = take(pre + "bias")
    left = sorted(set(w) - used)
    if left:
        raise SystemExit(f"dgl_worker: PyG weights with no DGL twin for {name}: {left}")
    return out


def load(peer_path: str, name: str):
    """(graph, x, y, train, model) with the graph built once, its formats materialized."""
    if name not in MODELS:
        raise SystemExit(f"dgl_worker: unknown model {name!r}: one of {', '.join(MODELS)}")
    z = np.load(peer_path, allow_pickle=False)
    x = torch.from_numpy(np.ascontiguousarray(z["x"], dtype=np.float32))
    n = x.shape[0]
    src = torch.from_numpy(z["src"].astype(np.int64))
    dst = torch.from_numpy(z["dst"].astype(np.int64))
    g = dgl.graph((src, dst), num_nodes=n)
    if LOOPS[name]:  # one self loop per node, as PyG's GCNConv/GATConv add them
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    g.create_formats_()
    y = torch.from_numpy(z["y"].astype(np.int64))
    train = torch.from_numpy(z["train"].astype(np.int64))
    model = dgl_model(name, x.shape[1], int(z["num_classes"]))
    return g, x, y, train, model


def time_steps(peer_path: str, name: str, epochs: int, profiled: bool = False) -> dict:
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    g, x, y, train, model = load(peer_path, name)
    opt = optimizer(name, model)

    def step():
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(g, x)[train], y[train])
        loss.backward()
        opt.step()

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from step_costs import aten_split, time_steps

    times = time_steps(step, epochs, warmup=2)
    split = aten_split(step, epochs) if profiled else {}
    return {
        **split,
        "step_s": float(np.median(times)),
        "threads": torch.get_num_threads(),
        "dgl": dgl.__version__,
        "torch": torch.__version__,
    }


def forward(peer_path: str, name: str, weights: str, out: str) -> None:
    g, x, _, _, model = load(peer_path, name)
    with np.load(weights, allow_pickle=False) as z:
        w = {k: z[k] for k in z.files}
    model.load_state_dict(pyg_to_dgl(name, w), strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(g, x)
    np.save(out, logits.numpy().astype(np.float32))
    print(json.dumps({"shape": list(logits.shape)}), flush=True)


def main(argv: list[str]) -> None:
    usage = (
        "usage: dgl_worker.py time|profile PEER.npz MODEL EPOCHS | "
        "dgl_worker.py forward PEER.npz MODEL WEIGHTS.npz OUT.npy"
    )
    if len(argv) == 4 and argv[0] in ("time", "profile"):
        steps = time_steps(argv[1], argv[2], int(argv[3]), profiled=argv[0] == "profile")
        print(json.dumps(steps), flush=True)
    elif len(argv) == 5 and argv[0] == "forward":
        forward(*argv[1:])
    else:
        raise SystemExit(usage)


if __name__ == "__main__":
    main(sys.argv[1:])

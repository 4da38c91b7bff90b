"""End to end on one GPU: the training step of mgg's registered models (GCN, SAGE, GIN,
GAT with their defaults) against PyG at its best (bench/pyg_models.py).

    python bench/gpu/e2e_vs_pyg.py [--scale 0.25] [--epochs 20] [--graphs A,B] [--models M,N]
                                   [--backend cuda|cpu]

Same stand-in graph, features, labels and model; Adam; one training step (forward,
backward, optimizer) timed with CUDA events, every side round-robin, medians. PyG is set
up as an expert would: the loss over out[train_rows] with the training rows an int64
index tensor on the device, made once (a boolean mask's indexing waits for the device to
size its result), and y[train_rows] gathered once; torch's fused Adam; and besides the
eager step, the whole step captured as a CUDA graph and replayed (pyg_graph_<form>:
PyTorch's whole-network capture, warm-up on a side stream, Adam capturable), where the
form's step can be captured (one that waits for the device is recorded as skipped, with
what waited). PyG runs on each graph form its layers take (pyg_models.PATHS: edge_index
as its examples pass it; the transposed sparse adjacency for GCN, SAGE and GIN, one
cuSPARSE product per layer and GCN's normalization cached; GAT's self loops added once);
the fastest of its sides, eager or captured, is its best (pyg_best_path names it). mgg
runs twice: in its own order (aggregating at the narrower width) and in PyG's
(mgg.torch.pyg_widths), so same_widths_vs_pyg_best compares kernels at equal widths and
vs_pyg_best adds the algebra. mgg_graph: mgg's step captured as a CUDA graph and
replayed (`mgg train --cuda-graph`). host_ms: per step, the wall time the GPU had no
kernel, copy or memset of the step to run (torch.profiler's device activity over a few
steps): the host floor. Goals: >= 2x PyG's best on every pair; host_ms < 1.

`--backend cpu` is the dry run of a GPU window, at toy sizes (`--scale 0.002 --epochs 2`):
every code path that needs no CUDA, on CPU ranks and the host clock (round-robin,
medians); the captured sides are recorded as skipped (they need CUDA), host_ms is left
empty, cupy is never imported, and the results are named e2e_vs_pyg_cpu, beside (never
over) a GPU run's.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import numpy as np
from common_gpu import PAPER_GRAPHS, Results, cuda_compare, grouped_bars, raw_log, standin_graph
from pyg_models import PATHS, pyg_graph, pyg_model, pyg_optimizer

import mgg.torch as mt
from mgg.prepare import prepare

from common import compare, csv_list, default_trainer, machine  # bench/: on the path

PYG_WARMUP = 3  # eager steps on the side stream before a PyG capture (torch's recipe)


class Skipped(Exception):
    """A side that cannot run here (it needs CUDA; its step cannot be captured): recorded
    in the row with its reason, not a failure of the run."""


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def pyg_inputs(ds, device: str) -> dict:
    """What every PyG side of a row shares, on ``device``: features x, the training rows
    as an int64 index tensor (made once, here: indexing with a boolean mask waits for the
    device to size its result, every step) and their labels y[rows], gathered once."""
    import torch

    rows = torch.from_numpy(np.flatnonzero(ds.train_mask).astype(np.int64)).to(device)
    y = torch.from_numpy(np.asarray(ds.y)).to(device)
    return {"x": torch.from_numpy(np.asarray(ds.x)).to(device), "rows": rows, "y_rows": y[rows]}


class PygSide:
    """PyG's training step on graph form ``form``, as an expert sets it up: the inputs of
    pyg_inputs, its own model, torch's fused Adam (``capturable``: its state on the
    device, for a CUDA graph). ``step()`` returns the loss (0-d, on the device: nothing
    here waits for it)."""

    def __init__(self, name: str, ds, inputs: dict, form: str, *, capturable: bool = False):
        device = inputs["x"].device
        self.x, self.rows, self.y_rows = inputs["x"], inputs["rows"], inputs["y_rows"]
        self.adj = pyg_graph(ds.graph, form, device)
        self.model = pyg_model(name, self.x.shape[1], ds.num_classes, form).to(device)
        self.opt = pyg_optimizer(name, self.model, fused=True, capturable=capturable)

    def loss(self):
        import torch

        out = self.model(self.x, self.adj).index_select(0, self.rows)  # = out[rows], as mgg
        return torch.nn.functional.cross_entropy(out, self.y_rows)

    def step(self):
        self.model.train()
        self.opt.zero_grad()
        loss = self.loss()
        loss.backward()
        self.opt.step()
        return loss.detach()

    def setup(self) -> dict:
        """What the step runs with, read off its objects (the row's JSON keeps it)."""
        adam = self.opt.param_groups[0]
        return {
            "train_rows": f"{self.rows.dtype} [{self.rows.numel()}] on {self.rows.device}",
            "adam": {k: bool(adam.get(k)) for k in ("fused", "foreach", "capturable")},
        }


def capture_pyg(side: PygSide, cuda=None):
    """``side``'s whole step captured as a CUDA graph (PyTorch's whole-network capture):
    PYG_WARMUP eager steps on a side stream, then one with every synchronization an error
    (a step that waits for the device cannot be captured: Skipped, naming what waited),
    the gradients set to None (backward allocates them in the graph's pool; each replay
    overwrites them), then forward, loss, backward and Adam's step captured. Returns the
    replay. ``cuda``: torch.cuda, or a stand-in of its stream and graph calls (tests)."""
    import torch

    cuda = torch.cuda if cuda is None else cuda
    side_stream = cuda.Stream()
    side_stream.wait_stream(cuda.current_stream())
    with cuda.stream(side_stream):
        for _ in range(PYG_WARMUP):
            side.step()
        before = cuda.get_sync_debug_mode()
        cuda.set_sync_debug_mode("error")
        try:
            side.step()
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:
            raise Skipped(f"cannot be captured: its step synchronizes ({first_line(e)})") from None
        finally:
            cuda.set_sync_debug_mode(before)
    cuda.current_stream().wait_stream(side_stream)
    side.opt.zero_grad(set_to_none=True)
    side.model.train()
    graph = cuda.CUDAGraph()
    try:
        with cuda.graph(graph):
            side.static_loss = side.loss()
            side.static_loss.backward()
            side.opt.step()
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        raise Skipped(f"cannot be captured: {first_line(e)}") from None
    return graph.replay


def pyg_sides(name, ds, device: str = "cuda", setups: dict | None = None) -> dict:
    """{side: builder} for each graph form of ``name``: 'pyg_<form>', the eager step, and
    'pyg_graph_<form>', the step captured (CUDA only: Skipped elsewhere). A builder
    returns the step and puts its side's PygSide.setup() in ``setups`` once built; the
    inputs are shared, each side has its own model."""
    inputs = pyg_inputs(ds, device)
    setups = {} if setups is None else setups

    def eager(form):
        side = PygSide(name, ds, inputs, form)
        setups[f"pyg_{form}"] = side.setup()
        return side.step

    def graphed(form):
        if device != "cuda":
            raise Skipped("needs CUDA (a CUDA graph replays a captured GPU stream)")
        side = PygSide(name, ds, inputs, form, capturable=True)
        replay = capture_pyg(side)
        setups[f"pyg_graph_{form}"] = side.setup()
        return replay

    out = {f"pyg_{p}": (lambda p=p: eager(p)) for p in PATHS[name]}
    out.update({f"pyg_graph_{p}": (lambda p=p: graphed(p)) for p in PATHS[name]})
    return out


def busy_seconds(intervals) -> float:
    """Seconds covered by the union of (start, end) intervals."""
    total, reach = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def host_ms(step, steps: int = 5) -> float | None:
    """Per step, the milliseconds of wall time the GPU had nothing of the step's to run:
    wall time of ``steps`` steps minus the union of their device activity (kernels,
    copies, memsets, as CUPTI records them through torch.profiler). None if the profiler
    recorded no device activity."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = [
        (e.time_range.start / 1e6, e.time_range.end / 1e6)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]
    if not spans:
        return None
    return max(wall - busy_seconds(spans), 0.0) / steps * 1e3


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: r["graph"],
        lambda r: {r["model"]: r["vs_pyg_best"]},
        "Training step on one GPU: mgg's speedup over PyG at its best",
        "PyG's best time / mgg time",
        goal=2.0,
    )


COLUMNS = [
    "graph",
    "scale",
    "nodes",
    "edges",
    "model",
    "mgg_ms",
    "mgg_same_widths_ms",
    "mgg_graph_ms",
    "pyg_ms",
    "pyg_eager_best_ms",
    "pyg_best_ms",
    "pyg_best_path",
    "vs_pyg",
    "vs_pyg_best",
    "same_widths_vs_pyg_best",
    "graph_vs_pyg_best",
    "host_ms",
    "graph_host_ms",
    "pyg_host_ms",
    "skipped",
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    ap.add_argument("--models", default=",".join(mt.MODELS))
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args(argv)
    graphs = csv_list(args.graphs)
    models = csv_list(args.models, allowed=list(mt.MODELS))
    gpu = args.backend == "cuda"
    name = "e2e_vs_pyg" if gpu else "e2e_vs_pyg_cpu"
    clock = (
        "CUDA events"
        if gpu
        else "the host clock (CPU dry run: the captured sides and host_ms need CUDA)"
    )
    res = Results(
        name,
        {"scale": args.scale, "backend": args.backend, "pyg_paths": PATHS},
        COLUMNS,
        notes=f"{'One GPU' if gpu else 'CPU'}, P = 1. Training step: forward, backward, Adam; "
        f"timed with {clock}, round-robin, medians. PyG as an expert sets it up: the loss "
        "over out[train_rows], an int64 index tensor made once; torch's fused Adam; the "
        "step captured as a CUDA graph (pyg_graph_<form>) where it can be. pyg_ms: PyG's "
        "eager step on edge_index as its examples run it; pyg_eager_best_ms: its fastest "
        "eager form; pyg_best_ms: its fastest side, eager or captured (pyg_best_path: "
        "<form> or graph_<form>); pyg_<side>_ms and each side's setup (pyg_setup) in the "
        "JSON. mgg_same_widths_ms: mgg aggregating at PyG's widths (GAT: the same order, "
        "not timed twice). mgg_graph_ms: mgg's step captured as a CUDA graph and replayed "
        "(--cuda-graph). host_ms: per step, wall time with no device activity of the step "
        "(the host floor; the profiler's own overhead included).",
        plot=plot,
        device_info=None if gpu else {"device": f"cpu: {machine()['cpu']}"},
    )
    with raw_log(name):
        for gname in graphs:
            ds = standin_graph(gname, args.scale, features=True)  # with a split
            for model in models:
                dg, data = prepare(ds, None, model, backend=args.backend)
                t = default_trainer(dg, data, model)
                row = {
                    "graph": gname,
                    "scale": args.scale,
                    "nodes": ds.graph.num_nodes,
                    "edges": ds.graph.num_edges,
                    "model": model,
                    **measure(t, model, ds, args.epochs, args.backend),
                }
                res.add(row)
                print(f"{gname} {model}: {row}", flush=True)
                del t
                dg.free()
                while JOBS:
                    JOBS.pop().free()
                free_gpu()
        code = res.finish()
    for line in FAILED:  # measured what it could; the run still fails
        print(f"FAILED {line}", file=sys.stderr)
    return code or (1 if FAILED else 0)


def time_sides(fns: dict, epochs: int, gpu: bool) -> dict:
    """Median seconds of each side's step, round-robin: between CUDA events on a GPU, by
    the host clock on a CPU (where each step ends when its call returns)."""
    return cuda_compare(fns, repeat=epochs) if gpu else compare(fns, repeat=epochs, warmup=1)


def measure(trainer, model, ds, epochs, backend: str = "cuda") -> dict:
    """One row's times: every side that fits in GPU memory, round-robin. Where the sides
    fit alone but not together, PyG's captured sides (each holding its whole step's
    memory in its graph's pool) are dropped and the others timed again."""
    gpu = backend == "cuda"
    builders = {"mgg": lambda: trainer.train_step, "mgg_graph": captured(model, ds, backend)}
    if model != "gat":  # GAT aggregates at the same width in both orders

        def same_widths():
            def step():
                with mt.pyg_widths(trainer.model):
                    trainer.train_step()

            return step

        builders["mgg_same_widths"] = same_widths
    setups: dict = {}
    builders.update(pyg_sides(model, ds, backend, setups))
    fns, skipped = build_sides(builders)
    t = None
    try:
        t = time_sides(fns, epochs, gpu)
    except oom():  # the sides fit alone but not together
        pass
    if t is None:
        heavy = [k for k in fns if k.startswith("pyg_graph_")]
        for k in heavy:
            skipped[k] = "dropped: the sides ran out of GPU memory together"
            del fns[k]
        free_gpu()
        try:
            t = time_sides(fns, epochs, gpu) if heavy else None
        except oom():
            pass
        if t is None:
            return {"skipped": f"{', '.join(fns)} ran out of GPU memory together"}
    ms = {k: v * 1e3 for k, v in t.items()}
    pyg = {k[4:]: v for k, v in ms.items() if k.startswith("pyg_")}
    eager = {k: v for k, v in pyg.items() if not k.startswith("graph_")}
    best = min(pyg, key=pyg.get) if pyg else None
    row = {
        "mgg_ms": ms.get("mgg"),
        "mgg_same_widths_ms": ms.get("mgg_same_widths", ms.get("mgg") if model == "gat" else None),
        "mgg_graph_ms": ms.get("mgg_graph"),
        "pyg_ms": pyg.get("edge_index"),
        "pyg_eager_best_ms": min(eager.values()) if eager else None,
        "pyg_best_ms": pyg.get(best),
        "pyg_best_path": best,
        **{f"pyg_{k}_ms": v for k, v in pyg.items()},
        "pyg_setup": setups,
        "skipped": "; ".join(f"{k}: {v}" for k, v in skipped.items()),
    }
    for key, num, den in (
        ("vs_pyg", "pyg_ms", "mgg_ms"),
        ("vs_pyg_best", "pyg_best_ms", "mgg_ms"),
        ("same_widths_vs_pyg_best", "pyg_best_ms", "mgg_same_widths_ms"),
        ("graph_vs_pyg_best", "pyg_best_ms", "mgg_graph_ms"),
    ):
        row[key] = row[num] / row[den] if row[num] and row[den] else None
    for key, side in (("host_ms", "mgg"), ("graph_host_ms", "mgg_graph"), ("pyg_host_ms", None)):
        side = side or (f"pyg_{best}" if best else None)
        row[key] = host_ms(fns[side]) if gpu and side in fns else None
    return row


def captured(model, ds, backend: str = "cuda"):
    """The builder of the mgg_graph side: its own job and trainer with cuda_graph, past
    its eager warm-up steps and its capture, so that each timed step is one replay
    (Skipped without CUDA)."""

    def build():
        if backend != "cuda":
            raise Skipped("needs CUDA (mgg train --cuda-graph replays a captured GPU stream)")
        from mgg.torch.graphs import WARMUP

        dg, data = prepare(ds, None, model, backend="cuda")
        t = default_trainer(dg, data, model, cuda_graph=True)
        for _ in range(WARMUP + 1):
            t.train_step()
        step = t.train_step
        JOBS.append(dg)  # freed with the row's other sides
        return step

    return build


JOBS: list = []  # the graph sides' jobs of the row being measured
FAILED: list = []  # "side: failed: why" of every side that failed in this run


def build_sides(builders: dict) -> tuple[dict, dict]:
    """({side: step} for the sides that built and ran one step, {side: why not}). A side
    that cannot run here (Skipped) is recorded with its reason; one that fails otherwise
    than for memory is recorded as failed (its traceback printed, and in FAILED) and the
    others still run: one broken side costs its own cell only."""
    fns, skipped = {}, {}
    for name, build in builders.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = build()
                fn()
            fns[name] = fn
        except Skipped as e:
            skipped[name] = str(e)
        except oom():
            skipped[name] = "ran out of GPU memory"
        except Exception as e:
            traceback.print_exc()
            skipped[name] = f"failed: {first_line(e)}"
            FAILED.append(f"{name}: {skipped[name]}")
        if name in skipped:  # outside the handler: its traceback holds the side's tensors
            free_gpu()
    return fns, skipped


def oom() -> tuple:
    """The exceptions of a full GPU: torch's and CuPy's (a MemoryError)."""
    import torch

    return (torch.OutOfMemoryError, MemoryError)


def free_gpu():
    """Give back what the pools hold: CuPy's where something imported it (never on a CPU
    run), torch's where CUDA was initialized."""
    import torch

    if "cupy" in sys.modules:
        sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())

"""partition.plan.job_plan: the plans of job_graph(graph, kind), equal bit for bit to
build_plan's of that graph, without building it where the graph is unweighted."""

import numpy as np
import pytest

from mgg.graph.core import GRAPH_KINDS, Graph, job_graph
from mgg.graph.generators import rmat
from mgg.partition.plan import build_plan, job_plan


def _with_loops(seed: int, symmetric: bool) -> Graph:
    """A small graph with self loops (some nodes two), duplicates and isolated nodes."""
    rng = np.random.default_rng(seed)
    n = 300
    src, dst = rng.integers(0, n - 20, 4000), rng.integers(0, n - 20, 4000)
    loops = rng.integers(0, n, 120)
    src, dst = np.concatenate([src, loops, loops[:30]]), np.concatenate([dst, loops, loops[:30]])
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    g = Graph.from_edges(src, dst, n)
    g.symmetric = True if symmetric else None
    return g


GRAPHS = {
    "rmat": lambda: rmat(9, seed=2),
    "loops": lambda: _with_loops(1, True),
    "directed": lambda: _with_loops(2, False),
}


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("kind", GRAPH_KINDS)
@pytest.mark.parametrize(("ranks", "split"), [(1, "edges"), (3, "edges"), (4, "mixed")])
def test_job_plan_is_build_plan_of_the_job_graph(name, kind, ranks, split):
    g = GRAPHS[name]()
    transposed = g.symmetric is True  # a directed graph's transposed plans: build_plan's own
    want = build_plan(job_graph(g, kind), ranks, 4, split=split, transposed=transposed)
    got = job_plan(g, kind, ranks, 4, split=split, transposed=transposed)
    assert [p.digest() for p in got] == [p.digest() for p in want]
    assert [p.num_edges for p in got] == [p.num_edges for p in want]
    one = job_plan(g, kind, ranks, 4, rank=ranks - 1, split=split, transposed=transposed)
    assert one.digest() == want[-1].digest()
    if kind == "gcn_norm":
        assert all(p.norm is not None and p.local_weights is None for p in got)


def test_a_directed_graph_with_transposed_plans_and_weights_fall_back():
    g = GRAPHS["directed"]()
    want = build_plan(job_graph(g, "gcn_norm"), 2, 8)
    assert [p.digest() for p in job_plan(g, "gcn_norm", 2, 8)] == [p.digest() for p in want]
    w = Graph(g.indptr, g.indices, np.linspace(0.5, 2, g.num_edges, dtype=np.float32), 300)
    want = build_plan(job_graph(w, "self_loops"), 2, 8)
    assert [p.digest() for p in job_plan(w, "self_loops", 2, 8)] == [p.digest() for p in want]
    with pytest.raises(ValueError, match="unknown graph kind"):
        job_plan(g, "gcn", 2)

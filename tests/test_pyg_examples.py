"""examples/pyg's ports of PyG's examples/sgc.py, tagcn.py, arma.py and mixhop.py: each at 1
and 4 ranks gives the same losses and accuracies line for line (arma.py's ARMAConv drops
its rows inside the layer: mgg.pyg.inside gives that F.dropout mgg's masks), and its PyG
twin (bench/pyg_ports.py) differs from it in exactly the lines it marks `# PyG:`.

PyG's four scripts call no torch.manual_seed, and mgg does not broadcast a model's initial
weights: started as they are, the ranks of a job (and two runs) begin from different
weights. The runs here seed torch first (bench/pyg_ports.py's SEEDED, the script itself
unchanged), as bench/pyg_ports.py does. To keep the file short on 2 cores, one job per
rank count runs the four scripts one after another (each seeded and run as `python
script` runs it): one start of mpiexec, MPI, torch and mgg instead of four.
"""

import sys

import pytest

from conftest import ROOT, mpirun

sys.path.insert(0, str(ROOT / "bench"))
from pyg_ports import SEEDED, twin  # noqa: E402

CORA = ROOT / ".." / "shared" / "data" / "cora.npz"
SCRIPTS = {"sgc": 2, "tagcn": 3, "arma": 3, "mixhop": 2}  # the lines each marks `# PyG:`
EPOCHS = 3

# the four scripts in one process, each after torch.manual_seed(0); rank 0 prints a header
# line before each script's output
ALL = (
    "import sys\n"
    "scripts, epochs = sys.argv[1:-1], sys.argv[-1]\n"
    "for script in scripts:\n"
    "    print('== ' + script, flush=True)\n"
    "    sys.argv = ['-c', '0', script, '--epochs', epochs]\n"
    f"    exec(compile({SEEDED!r}, '<seeded>', 'exec'), {{'__name__': '__seeded__'}})\n"
)


def epochs_of(stdout: str) -> dict[str, list[list[float]]]:
    """Each script's [epoch, loss, train, val, test] lines, by script name."""
    out, name = {}, None
    for ln in stdout.splitlines():
        if ln.startswith("== "):
            name = ln[3:].rsplit("/", 1)[-1].removesuffix(".py")
            out[name] = []
        elif ln.startswith("Epoch"):
            out[name].append([float(v.split(": ")[1]) for v in ln.split(", ")])
    return out


@pytest.fixture(scope="module")
def runs():
    """{1: ..., 4: ...}: each script's epoch lines at 1 and at 4 ranks (one job each)."""
    if not CORA.exists():
        pytest.skip("no Cora")
    scripts = [ROOT / "examples" / "pyg" / f"{name}.py" for name in SCRIPTS]
    out = {}
    for np_ in (1, 4):
        r = mpirun(np_, sys.executable, "-c", ALL, *scripts, EPOCHS, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out[np_] = epochs_of(r.stdout)
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(SCRIPTS))  # arma: ARMAConv's own F.dropout on rows
def test_a_pyg_example_loses_the_same_at_1_and_4_ranks(runs, name):
    one, four = runs[1][name], runs[4][name]
    assert [ln[0] for ln in one] == [ln[0] for ln in four] == list(range(1, EPOCHS + 1))
    for a, b in zip(one, four, strict=True):
        assert b[1] == pytest.approx(a[1], abs=1e-5), (name, a, b)  # the loss
        assert b[2:] == a[2:], (name, a, b)  # train, best val, its test accuracy


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_pyg_twin_differs_in_the_marked_lines_only(tmp_path, name):
    script = ROOT / "examples" / "pyg" / f"{name}.py"
    out = tmp_path / f"{name}.py"
    assert twin(script, out) == SCRIPTS[name]
    ours, theirs = script.read_text().splitlines(), out.read_text().splitlines()
    assert len(ours) == len(theirs)
    changed = [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b]
    assert len(changed) == SCRIPTS[name] == sum("# PyG: " in a for a in ours)
    for a, b in changed:
        assert "mgg" in a and a.endswith(
            b.replace("from pyg_npz import", "from torch_geometric.datasets import")
        )
        assert b.startswith(("import torch_geometric", "from torch_geometric", "from pyg_npz"))
    # the twin's code (after its docstring) imports nothing of mgg
    assert "mgg" not in out.read_text().split('"""', 2)[2]

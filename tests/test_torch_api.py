"""Nothing in mgg/ or bench/gpu/ uses a torch API that the GPU machine's torch (2.11) lacks:
the scan of bench/gpu/torch_api.py against the manifest recorded from the 2.11 wheel
(bench/gpu/torch_2_11_api.json), on a CPU, since the CUDA-only code never runs here."""

import json
import sys
import zipfile

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import torch_api  # noqa: E402

MANIFEST = json.loads(torch_api.MANIFEST.read_text())


@pytest.fixture(scope="module")
def used():
    """The scan of mgg/ and bench/gpu/ (a few seconds: once for the module)."""
    return torch_api.scan()


def _scan_text(tmp_path, text):
    f = tmp_path / "planted.py"
    f.write_text(text)
    return torch_api.scan(roots=[f.name], base=tmp_path)


def test_every_torch_use_is_in_the_recorded_torch(used):
    paths, names = used
    report = torch_api.check(MANIFEST, paths, names)
    assert not report.missing, f"torch {MANIFEST['torch']} lacks:\n" + "\n".join(report.missing)
    assert not report.uncovered, (
        "used since the manifest was recorded:\n  "
        + "\n  ".join(report.uncovered)
        + f"\nre-record it:\n  {MANIFEST['rerecord']}"
    )
    assert MANIFEST["torch"].startswith("2.11.")
    assert MANIFEST["source"]["wheel"] == torch_api.WHEEL
    # the manifest is what record writes: sorted, one entry a line
    assert torch_api.dumps(MANIFEST) == torch_api.MANIFEST.read_text()


def test_a_keyword_the_recorded_torch_refuses_is_caught(used):
    """The streamed bf16 backward's torch.mm(..., out_dtype=) against a torch whose mm
    takes no out_dtype (as before 2.11's overload)."""
    old = json.loads(json.dumps(MANIFEST))
    old["paths"]["torch.mm"]["keywords"].remove("out_dtype")
    paths, names = used
    missing = torch_api.check(old, paths, names).missing
    assert any(m.startswith("torch.mm(out_dtype=)") and "mgg/torch/inputs.py" in m for m in missing)


def test_a_keyword_newer_than_2_11_is_caught(tmp_path):
    """torch.cuda.graph's check_input_liveness= (in the dev pin, not in 2.11's wheel)."""
    paths, names = _scan_text(
        tmp_path,
        "import torch\nwith torch.cuda.graph(g, stream=s, check_input_liveness=True):\n"
        "    y = torch.mm(a, b, out_dtype=torch.float32)\n",
    )
    missing = torch_api.check(MANIFEST, paths, names).missing
    assert [m.split(":")[0] for m in missing] == ["torch.cuda.graph(check_input_liveness=)"]


PLANTED = """
import torch

def step(a, b):
    torch.cuda.synchronize()
    torch.cuda.not_a_thing()
    y = torch.mm(a, b, out_dtype=torch.float32)
    return y.pin_memory().to("cuda", non_blocking=True)
"""

# a torch as a wheel holds it, reduced to what PLANTED needs: mm without out_dtype, no
# torch.cuda.not_a_thing, a Tensor without pin_memory
FAKE = {
    "torch/version.py": "__version__ = '2.0.0+fake'\n",
    "torch/__init__.py": (
        "from torch._C import *\nfrom torch._C._VariableFunctions import *\n"
        "from torch._tensor import Tensor\n"
    ),
    "torch/_tensor.py": "import torch\n\nclass Tensor(torch._C.TensorBase):\n    pass\n",
    "torch/_C/__init__.pyi": (
        "class dtype: ...\nfloat32: dtype = ...\n\nclass TensorBase:\n"
        "    def to(self, device=None, dtype=None, non_blocking=False, copy=False): ...\n"
    ),
    "torch/_C/_VariableFunctions.pyi": (
        "def mm(input: Tensor, mat2: Tensor, *, out: Tensor | None = None) -> Tensor: ...\n"
    ),
    "torch/cuda/__init__.py": "def synchronize(device=None):\n    pass\n",
}


def test_record_from_a_wheel_then_check_catches_planted_violations(tmp_path):
    wheel = tmp_path / "torch-2.0.0-fake.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in FAKE.items():
            z.writestr(name, text)
    paths, names = _scan_text(tmp_path, PLANTED)
    assert paths["torch.mm"].keywords == {"out_dtype"}
    manifest = torch_api.record(torch_api.Files(wheel=wheel), {"wheel": wheel.name}, paths, names)
    assert manifest["torch"] == "2.0.0+fake"
    assert manifest["paths"]["torch.cuda.not_a_thing"]["exists"] is False
    assert manifest["paths"]["torch.mm"] == {
        "exists": True,
        "keywords": ["input", "mat2", "out"],
        "kind": "function",
    }
    report = torch_api.check(manifest, paths, names)
    got = sorted(m.split(":")[0] for m in report.missing)
    assert got == [
        "torch.Tensor.pin_memory",  # the dev torch's Tensor has it, the recorded one not
        "torch.cuda.not_a_thing",
        "torch.mm(out_dtype=)",
    ], report.missing
    assert all("planted.py:" in m for m in report.missing)
    assert not report.uncovered
    # its keywords pass: to(non_blocking=) is in both
    assert "torch.Tensor.to" in manifest["methods"]


def test_a_use_the_manifest_predates_asks_for_a_new_recording(tmp_path, capsys):
    paths, names = _scan_text(tmp_path, "import torch\ntorch.cuda.brand_new_call(x=1)\n")
    report = torch_api.check(MANIFEST, paths, names)
    assert [u.split()[0] for u in report.uncovered] == ["torch.cuda.brand_new_call"]
    assert torch_api.print_report(report, MANIFEST) == 2
    out = capsys.readouterr().out
    assert "NOT COVERED" in out and "record --wheel" in out


def test_the_static_reader_agrees_with_the_running_torch(used):
    """record --wheel reads the wheel's files without importing them: read the same way,
    the installed torch has what importing it has, with the same keywords."""
    reader = torch_api.installed_reader()
    if reader is None:
        pytest.skip("no torch installed")
    paths, _ = used
    disagree = []
    for p in sorted(paths):
        obj = reader.resolve(p)
        exists = None if obj == torch_api.UNKNOWN else obj is not None
        rt_exists, rt_kws = torch_api._runtime(p)
        if rt_exists is not None and exists != rt_exists:
            disagree.append(f"{p}: read {exists}, imported {rt_exists}")
        if paths[p].keywords and rt_kws not in (None, torch_api.ANY):
            kws = reader.keywords(obj)
            if kws != torch_api.ANY and not paths[p].keywords <= set(kws or ()):
                disagree.append(f"{p}: read {kws}, imported {rt_kws}")
    assert not disagree, "\n".join(disagree)

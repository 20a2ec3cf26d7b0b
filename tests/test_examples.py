"""Each script in examples/ runs as a user would run it (a subprocess), at a small size.

The NumPy and CuPy-skip tests run in the NumPy session. The PyTorch, JAX and CuPy-GPU
tests take the ``backend`` fixture for their own namespace, so they run in that
namespace's nox session and skip where it is not installed (or, for CuPy, without a GPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SPEC_SHAPES, gpu_usable, selected_backends

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``examples/<name>`` with this interpreter; its output, once it exited with 0."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _samples(out: str) -> list[str]:
    return re.findall(r"^sample +\d+: (.*)$", out, re.M)


def _only(backend_name: str) -> None:
    if backend_name not in selected_backends():
        pytest.skip(f"{backend_name} is not among MICROGPT_XP_BACKENDS")


def test_numpy_quickstart(tmp_path: Path) -> None:
    args = ["--steps", "30", "--batch-size", "8", "--samples", "3"]
    out = run_example("numpy_quickstart.py", *args, cwd=tmp_path)
    head = re.search(r"^(\d+) docs, vocab (\d+), (\d+) params$", out, re.M)
    assert head, out
    vocab, num_params = int(head[2]), int(head[3])
    # spec §4: 2·V·C + T·C + 12·C² weights for one layer of C = 16 channels, T = 16
    assert num_params == 2 * vocab * 16 + 16 * 16 + 12 * 16 * 16
    shapes = re.search(r"forward: tokens \((\d+), (\d+)\) -> logits \((\d+), (\d+), (\d+)\)", out)
    assert shapes, out
    b, t, b2, t2, v = map(int, shapes.groups())
    assert (b2, t2, v) == (b, t, vocab)
    assert len(re.findall(r"^step +\d+ / 30 \| loss \d+\.\d{4}$", out, re.M)) >= 2
    first, last = map(float, re.search(r"^loss (\S+) -> (\S+)$", out, re.M).groups())
    assert last < first  # 30 steps of Adam at lr 0.01 learn something
    names = _samples(out)
    assert len(names) == 3
    assert all(re.fullmatch(r"[a-z]{0,16}", n) for n in names), names


@pytest.mark.parametrize("backend", ["torch"], indirect=True)
def test_torch_interop(backend, tmp_path: Path) -> None:
    _only("torch")
    weights = tmp_path / "weights.json"
    args = ("--steps", "10", "--batch-size", "8", "--samples", "2", "--out", str(weights))
    out = run_example("torch_interop.py", *args, cwd=tmp_path)
    assert "trained 10 steps on torch" in out
    assert "params.wte is a torch.Tensor" in out
    assert "round trip exact: True" in out
    diff = float(re.search(r"max \|logits difference\| = (\S+)", out)[1])
    assert diff <= 1e-4  # float32 on two libraries
    assert len(_samples(out)) == 2
    # the exported file is the original's state dict: its keys, order and [n_out][n_in] shapes
    state = json.loads(weights.read_text())
    assert list(state) == list(SPEC_SHAPES)
    for key, (rows, cols) in SPEC_SHAPES.items():
        assert len(state[key]) == rows and {len(r) for r in state[key]} == {cols}, key
        assert all(isinstance(x, float) for r in state[key] for x in r), key


@pytest.mark.parametrize("backend", ["jax"], indirect=True)
def test_jax_forward(backend, tmp_path: Path) -> None:
    _only("jax")
    out = run_example("jax_forward.py", "--batch-size", "4", "--n-layer", "2", cwd=tmp_path)
    diffs = dict(re.findall(r"^  (\S+) +max relative difference (\S+)$", out, re.M))
    expected = {"logits", "loss"} | {f"d{key.split('.')[-1]}" for key in SPEC_SHAPES}
    assert set(diffs) == expected, out
    assert max(map(float, diffs.values())) <= 1e-12  # float64 on two libraries
    assert "agree:" in out


def test_cupy_example_here(tmp_path: Path) -> None:
    """On this machine: trains when CuPy has a GPU, else exits 0 with the skip message."""
    out = run_example("cupy_train.py", "--steps", "5", "--samples", "2", cwd=tmp_path)
    if gpu_usable("cupy"):
        assert "trained 5 steps on" in out
        assert len(_samples(out)) == 2
    else:
        assert out.startswith("skipped: no CUDA GPU"), out
        assert "sample" not in out


def test_cupy_example_skips_when_the_gpu_is_unavailable(tmp_path: Path) -> None:
    """A CuPy that is installed but finds no GPU (a stand-in module shadows the real one)."""
    fake = tmp_path / "fake"
    (fake / "cupy").mkdir(parents=True)
    (fake / "cupy" / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
    )
    path = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = run_example("cupy_train.py", cwd=tmp_path, env={"PYTHONPATH": path})
    assert out.strip() == "skipped: no CUDA GPU (cupy.cuda.is_available() is False)"


@pytest.mark.parametrize("backend", ["cupy"], indirect=True)
def test_cupy_train_on_gpu(backend, tmp_path: Path) -> None:
    _only("cupy")
    args = ["--steps", "20", "--batch-size", "32", "--samples", "3"]
    out = run_example("cupy_train.py", *args, cwd=tmp_path)
    assert "trained 20 steps on" in out
    first, last = map(float, re.search(r"^loss (\S+) -> (\S+)$", out, re.M).groups())
    assert last < first
    cupy_first, numpy_first = map(
        float, re.search(r"first loss: cupy (\S+) numpy (\S+)", out).groups()
    )
    assert abs(cupy_first - numpy_first) <= 1e-4
    assert len(_samples(out)) == 3


def test_the_readme_tour_runs_after_the_readme_install() -> None:
    """Every ``python`` block of README.md, run in order in one namespace, with nothing
    installed but the package (the lines that need an extra are comments there)."""
    readme = (ROOT / "README.md").read_text("utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert len(namespace["names"]) == 5  # type: ignore[arg-type]

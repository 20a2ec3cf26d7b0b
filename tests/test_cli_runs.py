"""The command as a practitioner runs it (issues 23 and 24): held-out loss and logs off a
terminal, signals, dead workers, diverged runs, prompts, ONNX export."""

from __future__ import annotations

import importlib.util
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from microgpt_xp import load, sample
from microgpt_xp.cli import _progress, main

NAMES = [
    "emma", "olivia", "ava", "isabella", "sophia", "mia", "charlotte", "amelia",
    "harper", "evelyn", "abigail", "emily", "ella", "elizabeth", "camila", "luna",
    "sofia", "avery", "mila", "aria", "scarlett", "penelope", "layla", "chloe",
]  # fmt: skip


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "names.txt"
    path.write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_held_out_loss_in_the_text_the_json_and_the_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path
) -> None:
    ckpt = tmp_path / "run.npz"
    argv = ["train", "--data", data, "--steps", 6, "--batch-size", 4, "--val-fraction", 0.25]
    rc, out, err = run(capsys, *argv, "--eval-every", 3, "--checkpoint", ckpt, "--json")
    assert rc == 0 and err == ""
    summary = json.loads(out)
    assert summary["num_docs"] == 18 and summary["num_val_docs"] == 6
    assert [step for step, _ in summary["val_losses"]] == [3, 6]
    assert len(summary["losses"]) == 6 and summary["final_loss"] == summary["losses"][-1]
    assert summary["final_val_loss"] == summary["val_losses"][-1][1]
    history = load(ckpt).meta["history"]
    assert history["losses"] == summary["losses"] and history["val_losses"] == summary["val_losses"]
    # resuming keeps the split: the same command with more steps extends the run
    rc, out, _ = run(capsys, *argv, "--eval-every", 3, "--checkpoint", ckpt, "--resume", "--steps", 9)
    assert rc == 0 and "held-out loss" in out.splitlines()[1]
    assert "(+6 held out)" in out.splitlines()[0]


def test_progress_lines_off_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, data: Path
) -> None:
    monkeypatch.setattr(_progress, "LINE_SECONDS", 0.0)
    argv = ["train", "--data", data, "--steps", 200, "--batch-size", 4, "--num-samples", 0]
    rc, out, err = run(capsys, *argv, "--val-data", data, "--eval-every", 100)
    assert rc == 0 and out.startswith("train: ")
    lines = err.splitlines()
    assert lines and all(line.startswith("train: step ") for line in lines)
    assert "train: step 2/200 | loss " in lines[0]  # every 200 // 100 steps
    assert lines[-1].startswith("train: step 200/200 | loss ") and "| val " in lines[-1]


def test_sample_with_a_prompt_and_top_k(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path
) -> None:
    ckpt = tmp_path / "run.npz"
    assert run(capsys, "train", "--data", data, "--steps", 20, "--batch-size", 4, "--checkpoint", ckpt)[0] == 0
    rc, out, err = run(capsys, "sample", "--checkpoint", ckpt, "--prompt", "em", "--top-k", 3, "--json")
    assert rc == 0 and err == ""
    saved = load(ckpt)
    names = json.loads(out)["samples"]
    assert names == sample(saved.params, saved.tokenizer, 20, prompt="em", top_k=3)
    assert all(name.startswith("em") for name in names)
    rc, _, err = run(capsys, "sample", "--checkpoint", ckpt, "--prompt", "é")
    assert rc == 1 and err.count("\n") == 1 and "'é'" in err


def test_a_diverged_run_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path
) -> None:
    argv = ["train", "--data", data, "--steps", 50, "--batch-size", 4, "--lr", 1e30]
    rc, out, err = run(capsys, *argv, "--checkpoint", tmp_path / "x.npz")
    assert rc == 1 and "done:" not in out
    assert err.count("\n") == 1 and "training stopped" in err and "RuntimeWarning" not in err
    assert "no checkpoint of this run was written" in err


def test_a_dead_worker_is_one_line_with_the_resume_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data: Path
) -> None:
    from microgpt_xp.runners import processes

    calls = {"n": 0}
    original = processes.WorkerPool.map

    def dies_at_the_third_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise processes.WorkerDied("a microgpt_xp worker process died during the step")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(processes.WorkerPool, "map", dies_at_the_third_step)
    ckpt = tmp_path / "run.npz"
    argv = ["train", "--data", data, "--steps", 6, "--batch-size", 4, "--workers", 2]
    argv += ["--checkpoint", ckpt, "--checkpoint-every", 1]
    rc, _, err = run(capsys, *argv)
    assert rc == 1 and err.count("\n") == 1
    assert "worker process died" in err and "after step 2" in err
    assert err.rstrip().endswith(shlex.join(["microgpt-xp", *map(str, argv), "--resume"]))
    assert load(ckpt).step == 2


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "microgpt_xp", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_training_as_ctrl_c_does(
    tmp_path: Path, data: Path, signum: int
) -> None:
    ckpt = tmp_path / "run.npz"
    argv = ["train", "--data", str(data), "--steps", "1000000", "--batch-size", "4"]
    argv += ["--checkpoint", str(ckpt), "--checkpoint-every", "1"]
    child = _start(argv)
    try:
        deadline = time.monotonic() + 60
        while not ckpt.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 128 + signum, err
    assert err.count("\n") == 1 and "interrupted after step" in err
    assert err.rstrip().endswith(shlex.join(["microgpt-xp", *argv, "--resume"]))
    assert load(ckpt).step >= 1


def test_sigterm_during_sample_out_leaves_no_partial_file(tmp_path: Path, data: Path) -> None:
    ckpt = tmp_path / "run.npz"
    assert main(["train", "--data", str(data), "--steps", "2", "--batch-size", "4",
                 "--checkpoint", str(ckpt), "--num-samples", "0"]) == 0  # fmt: skip
    out = tmp_path / "names.out"
    child = _start(["sample", "--checkpoint", str(ckpt), "--num-samples", "100000000",
                    "--batch-size", "2000", "--out", str(out)])  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(tmp_path.glob(".names.out.*.tmp")):
            time.sleep(0.05)
        time.sleep(0.3)  # a few batches written to the temporary file
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, err
    assert not out.exists() and not list(tmp_path.glob(".names.out.*"))


@pytest.mark.needs_torch
def test_a_cuda_device_on_a_torch_without_cuda_is_one_line(
    capsys: pytest.CaptureFixture[str], data: Path
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    rc, _, err = run(capsys, "train", "--data", data, "--backend", "torch", "--device", "cuda")
    assert rc == 1 and err.count("\n") == 1 and "no usable CUDA" in err


def test_export_onnx_writes_a_graph_onnxruntime_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path
) -> None:
    for module in ("ndonnx", "onnx", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the [onnx] extra)")
    import numpy as np
    import onnxruntime as ort

    from microgpt_xp import forward

    ckpt = tmp_path / "run.npz"
    assert run(capsys, "train", "--data", data, "--steps", 3, "--batch-size", 4, "--checkpoint", ckpt)[0] == 0
    model = tmp_path / "model.onnx"
    rc, out, _ = run(capsys, "export", "--checkpoint", ckpt, "--format", "onnx", "--out", model)
    assert rc == 0 and str(model) in out
    saved = load(ckpt)
    tokens = np.array([[saved.tokenizer.bos, 0, 1, 2]], dtype=np.int64)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"tokens": tokens, "lengths": np.array([4], dtype=np.int64)})
    want = np.asarray(forward(saved.params, tokens))
    assert np.max(np.abs(logits - want)) <= 2e-5 * np.max(np.abs(want))

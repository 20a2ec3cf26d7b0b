"""The ``microgpt-xp`` command, run in-process through ``main([...])`` (and once as the
installed console script): every subcommand's output, its files, and one-line errors."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import reference

from microgpt_xp import Params, __version__, cluster
from microgpt_xp import _xp as cli_xp
from microgpt_xp.checkpoint import load
from microgpt_xp.cli import main
from microgpt_xp.data import Tokenizer, default_docs, encode_docs
from microgpt_xp.exact import INFERENCE_HEADER
from microgpt_xp.model import score
from microgpt_xp.params import state_dict_keys
from microgpt_xp.sample import sample
from microgpt_xp.scale import score_docs
from microgpt_xp.train import train

train_module = importlib.import_module("microgpt_xp.train")

NAMES = [
    "emma", "olivia", "ava", "isabella", "sophia", "mia", "charlotte", "amelia",
    "harper", "evelyn", "abigail", "emily", "ella", "elizabeth", "camila", "luna",
]  # fmt: skip
SAMPLE_LINE = re.compile(r"^sample +(\d+): (.*)$")
STEP_LINE = re.compile(r"^step +(\d+) / +(\d+) \| loss (\d+\.\d{4})$")
HAS_DISTRIBUTED = importlib.util.find_spec("distributed") is not None


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """``main(argv)`` with its exit status, stdout and stderr."""
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def samples_of(out: str) -> list[str]:
    """The names of the ``sample  i: name`` lines, checking that they are numbered 1, 2, …"""
    matches = [m for m in map(SAMPLE_LINE.match, out.splitlines()) if m]
    assert [int(m.group(1)) for m in matches] == list(range(1, len(matches) + 1))
    return [m.group(2) for m in matches]


def assert_one_error_line(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("microgpt-xp: error: "), err
    for fragment in fragments:
        assert fragment in err, err


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "names.txt"
    path.write_text("\n".join(NAMES) + "\n\n", encoding="utf-8")  # a blank line is skipped
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, data_file: Path) -> Path:
    """A checkpoint of 8 steps of batch 4 on ``data_file`` (seed 3)."""
    path = tmp_path_factory.mktemp("ckpt") / "model.npz"
    with contextlib.redirect_stdout(io.StringIO()):
        argv = ["train", "--data", data_file, "--steps", 8, "--batch-size", 4, "--seed", 3]
        assert main([str(a) for a in [*argv, "--checkpoint", path, "--num-samples", 0]]) == 0
    return path


# -- train ------------------------------------------------------------------------------------
def test_train_prints_summary_and_samples_and_saves_a_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path
) -> None:
    ckpt = tmp_path / "sub" / "model.npz"
    argv = ["train", "--data", data_file, "--steps", 5, "--batch-size", 4, "--seed", 7]
    rc, out, err = run(capsys, *argv, "--checkpoint", ckpt, "--temperature", 0.8)
    assert rc == 0 and err == ""  # stderr is not a terminal: no progress bar
    assert f"train: {len(NAMES)} docs" in out
    assert "done: 5 steps" in out
    names = samples_of(out)
    assert len(names) == 20
    assert set("".join(names)) <= set("".join(NAMES))
    saved = load(ckpt)
    assert saved.step == 5 and saved.adam is not None and saved.adam.t == 5
    assert saved.tokenizer == Tokenizer.from_docs(NAMES)
    # the printed names are those of the saved model at that seed and temperature
    assert names == sample(saved.params, saved.tokenizer, 20, temperature=0.8, seed=7)


def test_train_json_matches_the_library(
    capsys: pytest.CaptureFixture[str], data_file: Path
) -> None:
    argv = ["train", "--data", data_file, "--steps", 4, "--batch-size", 3, "--lr", 0.02]
    rc, out, _ = run(capsys, *argv, "--seed", 5, "--dtype", "float64", "--num-samples", 3, "--json")
    assert rc == 0
    summary = json.loads(out)
    expected = train(NAMES, steps=4, batch_size=3, lr=0.02, seed=5, dtype="float64")
    assert summary["final_loss"] == expected.losses[-1]
    assert summary["steps"] == 4 and summary["seconds"] >= 0
    assert summary["samples"] == sample(expected.params, expected.tokenizer, 3, seed=5)


def test_workers_option_reaches_training_and_sampling(
    capsys: pytest.CaptureFixture[str], data_file: Path, checkpoint: Path
) -> None:
    argv = ["train", "--data", data_file, "--steps", 3, "--batch-size", 4, "--workers", 2]
    rc, out, _ = run(capsys, *argv, "--dtype", "float64", "--num-samples", 2, "--json")
    assert rc == 0
    expected = train(NAMES, steps=3, batch_size=4, dtype="float64", workers=2)
    assert json.loads(out)["final_loss"] == expected.losses[-1]
    rc, out, _ = run(capsys, "sample", "--checkpoint", checkpoint, "--workers", 3, "--json")
    saved = load(checkpoint)
    assert json.loads(out)["samples"] == sample(saved.params, saved.tokenizer, 20, seed=0)


def fake_terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Replace ``sys.stderr`` by a buffer that says it is a terminal, so that tqdm draws
    its bar there (call it in the test body, after capsys has set its own stderr)."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_progress_bar_shows_the_loss_on_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, data_file: Path
) -> None:
    terminal = fake_terminal(monkeypatch)
    rc = main(["train", "--data", str(data_file), "--steps", "3", "--batch-size", "2"])
    assert rc == 0
    shown = terminal.getvalue()
    assert "train" in shown and "3/3" in shown and re.search(r"loss=\d+\.\d{4}", shown)


def test_plot_writes_a_png(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path
) -> None:
    plot = tmp_path / "loss.png"
    rc, out, _ = run(
        capsys, "train", "--data", data_file, "--steps", 3, "--batch-size", 2, "--plot", plot
    )
    assert rc == 0 and f"loss curve: {plot}" in out
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_without_matplotlib_fails_before_training(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    data_file: Path,
) -> None:
    for name in ("matplotlib", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: ImportError
    ckpt = tmp_path / "model.npz"
    argv = ["train", "--data", data_file, "--steps", 3, "--batch-size", 2, "--checkpoint", ckpt]
    rc, out, err = run(capsys, *argv, "--plot", tmp_path / "loss.png")
    assert rc == 1
    assert_one_error_line(err, "matplotlib")
    assert "done:" not in out and not ckpt.exists()


def test_resume_continues_an_interrupted_run(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    data_file: Path,
) -> None:
    common = ["train", "--data", data_file, "--steps", 6, "--batch-size", 4, "--num-samples", 2]
    rc, out, _ = run(capsys, *common, "--json")
    assert rc == 0
    uninterrupted = json.loads(out)

    original = train_module.train

    def interrupted(*args, callback, **kwargs):  # type: ignore[no-untyped-def]
        def stop_after_four(step: int, loss: float) -> None:
            callback(step, loss)
            if step == 4:
                raise KeyboardInterrupt

        return original(*args, callback=stop_after_four, **kwargs)

    ckpt = tmp_path / "run.npz"
    with monkeypatch.context() as m:
        m.setattr(train_module, "train", interrupted)
        rc, _, err = run(capsys, *common, "--checkpoint", ckpt, "--checkpoint-every", 3)
    assert rc == 130
    assert_one_error_line(err, "interrupted")
    assert load(ckpt).step == 3  # the last periodic save

    rc, out, _ = run(capsys, *common, "--checkpoint", ckpt, "--resume", "--json")
    assert rc == 0
    resumed = json.loads(out)
    assert resumed["steps"] == 6 and resumed["steps_run"] == 3
    assert resumed["final_loss"] == uninterrupted["final_loss"]
    assert resumed["samples"] == uninterrupted["samples"]
    assert load(ckpt).step == 6


# -- sample, eval, export ----------------------------------------------------------------------
def test_sample_from_a_checkpoint(capsys: pytest.CaptureFixture[str], checkpoint: Path) -> None:
    rc, out, err = run(
        capsys, "sample", "--checkpoint", checkpoint, "--num-samples", 7, "--seed", 2
    )
    assert rc == 0 and err == ""
    names = samples_of(out)
    saved = load(checkpoint)
    assert names == sample(saved.params, saved.tokenizer, 7, temperature=0.5, seed=2)

    argv = ["sample", "--checkpoint", checkpoint, "--num-samples", 7, "--seed", 2, "--json"]
    rc, out, _ = run(capsys, *argv, "--batch-size", 3)
    assert rc == 0
    result = json.loads(out)
    assert result["samples"] == names and result["step"] == 8


def test_eval_prints_the_mean_per_document_loss(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, data_file: Path
) -> None:
    saved = load(checkpoint)
    assert saved.tokenizer is not None
    tokens, lengths = encode_docs(saved.tokenizer, NAMES, saved.config.block_size)
    expected = float(np.mean(np.asarray(score(saved.params, tokens, lengths), dtype=np.float64)))

    rc, out, _ = run(capsys, "eval", "--checkpoint", checkpoint, "--data", data_file)
    assert rc == 0
    assert out == f"mean loss {expected:.4f} over {len(NAMES)} documents\n"
    rc, out, _ = run(
        capsys, "eval", "--checkpoint", checkpoint, "--data", data_file, "--chunk-size", 3, "--json"
    )
    assert rc == 0
    result = json.loads(out)
    assert result["num_docs"] == len(NAMES)
    np.testing.assert_allclose(result["mean_loss"], expected, rtol=1e-6)  # float32, other shapes


@pytest.mark.parametrize("chunk_size", [3, 1024])
def test_eval_on_numpy_gives_the_mean_of_score_docs(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, data_file: Path, chunk_size: int
) -> None:
    saved = load(checkpoint)
    assert saved.tokenizer is not None
    expected = score_docs(saved.params, saved.tokenizer, NAMES, chunk_size=chunk_size)
    argv = ["eval", "--checkpoint", checkpoint, "--data", data_file, "--json"]
    rc, out, err = run(capsys, *argv, "--chunk-size", chunk_size)
    assert rc == 0 and err == ""
    result = json.loads(out)
    assert result["mean_loss"] == expected.mean
    assert result["num_docs"] == expected.num_docs == len(NAMES)
    assert result["step"] == 8 and result["data"] == str(data_file)


def test_eval_progress_bar_counts_documents_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    checkpoint: Path,
    data_file: Path,
) -> None:
    terminal = fake_terminal(monkeypatch)
    argv = ["eval", "--checkpoint", str(checkpoint), "--data", str(data_file), "--chunk-size", "5"]
    assert main(argv) == 0
    shown = terminal.getvalue()
    assert "eval" in shown and f"{len(NAMES)}/{len(NAMES)}" in shown


def test_eval_defaults_to_the_embedded_corpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ckpt = tmp_path / "default.npz"
    rc, _, _ = run(capsys, "train", "--steps", 1, "--num-samples", 0, "--checkpoint", ckpt)
    assert rc == 0
    rc, out, _ = run(capsys, "eval", "--checkpoint", ckpt, "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["num_docs"] == len(default_docs())
    assert 0 < result["mean_loss"] < 10


def test_export_round_trips_through_params_from_state_dict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, checkpoint: Path
) -> None:
    out_file = tmp_path / "weights.json"
    rc, _, _ = run(capsys, "export", "--checkpoint", checkpoint, "--out", out_file)
    assert rc == 0
    state = json.loads(out_file.read_text())
    saved = load(checkpoint)
    assert list(state) == state_dict_keys(saved.config)
    restored = Params.from_state_dict(state, dtype="float32")
    assert restored.config == saved.config
    for key, value in saved.params.to_state_dict().items():
        assert np.array_equal(restored.to_state_dict()[key], value), key


# -- microgpt-exact ----------------------------------------------------------------------------
def test_exact_train_prints_the_originals_output_and_sample_replays_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_file: Path
) -> None:
    ckpt = tmp_path / "exact.npz"
    argv = ["train", "--microgpt-exact", "--data", data_file, "--newlines", "--checkpoint", ckpt]
    rc, out, err = run(capsys, *argv)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    vocab = len(set("".join(NAMES))) + 1
    c, t = 16, 16
    assert lines[:3] == [
        f"num docs: {len(NAMES)}",
        f"vocab size: {vocab}",
        f"num params: {2 * vocab * c + t * c + 12 * c * c}",
    ]
    steps = [STEP_LINE.match(line) for line in lines[3:1003]]
    assert all(steps)
    assert [(int(m.group(1)), int(m.group(2))) for m in steps if m] == [
        (s, 1000) for s in range(1, 1001)
    ]
    assert lines[1003:1005] == ["", INFERENCE_HEADER]
    trained_samples = lines[1005:]
    assert len(trained_samples) == 20 and samples_of(out) == [
        s.split(": ", 1)[1] for s in trained_samples
    ]

    rc, out, err = run(capsys, "sample", "--microgpt-exact", "--checkpoint", ckpt)
    assert rc == 0 and err == ""
    assert out.splitlines() == trained_samples


def test_exact_train_matches_the_reference_script(
    capsys: pytest.CaptureFixture[str], data_file: Path
) -> None:
    expected = reference.run_microgpt(NAMES, num_steps=4, num_samples=3, print_fn=lambda s: None)
    rc, out, _ = run(
        capsys, "train", "--microgpt-exact", "--data", data_file, "--steps", 4, "--num-samples", 3
    )
    assert rc == 0
    # step lines end in '\r' as in the original; the reference drops that and the blank line
    assert out.count("\r") == 4 and not re.search(r"loss \d+\.\d{4}\n", out)
    assert [line for line in re.split(r"[\r\n]", out) if line] == expected


def test_exact_train_without_data_notes_the_original_corpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run(
        capsys, "train", "--microgpt-exact", "--steps", 2, "--num-samples", 2, "--json"
    )
    assert rc == 0
    assert err.count("\n") == 1 and err.startswith("microgpt-xp: note: ") and "names.txt" in err
    summary = json.loads(out)
    assert summary["num_docs"] == len(default_docs())
    assert summary["steps"] == 2 and len(summary["samples"]) == 2


# -- errors -------------------------------------------------------------------------------------
@pytest.fixture
def bad_files(tmp_path: Path, checkpoint: Path) -> dict[str, Path]:
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"this is not a checkpoint")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, a=np.zeros(3))
    unknown_char = tmp_path / "unknown.txt"
    unknown_char.write_text("emma\nzoë\n", encoding="utf-8")
    not_utf8 = tmp_path / "latin1.txt"
    not_utf8.write_bytes("zoë\n".encode("latin-1"))
    return {
        "corrupt": corrupt,
        "truncated": truncated,
        "foreign": foreign,
        "unknown_char": unknown_char,
        "not_utf8": not_utf8,
        "missing": tmp_path / "missing.txt",
        "nodir": tmp_path / "no" / "such" / "dir" / "out.json",
    }


needs_distributed = pytest.mark.skipif(not HAS_DISTRIBUTED, reason="needs dask.distributed")


@pytest.mark.parametrize(
    ("argv", "status", "fragment"),
    [
        (["train", "--data", "{missing}"], 1, "cannot read data file"),
        (["train", "--data", "{not_utf8}"], 1, "not UTF-8"),
        (["train", "--backend", "nope"], 2, "invalid choice: 'nope'"),
        (["train", "--dtype", "float16"], 2, "invalid choice: 'float16'"),
        (["train", "--steps", "0"], 2, "--steps"),
        (["train", "--steps", "ten"], 2, "--steps"),
        (["train", "--batch-size", "0"], 2, "--batch-size"),
        (["train", "--lr", "-0.1"], 2, "--lr"),
        (["train", "--temperature", "0"], 2, "--temperature"),
        (["train", "--temperature", "nan"], 2, "--temperature"),
        (["train", "--data", "{data}", "--batch-size", "100"], 1, "fewer than the batch size"),
        (["train", "--resume"], 2, "--checkpoint"),
        (["train", "--checkpoint-every", "3"], 2, "--checkpoint"),
        (["train", "--newlines"], 2, "--microgpt-exact"),
        (["train", "--chunk-size", "2"], 2, "--backend dask"),
        (["train", "--workers", "0"], 2, "--workers"),
        (["train", "--workers", "2", "--backend", "torch"], 2, "--backend numpy"),
        (["train", "--microgpt-exact", "--workers", "2"], 2, "--workers"),
        (["sample", "--checkpoint", "{ckpt}", "--workers", "2", "--backend", "jax"], 2,
         "--backend numpy"),
        (["sample", "--checkpoint", "{ckpt}", "--workers", "2", "--microgpt-exact"], 2,
         "--workers"),
        (["eval", "--checkpoint", "{ckpt}", "--workers", "2"], 2, "unrecognized arguments"),
        (["train", "--microgpt-exact", "--batch-size", "4"], 2, "--batch-size"),
        (["train", "--scheduler", "tcp://127.0.0.1:8786"], 2, "--backend dask"),
        (["train", "--device", "gpu7"], 1, "gpu7"),
        (["train", "--plot", "{tmp}/loss.nope"], 1, "image format"),
        (["train", "--plot", "{tmp}/no/dir/loss.png"], 1, "does not exist"),
        (["train", "--data", "{data}", "--steps", "3", "--batch-size", "2", "--resume",
          "--checkpoint", "{corrupt}"], 1, "corrupt"),
        (["sample"], 2, "--checkpoint"),
        (["sample", "--checkpoint", "{missing}"], 1, "does not exist"),
        (["sample", "--checkpoint", "{corrupt}"], 1, "corrupt"),
        (["sample", "--checkpoint", "{truncated}"], 1, "checkpoint"),
        (["sample", "--checkpoint", "{foreign}"], 1, "not a microgpt-xp checkpoint"),
        (["sample", "--checkpoint", "{ckpt}", "--temperature", "-1"], 2, "--temperature"),
        (["sample", "--checkpoint", "{ckpt}", "--num-samples", "0"], 2, "--num-samples"),
        (["sample", "--checkpoint", "{ckpt}", "--backend", "nope"], 2, "invalid choice"),
        (["sample", "--microgpt-exact", "--checkpoint", "{ckpt}"], 1, "microgpt-exact"),
        (["eval", "--checkpoint", "{corrupt}"], 1, "corrupt"),
        (["eval", "--checkpoint", "{ckpt}", "--data", "{unknown_char}"], 1, "'ë'"),
        (["eval", "--checkpoint", "{ckpt}", "--data", "{missing}"], 1, "cannot read data file"),
        (["eval", "--checkpoint", "{ckpt}", "--chunk-size", "0"], 2, "--chunk-size"),
        (["export", "--checkpoint", "{ckpt}", "--out", "{nodir}"], 1, "No such file"),
        (["export", "--checkpoint", "{truncated}", "--out", "{tmp}/w.json"], 1, "checkpoint"),
        (["frobnicate"], 2, "invalid choice"),
        pytest.param(
            ["train", "--backend", "dask", "--scheduler", "no-port"], 1, "address",
            marks=needs_distributed,
        ),
        pytest.param(
            ["eval", "--checkpoint", "{ckpt}", "--backend", "dask", "--scheduler", "bogus://x:1"],
            1, "address", marks=needs_distributed,
        ),
    ],
)  # fmt: skip
def test_user_errors_print_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    bad_files: dict[str, Path],
    checkpoint: Path,
    data_file: Path,
    argv: list[str],
    status: int,
    fragment: str,
) -> None:
    paths = {**bad_files, "ckpt": checkpoint, "data": data_file, "tmp": tmp_path}
    rc, _, err = run(capsys, *(a.format(**paths) for a in argv))
    assert rc == status
    assert_one_error_line(err, fragment)


def test_a_device_the_backend_refuses_is_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.device("bogus") raises RuntimeError, not ValueError; stand in for it without
    # importing torch
    def refuse(backend: str, device: object = None) -> object:
        raise RuntimeError(
            f"Expected one of cpu, cuda device type at start of device string: {device}"
        )

    monkeypatch.setattr(cli_xp, "resolve_device", refuse)
    rc, _, err = run(capsys, "train", "--device", "bogus")
    assert rc == 1
    assert_one_error_line(err, "unknown device 'bogus' for backend 'numpy'")


# -- dask.distributed ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scheduler_address() -> Iterator[str]:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


@needs_distributed
def test_scheduler_runs_eval_and_train_on_the_cluster(
    capsys: pytest.CaptureFixture[str], scheduler_address: str, checkpoint: Path, data_file: Path
) -> None:
    import dask

    before = dask.config.get("scheduler", None)
    rc, out, _ = run(capsys, "eval", "--checkpoint", checkpoint, "--data", data_file, "--json")
    local = json.loads(out)["mean_loss"]
    argv = ["eval", "--checkpoint", checkpoint, "--data", data_file, "--backend", "dask"]
    rc, out, _ = run(capsys, *argv, "--chunk-size", 5, "--scheduler", scheduler_address, "--json")
    assert rc == 0
    np.testing.assert_allclose(json.loads(out)["mean_loss"], local, rtol=1e-6)

    argv = ["train", "--data", data_file, "--steps", 1, "--batch-size", 4, "--num-samples", 0]
    rc, out, _ = run(capsys, *argv, "--json")
    numpy_loss = json.loads(out)["final_loss"]
    rc, out, _ = run(capsys, *argv, "--backend", "dask", "--scheduler", scheduler_address, "--json")
    assert rc == 0
    np.testing.assert_allclose(json.loads(out)["final_loss"], numpy_loss, rtol=1e-6)
    assert dask.config.get("scheduler", None) == before


@needs_distributed
@pytest.mark.parametrize("command", ["eval", "train"])
def test_scheduler_that_does_not_answer_is_one_error_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    checkpoint: Path,
    data_file: Path,
    command: str,
) -> None:
    import dask

    before = dask.config.get("scheduler", None)
    # nothing listens on port 1; wait 1 s for it instead of connect's default 10 s
    monkeypatch.setattr(cluster, "connect", functools.partial(cluster.connect, timeout=1.0))
    argv = {
        "eval": ["eval", "--checkpoint", checkpoint, "--data", data_file],
        "train": ["train", "--data", data_file, "--steps", 1, "--batch-size", 4],
    }[command]
    rc, out, err = run(capsys, *argv, "--backend", "dask", "--scheduler", "tcp://127.0.0.1:1")
    assert rc == 1 and out == ""
    assert_one_error_line(err, "cannot reach the Dask scheduler at 'tcp://127.0.0.1:1' within 1 s")
    assert dask.config.get("scheduler", None) == before


# -- help and version -----------------------------------------------------------------------------
def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version") == (0, f"microgpt-xp {__version__}\n", "")
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for command in ("train", "sample", "eval", "export"):
        assert command in out
    assert "bench" not in out


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        ("train", ["--steps STEPS", "(default: 1000)", "(default: 32)", "(default: 0.01)",
                   "(default: float32)", "(default: 0.5)", "(default: 20)", "(default: numpy)"]),
        ("sample", ["(default: 20)", "(default: 0.5)", "(default: 0)", "(default: numpy)"]),
        ("eval", ["--chunk-size N", "(default: 1024)", "(default: numpy)"]),
        ("export", ["--out FILE"]),
    ],
)  # fmt: skip
def test_subcommand_help_shows_defaults(
    capsys: pytest.CaptureFixture[str], command: str, defaults: list[str]
) -> None:
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0
    flat = " ".join(out.split())
    assert flat.startswith(f"usage: microgpt-xp {command}")
    for text in defaults:
        assert text in flat


def test_installed_console_script() -> None:
    script = shutil.which("microgpt-xp", path=str(Path(sys.executable).parent)) or shutil.which(
        "microgpt-xp"
    )
    if script is None:
        pytest.skip("the microgpt-xp console script is not installed")
    version = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout == f"microgpt-xp {__version__}\n"
    usage = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and "usage: microgpt-xp" in usage.stdout
    bad = subprocess.run(
        [script, "train", "--steps", "0"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1


def test_python_dash_m_runs_the_same_program() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "microgpt_xp.cli", "train", "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert_one_error_line(result.stderr, "--steps")


def test_help_imports_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from microgpt_xp.cli import main\n"
        "assert main(['train', '--help']) == 0\n"
        "heavy = ['tqdm', 'dask', 'distributed', 'torch', 'jax', 'matplotlib', 'mimesis']\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == ""

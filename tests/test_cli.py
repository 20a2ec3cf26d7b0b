"""The ``microgpt-xp`` command, in-process through ``main([...])`` (a child process where
signals, pipes or the console script are the point): outputs, files, one-line errors."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import itertools
import json
import logging
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference
from onnx_testing import session
from xp_testing import assert_params_equal, xp_assert_close

from microgpt_xp import AdamConfig, GPTConfig, Params, __version__, cluster, forward
from microgpt_xp import _xp as cli_xp
from microgpt_xp.checkpoint import load
from microgpt_xp.cli import _progress, main
from microgpt_xp.cli.train import resume_command
from microgpt_xp.data import Tokenizer, default_docs, encode_docs
from microgpt_xp.exact import INFERENCE_HEADER
from microgpt_xp.model import score
from microgpt_xp.params import state_dict_keys
from microgpt_xp.sample import sample
from microgpt_xp.scoring import score_docs
from microgpt_xp.train import train

train_module = importlib.import_module("microgpt_xp.train")
sample_module = importlib.import_module("microgpt_xp.sample")

MP = pytest.MonkeyPatch
NAMES = [
    "emma", "olivia", "ava", "isabella", "sophia", "mia", "charlotte", "amelia",
    "harper", "evelyn", "abigail", "emily", "ella", "elizabeth", "camila", "luna",
]  # fmt: skip
MORE_NAMES = ["sofia", "avery", "mila", "aria", "scarlett", "penelope", "layla", "chloe"]
LONGEST = max(map(len, NAMES)) + 1  # the block size that reads every name whole
FIT = max(16, LONGEST)  # the block size train gives NAMES by default
SAMPLE_LINE = re.compile(r"^sample +(\d+): (.*)$")
STEP_LINE = re.compile(r"^step +(\d+) / +(\d+) \| loss \d+\.\d{4}$")
VERSE = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
)
needs_distributed = pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None, reason="needs dask.distributed"
)


@dataclass
class Cli:
    """``main(argv)`` in-process: ``cli(*argv)`` is its exit status, stdout and stderr."""

    capsys: pytest.CaptureFixture[str]

    def __call__(self, *argv: object) -> tuple[int, str, str]:
        rc = main([str(a) for a in argv])
        return (rc, *self.capsys.readouterr())

    def ok(self, *argv: object) -> str:
        """The stdout of a command that succeeds with nothing on stderr."""
        rc, out, err = self(*argv)
        assert rc == 0 and err == "", err
        return out

    def json(self, *argv: object) -> Any:
        return json.loads(self.ok(*argv, "--json"))

    def interrupted(self, stop: int, *argv: object) -> tuple[int, str, str]:
        """``self(*argv)`` with Ctrl-C (KeyboardInterrupt) in step ``stop + 1``."""
        with pytest.MonkeyPatch.context() as m:
            on_call(m, train_module._Loop, "step", KeyboardInterrupt(), at=stop + 1)
            return self(*argv)

    def fails(self, argv: list[Any], status: int, *fragments: str) -> str:
        """The stderr of a command exiting ``status``: one error line holding ``fragments``."""
        rc, out, err = self(*argv)
        assert rc == status and out == "", err
        assert_one_error_line(err, *fragments)
        return err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


def assert_one_error_line(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("microgpt-xp: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def samples_of(out: str) -> list[str]:
    """The names of the ``sample  i: name`` lines, numbered 1, 2, …"""
    matches = [m for m in map(SAMPLE_LINE.match, out.splitlines()) if m]
    assert [int(m.group(1)) for m in matches] == list(range(1, len(matches) + 1))
    return [m.group(2) for m in matches]


def train_cmd(data: object, steps: int, *more: object, batch: int = 4) -> list[object]:
    return ["train", "--data", data, "--steps", steps, "--batch-size", batch, *more]


def library_samples(ckpt: Path, n: int, **kwargs: Any) -> list[str]:
    saved = load(ckpt)
    return sample(saved.params, saved.tokenizer, n, **kwargs)


def make_checkpoint(path: Path, *argv: object) -> Path:
    """``path``, written by the command ``argv`` (output dropped)."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(a) for a in [*argv, "--checkpoint", path, "--num-samples", 0]]) == 0
    return path


def on_call(monkeypatch: MP, owner: object, name: str, hook: Any, at: int = 0) -> None:
    """Before the n-th call (1, 2, …) of ``owner.name``: ``hook(n)``, or raise ``hook`` (an
    exception) where n is ``at``."""
    original, calls = getattr(owner, name), itertools.count(1)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        n = next(calls)
        if isinstance(hook, BaseException) and n == at:
            raise hook
        if callable(hook):
            hook(n)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def start(module: str, *argv: object, **popen: Any) -> subprocess.Popen[str]:
    """``python -m module argv`` (``-c`` for code), piped; SIGINT at its default (not ignored
    as in a background job's children)."""
    how = ["-c" if "\n" in module else "-m", module, *map(str, argv)]
    pipe = subprocess.PIPE
    popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return subprocess.Popen([sys.executable, *how], stdout=pipe, stderr=pipe, **popen)


def signal_when(
    ready: Callable[[], object], child: subprocess.Popen[str], signum: int, delay: float = 0.3
) -> tuple[str, str]:
    """Send ``signum`` ``delay`` s after ``ready()`` (polled, 60 s at most); stdout, stderr."""
    try:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        time.sleep(delay)
        child.send_signal(signum)
        return child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait(timeout=30)


def written(factory: pytest.TempPathFactory, name: str, text: str) -> Path:
    path = factory.mktemp("data") / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def names16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written(tmp_path_factory, "names.txt", "\n".join(NAMES) + "\n\n")  # blank: skipped


@pytest.fixture(scope="module")
def names24(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written(tmp_path_factory, "names.txt", "\n".join([*NAMES, *MORE_NAMES]) + "\n")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written(tmp_path_factory, "verse.txt", VERSE * 4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, names16: Path) -> Path:
    """A checkpoint of 8 steps of batch 4 on ``names16`` (seed 3)."""
    path = tmp_path_factory.mktemp("ckpt") / "model.npz"
    return make_checkpoint(path, *train_cmd(names16, 8, "--seed", 3))


# -- train ------------------------------------------------------------------------------------
def test_train_prints_samples_and_saves(cli: Cli, tmp_path: Path, names16: Path) -> None:
    ckpt, plot = tmp_path / "sub" / "model.npz", tmp_path / "loss.png"
    argv = train_cmd(names16, 5, "--seed", 7, "--checkpoint", ckpt, "--temperature", 0.8)
    out = cli.ok(*argv, "--plot", plot)  # stderr is not a terminal: no progress bar
    assert f"train: {len(NAMES)} docs" in out and "done: 5 steps" in out
    assert f"loss curve: {plot}" in out and plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    names = samples_of(out)
    assert len(names) == 20 and set("".join(names)) <= set("".join(NAMES))
    saved = load(ckpt)
    assert saved.step == 5 and saved.adam is not None and saved.adam.t == 5
    assert saved.tokenizer == Tokenizer.from_docs(NAMES)
    # the printed names are those of the saved model at that seed and temperature
    assert names == library_samples(ckpt, 20, temperature=0.8, seed=7)


@pytest.mark.parametrize("workers", [None, 2])
def test_train_json_matches_the_library(cli: Cli, names16: Path, workers: int | None) -> None:
    argv = train_cmd(names16, 4, "--lr", 0.02, "--seed", 5, "--dtype", "float64")
    argv += ["--num-samples", 3, *([] if workers is None else ["--workers", workers])]
    summary = cli.json(*argv)
    config = GPTConfig(Tokenizer.from_docs(NAMES).vocab_size, block_size=FIT)
    common = dict(steps=4, batch_size=4, lr=0.02, seed=5, dtype="float64", config=config)
    expected = train(NAMES, workers=workers, **common)  # type: ignore[arg-type]
    assert summary["final_loss"] == expected.losses[-1]
    assert summary["config"] == config.to_dict()
    assert summary["steps"] == 4 and summary["seconds"] >= 0
    assert summary["samples"] == sample(expected.params, expected.tokenizer, 3, seed=5)


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["train", "--data", "{data}", "--steps", "3", "--batch-size", "2"],
         ["train", "3/3", r"loss=\d+\.\d{4}"]),  # the step and the loss
        (["eval", "--checkpoint", "{ckpt}", "--data", "{data}", "--chunk-size", "5"],
         ["eval", f"{len(NAMES)}/{len(NAMES)}"]),  # the documents
    ],
)  # fmt: skip
def test_progress_bar_on_a_terminal(
    monkeypatch: MP, checkpoint: Path, names16: Path, argv: list[str], shown: list[str]
) -> None:
    class Terminal(io.StringIO):  # where tqdm draws its bar
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert main([a.format(data=names16, ckpt=checkpoint) for a in argv]) == 0
    bar = sys.stderr.getvalue()  # type: ignore[attr-defined]
    assert all(re.search(pattern, bar) for pattern in shown), bar


def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_resume(
    cli: Cli, tmp_path: Path, names16: Path
) -> None:
    common = train_cmd(names16, 6, "--num-samples", 2)
    uninterrupted = cli.json(*common)
    ckpt = tmp_path / "run.npz"
    argv = [*common, "--checkpoint", ckpt, "--checkpoint-every", 3]
    rc, _, err = cli.interrupted(4, *argv)
    assert rc == 130
    saved = f"last checkpoint is {ckpt} (step 4)"
    assert_one_error_line(err, "interrupted after step 4; its state was saved: ", saved)
    assert load(ckpt).step == 4  # saved at the interrupt, after the periodic save of step 3
    command = err.split("continue the run with: ", 1)[1].strip()
    assert command == shlex.join(["microgpt-xp", *map(str, argv), "--resume"])
    resumed = cli.json(*shlex.split(command)[1:])  # the command, as printed
    assert resumed["steps"] == 6 and resumed["steps_run"] == 2
    assert resumed["final_loss"] == uninterrupted["final_loss"]
    assert resumed["samples"] == uninterrupted["samples"]
    assert load(ckpt).step == 6

    # before any save; then --overwrite of an older run (not this run's: not resumed)
    rc, out, err = cli.interrupted(2, *common)
    assert rc == 130 and "done:" not in out
    assert_one_error_line(err, "interrupted after step 2; nothing was saved", "--checkpoint PATH")
    argv = [*common, "--checkpoint", ckpt, "--overwrite", "--checkpoint-every", 5]
    rc, _, err = cli.interrupted(0, *argv)  # before a step is complete: nothing to save
    assert rc == 130
    assert_one_error_line(err, "no checkpoint of this run was saved yet", "every 5 steps")
    again = err.split("start again with: ", 1)[1].strip()
    assert again == shlex.join(["microgpt-xp", *map(str, argv)])


def test_resume_command_replaces_overwrite() -> None:
    got = resume_command(["train", "--steps", "5", "--overwrite"])
    assert got == "microgpt-xp train --steps 5 --resume"
    got = resume_command(["train", "--over", "--res", "--data", "my file.txt"])
    assert got == "microgpt-xp train --res --data 'my file.txt'"


@pytest.mark.parametrize(
    ("signum", "module", "data"),
    [
        (signal.SIGINT, "microgpt_xp.cli", "--data {names} --checkpoint-every 1"),
        (signal.SIGTERM, "microgpt_xp", "--data {names} --checkpoint-every 1"),
        (signal.SIGHUP, "microgpt_xp", "--data {names} --checkpoint-every 1"),
        (signal.SIGTERM, "microgpt_xp", "--text {text} --block-size 8"),  # saved only at the stop
    ],
)
def test_a_signal_stops_training_with_the_resume_command(
    tmp_path: Path, names16: Path, text_file: Path, signum: int, module: str, data: str
) -> None:
    """A real SIGINT (Ctrl-C), SIGTERM or SIGHUP: saved at that step, with the resume command."""
    ckpt = tmp_path / "run.npz"
    argv = ["train", *data.format(names=names16, text=text_file).split(), "--steps", "1000000"]
    argv += ["--batch-size", "2", "--checkpoint", str(ckpt), "--num-samples", "0"]
    child = start(module, *argv, text=True)

    def header() -> bool:  # printed after the first step
        return bool(select.select([child.stdout], [], [], 0)[0])

    out, err = signal_when(header, child, signum)
    assert out.startswith("train: ") and child.returncode == 128 + signum, err
    match = re.search(r"interrupted after step (\d+);", err)
    assert match, err
    step = int(match.group(1))
    assert_one_error_line(err, f"its state was saved: the last checkpoint is {ckpt} (step {step})")
    assert err.rstrip().endswith(shlex.join(["microgpt-xp", *argv, "--resume"]))
    saved = load(ckpt)
    assert saved.step == step >= 1 and len(saved.meta["history"]["losses"]) == step


# -- the model's shape and the block size -------------------------------------------------
def test_shape_options_reach_sample_eval_export(cli: Cli, tmp_path: Path, names16: Path) -> None:
    ckpt, weights = tmp_path / "big.npz", tmp_path / "w.json"
    shape = ["--n-layer", 2, "--n-embd", 8, "--n-head", 2, "--block-size", 12]
    out = cli.ok(*train_cmd(names16, 3, *shape, "--checkpoint", ckpt, "--num-samples", 0))
    config = GPTConfig(Tokenizer.from_docs(NAMES).vocab_size, 2, 8, 2, 12)
    assert out.splitlines()[0] == (
        f"train: {len(NAMES)} docs | vocab {config.vocab_size} | {config.num_params} params "
        "(n_layer 2, n_embd 8, n_head 2, block_size 12) | numpy float32 | batch 4 | 3 steps"
    )
    saved = load(ckpt)
    assert saved.config == config and saved.tokenizer is not None
    got = cli.json("sample", "--checkpoint", ckpt, "--num-samples", 9)["samples"]
    assert got == sample(saved.params, saved.tokenizer, 9)
    scored = cli.json("eval", "--checkpoint", ckpt, "--data", names16)
    assert scored["mean_loss"] == score_docs(saved.params, saved.tokenizer, NAMES).mean
    cli.ok("export", "--checkpoint", ckpt, "--out", weights)
    state = json.loads(weights.read_text())
    assert list(state) == [*state_dict_keys(config), "tokenizer"] and "layer1.mlp_fc2" in state
    assert state["tokenizer"] == {"chars": "".join(saved.tokenizer.chars)}
    assert np.array(state["wpe"]).shape == (12, 8)


def test_export_round_trips_via_from_state_dict(cli: Cli, tmp_path: Path, checkpoint: Path) -> None:
    cli.ok("export", "--checkpoint", checkpoint, "--out", tmp_path / "weights.json")
    state = json.loads((tmp_path / "weights.json").read_text())
    saved = load(checkpoint)
    assert list(state) == [*state_dict_keys(saved.config), "tokenizer"]
    assert Tokenizer.from_dict(state["tokenizer"]) == saved.tokenizer  # ids back to text
    assert_params_equal(Params.from_state_dict(state, dtype="float32"), saved.params)


def test_the_embedded_corpus_keeps_the_originals_output(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "default.npz"
    lines = cli.ok("train", "--steps", 2, "--num-samples", 0, "--checkpoint", ckpt).splitlines()
    assert load(ckpt).config == GPTConfig(27)  # the spec's model, block size 16
    assert lines[0] == (
        f"train: {len(default_docs())} docs | vocab 27 | 4192 params | numpy float32 | "
        "batch 32 | 2 steps"
    )
    done = r"done: 2 steps in \d+\.\d s \([\d.e+-]+ ms/step, [\d,]+ tokens/s\) \| final loss \d+\.\d{4}"
    assert re.fullmatch(done, lines[1]) and lines[2:] == [f"checkpoint: {ckpt} (step 2)"]
    result = cli.json("eval", "--checkpoint", ckpt)  # eval scores the embedded corpus too
    assert result["num_docs"] == len(default_docs()) and 0 < result["mean_loss"] < 10
    # and --microgpt-exact, with a note that names.txt is the original's corpus
    rc, out, err = cli("train", "--microgpt-exact", "--steps", 2, "--num-samples", 2, "--json")
    assert rc == 0
    assert err.count("\n") == 1 and err.startswith("microgpt-xp: note: ") and "names.txt" in err
    summary = json.loads(out)
    assert summary["num_docs"] == len(default_docs())
    assert summary["steps"] == 2 and len(summary["samples"]) == 2


def test_the_block_size_reads_every_name_or_says_how_many_it_cuts(
    cli: Cli, tmp_path: Path, names16: Path
) -> None:
    long_names = tmp_path / "long.txt"
    long_names.write_text("\n".join([*NAMES, "maximiliana-josephina-antonia"]), encoding="utf-8")
    ckpt = tmp_path / "long.npz"
    out = cli.ok(*train_cmd(long_names, 2, "--checkpoint", ckpt))  # nothing cut: no note
    assert load(ckpt).config.block_size == 30 and "block_size 30)" in out  # 29 characters + 1
    cut = sum(len(name) >= 5 for name in NAMES)  # more than 4 characters
    ckpt = tmp_path / "short.npz"
    rc, out, err = cli(*train_cmd(names16, 2, "--block-size", 5, "--checkpoint", ckpt))
    assert rc == 0 and out.startswith("train: ")
    assert err == (
        f"microgpt-xp: note: {cut} of {len(NAMES)} documents are longer than --block-size 5 "
        "reads whole (4 characters): training sees only their first 5 characters, never "
        f"their end (--block-size {LONGEST} fits the longest)\n"
    )
    rc, out, err = cli("eval", "--checkpoint", ckpt, "--data", names16)  # for its block size
    assert rc == 0 and out.startswith("mean loss")
    assert err.count("\n") == 1 and f"note: {cut} of {len(NAMES)} documents" in err
    assert "first 5 characters" in err


# -- existing checkpoints: --overwrite, --resume, extending a run -----------------------------
def test_existing_file_needs_resume_or_overwrite(cli: Cli, tmp_path: Path, names16: Path) -> None:
    ckpt = tmp_path / "run.npz"
    argv = ["train", "--data", names16, "--num-samples", 0, "--checkpoint", ckpt]
    cli.ok(*argv, "--steps", 3, "--batch-size", 4)
    before = ckpt.read_bytes()
    for extra, how in [(["--batch-size", 4], ["--resume"]), (["--microgpt-exact"], [])]:
        exists = f"checkpoint '{ckpt}' exists"
        cli.fails([*argv, "--steps", 2, *extra], 1, exists, "--overwrite", *how)
        assert ckpt.read_bytes() == before
    assert cli(*argv, "--steps", 2, "--batch-size", 4, "--overwrite")[0] == 0
    assert load(ckpt).step == 2
    assert cli(*argv, "--microgpt-exact", "--steps", 1, "--overwrite")[0] == 0
    assert load(ckpt).step == 1
    cli.fails([*argv, "--steps", 2, "--overwrite", "--resume"], 2, "--resume", "--overwrite")


def test_resume_with_more_steps_extends_a_run(cli: Cli, tmp_path: Path, names16: Path) -> None:
    ckpt = tmp_path / "run.npz"
    argv = ["train", "--data", names16, "--batch-size", 4, "--checkpoint", ckpt]
    cli.ok(*argv, "--steps", 6, "--num-samples", 0)
    rc, out, err = cli(*argv, "--steps", 6, "--resume", "--num-samples", 0)
    assert rc == 0 and "done: 0 steps (resumed at step 6)" in out
    assert err == (
        f"microgpt-xp: note: the run in '{ckpt}' has taken all its 6 steps; a larger --steps "
        "extends it\n"
    )
    extended = cli.json(*argv, "--steps", 10, "--resume")
    assert extended["steps"] == 10 and extended["steps_run"] == 4
    # the library's extension: the learning rate decays as in a run of 10 steps from step 6
    config = GPTConfig(Tokenizer.from_docs(NAMES).vocab_size, block_size=FIT)
    common = dict(batch_size=4, config=config, checkpoint=tmp_path / "library.npz")
    train(NAMES, steps=6, **common)  # type: ignore[arg-type]
    expected = train(NAMES, steps=10, resume=True, **common)  # type: ignore[arg-type]
    assert extended["final_loss"] == expected.losses[-1]
    assert extended["samples"] == sample(expected.params, expected.tokenizer, 20)
    saved = load(ckpt)
    assert saved.step == 10 and saved.adam is not None and saved.adam.num_steps == 10


@pytest.mark.parametrize(
    ("given", "change", "fragment"),
    [
        ("", "--seed 4", "with --seed 4: its run has --seed 0"),
        ("", "--batch-size 3", "with --batch-size 3: its run has --batch-size 4"),
        ("", "--lr 0.02", "with --lr 0.02: its run has --lr 0.01"),
        ("", "--dtype float64", "with --dtype float64: its run has --dtype float32"),
        ("", "--steps 5", "with --steps 5: its run has --steps 6"),
        ("", "--data {other}", "with --data {other}: its run trained on another corpus"),
        ("", "--data {alphabet}", "with --data {alphabet}: its run trained on a corpus of other characters"),
        ("", "--n-layer 2", "with --n-layer 2: its run has --n-layer 1"),
        ("", "--block-size 12", f"with --block-size 12: its run has --block-size {FIT}"),
        ("--beta2 0.95", "--beta2 0.9", "with --beta2 0.9: its run has --beta2 0.95"),
        ("--val-fraction 0.25", "--val-fraction 0.5",
         "with --data {data} --val-fraction 0.5: its run trained on another corpus or split"),
    ],
)  # fmt: skip
def test_resume_errors_name_the_option_and_both_values(
    cli: Cli, tmp_path: Path, names16: Path, given: str, change: str, fragment: str
) -> None:
    files = {"other": tmp_path / "other.txt", "alphabet": tmp_path / "alphabet.txt"}
    files["other"].write_text("\n".join(reversed(NAMES)), encoding="utf-8")  # same characters
    files["alphabet"].write_text("\n".join(["xyz", "zyx", "qqq", "abc", "ee"]), encoding="utf-8")
    files["data"] = names16
    ckpt = tmp_path / "run.npz"
    argv = train_cmd(names16, 6, "--checkpoint", ckpt, "--num-samples", 0, "--checkpoint-every", 3)
    argv = [str(a) for a in [*argv, *given.split()]]
    assert cli.interrupted(3, *argv)[0] == 130  # an unfinished run, saved at step 3
    if given.startswith("--beta2"):
        assert load(ckpt).adam.config.beta2 == 0.95  # type: ignore[union-attr]
    options = [*argv, *change.format(**files).split(), "--resume"]  # the last value counts
    cli.fails(options, 1, f"cannot resume '{ckpt}'", fragment.format(**files))
    assert load(ckpt).step == 3
    cli.ok(*argv, "--resume")  # the same options go on


# -- sample, eval, export ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "n", "kwargs"),
    [
        ("--num-samples 7 --batch-size 3 --seed 2", 7, {"seed": 2}),
        ("--num-samples 1 --batch-size 10 --temperature 0.9", 1, {"temperature": 0.9}),
        ("--num-samples 6 --batch-size 2 --temperature 0.9", 6, {"temperature": 0.9}),
        ("--workers 3", 20, {}),
        ("--prompt em --top-k 3", 20, {"prompt": "em", "top_k": 3}),
    ],
)
def test_sample_prints_the_librarys_names_and_streams_them_as_json(
    cli: Cli, checkpoint: Path, options: str, n: int, kwargs: dict[str, Any]
) -> None:
    names = library_samples(checkpoint, n, **kwargs)
    assert all(name.startswith(kwargs.get("prompt", "")) for name in names)
    argv = ["sample", "--checkpoint", checkpoint, *options.split()]
    assert samples_of(cli.ok(*argv)) == names
    head = {"checkpoint": str(checkpoint), "step": 8, "temperature": 0.5, "top_k": None}
    expected = {**head, "prompt": None, "seed": 0, "microgpt_exact": False} | kwargs
    assert cli.ok(*argv, "--json") == json.dumps({**expected, "samples": names}, indent=2) + "\n"


@pytest.mark.parametrize("chunk_size", [None, 3, 1024])
def test_eval_mean_loss(cli: Cli, checkpoint: Path, names16: Path, chunk_size: int | None) -> None:
    saved = load(checkpoint)
    assert saved.tokenizer is not None
    tokens, lengths = encode_docs(saved.tokenizer, NAMES, saved.config.block_size)
    expected = float(np.mean(np.asarray(score(saved.params, tokens, lengths), dtype=np.float64)))
    argv = ["eval", "--checkpoint", checkpoint, "--data", names16]
    argv += [] if chunk_size is None else ["--chunk-size", chunk_size]
    out = cli.ok(*argv)
    scores = score_docs(saved.params, saved.tokenizer, NAMES)
    if chunk_size is None:
        per_token = f"({scores.token_mean:.4f} per token)"
        assert out == f"mean loss {expected:.4f} over {len(NAMES)} documents {per_token}\n"
    result = cli.json(*argv)
    np.testing.assert_allclose(result["mean_loss"], expected, rtol=1e-6)  # float32, other shapes
    np.testing.assert_allclose(result["token_loss"], scores.token_mean, rtol=1e-6)
    assert result["num_docs"] == len(NAMES) and result["mode"] == "docs"
    assert result["step"] == 8 and result["data"] == str(names16)
    if chunk_size is not None:  # the mean of score_docs, exactly
        scores = score_docs(saved.params, saved.tokenizer, NAMES, chunk_size=chunk_size)
        assert result["mean_loss"] == scores.mean and scores.num_docs == len(NAMES)
        assert result["token_loss"] == scores.token_mean


def test_export_onnx_runs_in_onnxruntime(cli: Cli, tmp_path: Path, checkpoint: Path) -> None:
    for module in ("ndonnx", "onnx", "onnxruntime"):
        pytest.importorskip(module, reason=f"{module} is not installed (the [onnx] extra)")
    model = tmp_path / "model.onnx"
    out = cli.ok("export", "--checkpoint", checkpoint, "--format", "onnx", "--out", model)
    assert str(model) in out
    saved = load(checkpoint)
    tokens = np.array([[saved.tokenizer.bos, 0, 1, 2]], dtype=np.int64)
    feed = {"tokens": tokens, "lengths": np.array([4], dtype=np.int64)}
    (logits,) = session(model).run(None, feed)
    xp_assert_close(logits, np.asarray(forward(saved.params, tokens)), rtol=2e-5)


# -- sample: streaming, files, pipes -------------------------------------------------------------
def test_sample_streams_each_batch_as_it_is_made(monkeypatch: MP, checkpoint: Path) -> None:
    events: list[str] = []

    class RecordingStdout(io.StringIO):
        def write(self, text: str) -> int:
            events.append("write")
            return super().write(text)

    on_call(monkeypatch, sample_module, "decode_batch", lambda n: events.append("batch"))
    monkeypatch.setattr(sys, "stdout", RecordingStdout())
    argv = ["sample", "--checkpoint", str(checkpoint), "--num-samples", "7", "--seed", "2"]
    assert main([*argv, "--batch-size", "3"]) == 0
    # three batches (3 + 3 + 1), each printed before the next one is made
    runs = [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]
    assert runs == ["batch", "write"] * 3  # the names: test_sample_prints_the_librarys_names


def test_sample_out_is_atomic(cli: Cli, monkeypatch: MP, tmp_path: Path, checkpoint: Path) -> None:
    names = library_samples(checkpoint, 11, seed=4)
    out_file = tmp_path / "names.txt"
    argv = ["sample", "--checkpoint", checkpoint, "--num-samples", 11, "--seed", 4]
    out = cli.ok(*argv, "--batch-size", 4, "--out", out_file)
    assert out == f"wrote 11 names to {out_file}\n"
    assert out_file.read_text(encoding="utf-8") == "".join(f"{n}\n" for n in names)
    result = cli.json(*argv, "--out", out_file)
    assert result["num_samples"] == 11 and result["out"] == str(out_file)
    # Ctrl-C after the first batch: the file keeps its old content, no temporary is left
    on_call(monkeypatch, sample_module, "decode_batch", KeyboardInterrupt(), at=2)
    out_file.write_text("old\n", encoding="utf-8")
    cli.fails([*argv, "--batch-size", 4, "--out", out_file], 130, "interrupted")
    assert out_file.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["names.txt"]


def test_sigterm_during_sample_out_leaves_no_partial_file(tmp_path: Path, checkpoint: Path) -> None:
    out = tmp_path / "names.out"
    argv = ["--checkpoint", checkpoint, "--num-samples", 10**8, "--batch-size", 2000, "--out", out]
    child = start("microgpt_xp", "sample", *argv, text=True)
    _, err = signal_when(lambda: list(tmp_path.glob(".names.out.*.tmp")), child, signal.SIGTERM)
    assert child.returncode == 143, err
    assert not out.exists() and not list(tmp_path.glob(".names.out.*"))


@pytest.mark.parametrize(
    "argv", ["sample --num-samples 100000 --batch-size 1000", "export --out -"]
)
def test_a_pipe_closed_early_is_no_error(tmp_path: Path, names16: Path, argv: str) -> None:
    """``sample | head``, ``export --out - | head`` (1.5 MB of JSON): read 100 bytes, close."""
    ckpt = make_checkpoint(tmp_path / "wide.npz", *train_cmd(names16, 1, "--n-embd", 64))
    child = start("microgpt_xp.cli", *argv.split(), "--checkpoint", ckpt)
    assert child.stdout is not None and child.stderr is not None
    head = child.stdout.read(100)
    child.stdout.close()  # what `head` does once it has its lines
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0  # the reader has what it wanted: a success
    assert head and err == ""


def test_a_closed_stdout_at_start_is_an_error(checkpoint: Path) -> None:
    """``microgpt-xp sample >&-``: the names would be lost, so the command fails."""
    command = [sys.executable, "-m", "microgpt_xp.cli", "sample", "--checkpoint", str(checkpoint)]
    closed = subprocess.run(
        command, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=120
    )
    assert closed.returncode == 1
    assert_one_error_line(closed.stderr, "stdout is closed")


# -- microgpt-exact ----------------------------------------------------------------------------
def test_exact_prints_the_originals_output(cli: Cli, tmp_path: Path, names16: Path) -> None:
    ckpt = tmp_path / "exact.npz"
    out = cli.ok("train", "--microgpt-exact", "--data", names16, "--newlines", "--checkpoint", ckpt)
    lines = out.splitlines()
    vocab, c, t = len(set("".join(NAMES))) + 1, 16, 16
    params = 2 * vocab * c + t * c + 12 * c * c
    assert lines[:3] == [f"num docs: {len(NAMES)}", f"vocab size: {vocab}", f"num params: {params}"]
    steps = [STEP_LINE.match(line) for line in lines[3:1003]]
    assert [m and m.groups() for m in steps] == [(str(s), "1000") for s in range(1, 1001)]
    assert lines[1003:1005] == ["", INFERENCE_HEADER]
    trained_samples = lines[1005:]
    assert len(trained_samples) == 20
    assert samples_of(out) == [s.split(": ", 1)[1] for s in trained_samples]
    out = cli.ok("sample", "--microgpt-exact", "--checkpoint", ckpt)
    assert out.splitlines() == trained_samples


@pytest.mark.parametrize("shape", [{}, {"block_size": 6, "n_embd": 8, "n_head": 2}])
def test_exact_matches_the_reference_script(cli: Cli, names16: Path, shape: dict[str, int]) -> None:
    expected = reference.run_microgpt(
        NAMES, num_steps=3, num_samples=2, print_fn=lambda s: None, **shape
    )
    options = [x for key, value in shape.items() for x in (f"--{key.replace('_', '-')}", value)]
    argv = ["train", "--microgpt-exact", "--data", names16, "--steps", 3, "--num-samples", 2]
    rc, out, err = cli(*argv, *options)
    assert rc == 0
    # step lines end in '\r' as in the original; the reference drops that and the blank line
    assert out.count("\r") == 3 and not re.search(r"loss \d+\.\d{4}\n", out)
    assert [line for line in re.split(r"[\r\n]", out) if line] == expected
    cut = sum(len(name) >= shape.get("block_size", 16) for name in NAMES)
    assert err.count("\n") == (cut > 0)
    assert not cut or f"note: {cut} of {len(NAMES)} documents" in err


# -- errors -------------------------------------------------------------------------------------
@pytest.fixture
def paths(tmp_path: Path, checkpoint: Path, names16: Path) -> dict[str, Path]:
    """Good and bad files, by the names the tables below give them in braces."""
    made = {"ckpt": checkpoint, "data": names16, "tmp": tmp_path}
    made |= {"missing": tmp_path / "missing.txt", "nodir": tmp_path / "no/such/dir/out.json"}
    for name, content in [
        ("corrupt.npz", b"this is not a checkpoint"),
        ("truncated.npz", checkpoint.read_bytes()[: checkpoint.stat().st_size // 2]),
        ("unknown_char.txt", "emma\nzoë\n".encode()),
        ("not_utf8.txt", "zoë\n".encode("latin-1")),
    ]:
        made[name.split(".")[0]] = tmp_path / name
        made[name.split(".")[0]].write_bytes(content)
    np.savez(tmp_path / "foreign.npz", a=np.zeros(3))
    return made | {"foreign": tmp_path / "foreign.npz"}


USAGE_ERRORS = [  # exit status 2: the command line itself is wrong
    ("train --backend nope", "invalid choice: 'nope'"), ("train --dtype float16", "invalid choice: 'float16'"),
    ("train --steps 0", "--steps"), ("train --steps ten", "--steps"), ("train --lr -0.1", "--lr"),
    ("train --batch-size 0", "--batch-size"), ("train --microgpt-exact --batch-size 4", "--batch-size"),
    ("train --temperature 0", "--temperature"), ("train --temperature nan", "--temperature"),
    ("train --resume", "--checkpoint"), ("train --checkpoint-every 3", "--checkpoint"),
    ("train --overwrite", "--overwrite needs --checkpoint"), ("train --newlines", "--microgpt-exact"),
    ("train --workers 0", "--workers"), ("train --workers 100000", "--workers: workers must be at most"),
    (f"train --n-embd {10**20}", f"--n-embd {10**20}: a model of"),
    (f"train --n-layer {10**11}", "--n-layer 100000000000: a model of"),
    (f"train --block-size {10**13}", "--block-size 10000000000000: a model of"),
    (f"replay --n-embd {10**20}", "GiB (weights, gradients"),
    ("train --data {data} --batch-size 4 --n-embd 10", "--n-embd 10 is not a multiple of --n-head 4"),
    ("train --data {data} --batch-size 4 --n-head 3", "--n-embd 16 is not a multiple of --n-head 3"),
    ("train --data {data} --batch-size 4 --n-embd 12 --n-head 5", "--n-embd 12 is not a multiple of --n-head 5"),
    ("train --data {data} --microgpt-exact --n-head 3", "--n-embd 16 is not a multiple of --n-head 3"),
    ("train --data {data} --batch-size 4 --n-layer 0", "--n-layer"),
    ("train --data {data} --batch-size 4 --n-embd -4", "--n-embd"),
    ("train --data {data} --batch-size 4 --block-size 0", "--block-size"),
    ("train --data {data} --batch-size 4 --block-size two", "--block-size"),
    ("train --eval-every 5", "--eval-every needs --val-data or --val-fraction"),
    ("train --eval-tokens 64", "--eval-tokens needs --val-data"),
    ("train --eval-tokens 0", "argument --eval-tokens: expected an integer >= 1"),
    ("train --decay bogus", "argument --decay: invalid choice: 'bogus'"),
    ("train --text {data} --data {data}", "argument --data: not allowed with argument --text"),
    ("train --grad-clip -1", "argument --grad-clip: expected a finite number >= 0"),
    ("train --weight-decay inf", "argument --weight-decay"),
    ("train --min-lr x", "argument --min-lr"),
    ("train --warmup -1", "argument --warmup"),
    ("train --init-std 0", "argument --init-std: expected a finite number > 0"),
    ("train --beta1 1", "argument --beta1: expected a finite number >= 0 and < 1"),
    ("train --beta2 -0.5", "argument --beta2"),
    ("train --length 64", "--length needs --text"),
    ("train --text {data} --checkpoint {data} --overwrite", "is --text"),
    ("train --threads 0", "--threads"), ("sample --checkpoint {ckpt} --threads many", "--threads"),
    ("train --microgpt-exact --workers 2", "--workers"),
    ("sample --checkpoint {ckpt} --workers 2 --microgpt-exact", "--workers"),
    ("eval --checkpoint {ckpt} --workers 2", "unrecognized arguments"),
    ("train --scheduler tcp://127.0.0.1:8786", "--backend dask"),
    ("train --jit", "backend 'numpy' has no compiler"), ("sample --checkpoint {ckpt} --jit", "--no-jit"),
    ("eval --checkpoint {ckpt} --backend torch --jit", "'torch' has no"),
    ("sample", "--checkpoint"), ("frobnicate", "invalid choice"),
    ("sample --checkpoint {ckpt} --temperature -1", "--temperature"),
    ("sample --checkpoint {ckpt} --num-samples 0", "--num-samples"),
    ("sample --checkpoint {ckpt} --length 10", "on documents (names): leave --length out"),
    ("sample --checkpoint {ckpt} --backend nope", "invalid choice"),
    ("eval --checkpoint {ckpt} --chunk-size 0", "--chunk-size"),
    ("export --checkpoint {ckpt} --out {tmp}/w.json --graph decode", "--graph applies only with --format onnx"),
    ("export --checkpoint {ckpt} --out {ckpt}", "would replace the model"),
    ("sample --checkpoint {ckpt} --out {ckpt}", "would replace the model"),
    ("train --data {data} --checkpoint {data} --overwrite", "would replace its corpus"),
    ("replay --data {data} --checkpoint {data} --overwrite", "would replace its corpus"),
    ("train --microgpt-exact --data {data} --checkpoint {data} --overwrite", "would replace its corpus"),
]  # fmt: skip
RUN_ERRORS = [  # exit status 1: the command line is fine, what it names is not
    ("train --data {missing}", "cannot read data file"), ("train --data {not_utf8}", "not UTF-8"),
    ("train --data {data} --batch-size 100", f"--batch-size: the corpus has {len(NAMES)} documents"),
    ("train --chunk-size 2", "--chunk-size is the rows of a Dask task"),
    ("train --data {data} --batch-size 4 --min-lr 0.1", "--min-lr must lie in [0, lr], got 0.1"),
    ("train --data {data} --batch-size 4 --warmup 10 --steps 5", "--warmup must be less than num_steps=5"),
    ("train --text {data} --block-size 1000", "--text: the text has"),
    ("train --text {missing}", "cannot read data file"), ("train --text {not_utf8}", "not UTF-8"),
    ("train --text {tmp}", "it is not a regular file"),
    ("train --text {data} --val-data {missing}", "cannot read data file"),
    ("train --seed -1", "--seed must be a non-negative int, got -1"),
    ("train --val-fraction 1.5", "--val-fraction"), ("train --val-data {missing}", "cannot read data file"),
    ("train --device gpu7", "gpu7"), ("train --plot {tmp}/loss.nope", "image format"),
    ("train --plot {tmp}/no/dir/loss.png", "does not exist"),
    ("train --data {data} --steps 3 --batch-size 2 --resume --checkpoint {corrupt}", "corrupt"),
    ("sample --checkpoint {missing}", "does not exist"), ("sample --checkpoint {corrupt}", "corrupt"),
    ("sample --checkpoint {truncated}", "checkpoint"),
    ("sample --checkpoint {foreign}", "not a microgpt-xp checkpoint"),
    ("sample --checkpoint {ckpt} --prompt é", "'é'"),
    ("sample --microgpt-exact --checkpoint {ckpt}", "microgpt-exact"),
    ("sample --checkpoint {ckpt} --out {nodir}", "does not exist"),
    ("eval --checkpoint {corrupt}", "corrupt"), ("eval --checkpoint {ckpt} --data {unknown_char}", "'ë'"),
    ("eval --checkpoint {ckpt} --data {missing}", "cannot read data file"),
    ("export --checkpoint {ckpt} --out {nodir}", "does not exist"),
    ("export --checkpoint {truncated} --out {tmp}/w.json", "checkpoint"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status", "fragment"),
    [(argv, 2, fragment) for argv, fragment in USAGE_ERRORS]
    + [(argv, 1, fragment) for argv, fragment in RUN_ERRORS],
)
def test_user_errors_are_one_line_before_any_output(
    cli: Cli, paths: dict[str, Path], argv: str, status: int, fragment: str
) -> None:
    cli.fails(argv.format(**paths).split(), status, fragment)


def fault(monkeypatch: MP, what: str) -> None:
    """An extra not installed (None in sys.modules), no dask.distributed, or no memory."""
    if what == "memory":
        error = MemoryError("Unable to allocate 95.4 GiB for an array with shape (10000000, 16)")
        on_call(monkeypatch, sample_module, "decode_batch", error, at=1)
    elif what == "distributed":
        find_spec = importlib.util.find_spec

        def hide(name: str, *args: Any) -> Any:
            return None if name == "distributed" else find_spec(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", hide)
    else:
        plot = ["matplotlib", "matplotlib.backends", "matplotlib.backends.backend_agg"]
        for name in {"torch": ["torch", "array_api_compat.torch"], "matplotlib": plot}[what]:
            monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("what", "argv", "fragments"),
    [
        ("matplotlib", "train --data {data} --steps 3 --batch-size 2 --checkpoint {tmp}/x.npz "
                       "--plot {tmp}/loss.png",
         ["matplotlib", "pip install 'microgpt-xp[plot]'", "from a checkout: pip install '.[plot]'"]),
        # the backends table's install line: the CPU build of torch
        ("torch", "train --backend torch", [cli_xp.entry("torch").install,
                                            "download.pytorch.org/whl/cpu"]),
        ("distributed", "train --backend dask --scheduler local",
         ["--scheduler needs dask.distributed", cli_xp.entry("dask").install, "from a checkout"]),
        ("memory", "sample --checkpoint {ckpt} --num-samples 10000000",
         ["out of memory (Unable to allocate 95.4 GiB", "--batch-size"]),
    ],
)  # fmt: skip
def test_a_missing_extra_or_memory_is_one_line_saying_what_to_do(
    cli: Cli, monkeypatch: MP, paths: dict[str, Path], what: str, argv: str, fragments: list[str]
) -> None:
    fault(monkeypatch, what)
    cli_xp._table_namespace.cache_clear()
    try:
        cli.fails(argv.format(**paths).split(), 1, *fragments)
    finally:
        cli_xp._table_namespace.cache_clear()
    assert not (paths["tmp"] / "x.npz").exists()  # failed before training


@pytest.mark.parametrize(
    "command", ["train", "sample --checkpoint {ckpt}", "eval --checkpoint {ckpt}"]
)
@pytest.mark.parametrize("device", [None, "cuda:3", "bogus"])
def test_a_device_the_backend_refuses_is_one_error_line(
    cli: Cli, monkeypatch: MP, checkpoint: Path, command: str, device: str | None
) -> None:
    # what torch.device("bogus") and cupy.cuda.Device() without a GPU raise: a RuntimeError
    def refuse(backend: str, device: object = None) -> object:
        raise RuntimeError(
            f"Expected one of cpu, cuda device type at start of device string: {device}"
            if device == "bogus"
            else "cudaErrorNoDevice: no CUDA-capable device is detected"
        )

    monkeypatch.setattr(cli_xp, "resolve_device", refuse)
    where = [] if device is None else ["--device", device]
    argv = [*command.format(ckpt=checkpoint).split(), *where]
    if device == "bogus":
        cli.fails([*argv, "--backend", "numpy"], 1, "unknown device 'bogus' for backend 'numpy'")
    else:
        which = "a GPU" if device is None else f"the GPU '{device}'"
        needs = "backend 'cupy' needs an NVIDIA GPU with CUDA"
        err = cli.fails([*argv, "--backend", "cupy"], 1, needs, which, "numpy")
        assert "unknown device" not in err


@pytest.mark.needs_torch
def test_a_cuda_device_on_a_torch_without_cuda_is_one_line(cli: Cli, names16: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    rc, _, err = cli("train", "--data", names16, "--backend", "torch", "--device", "cuda")
    assert rc == 1 and err.count("\n") == 1 and "no usable CUDA" in err


def test_a_diverged_run_is_one_line_and_exit_1(cli: Cli, tmp_path: Path, names24: Path) -> None:
    rc, out, err = cli(*train_cmd(names24, 50, "--lr", 1e30, "--checkpoint", tmp_path / "x.npz"))
    assert rc == 1 and "done:" not in out
    assert err.count("\n") == 1 and "training stopped" in err and "RuntimeWarning" not in err
    assert "no checkpoint of this run was written" in err


def test_dead_worker_says_resume(cli: Cli, monkeypatch: MP, tmp_path: Path, names24: Path) -> None:
    from microgpt_xp.runners import processes

    died = processes.WorkerDied("a microgpt_xp worker process died during the step")
    on_call(monkeypatch, processes.WorkerPool, "map", died, at=3)  # in the third step
    ckpt = tmp_path / "run.npz"
    argv = train_cmd(names24, 6, "--workers", 2, "--checkpoint", ckpt, "--checkpoint-every", 1)
    rc, _, err = cli(*argv)
    assert rc == 1 and err.count("\n") == 1
    assert "worker process died" in err and "after step 2" in err
    assert err.rstrip().endswith(shlex.join(["microgpt-xp", *map(str, argv), "--resume"]))
    assert load(ckpt).step == 2


@pytest.mark.parametrize("threads", ["auto", "1", "1000000", "18446744073709551616"])
def test_threads_are_auto_or_capped_at_the_cores(cli: Cli, checkpoint: Path, threads: str) -> None:
    from microgpt_xp.resources import usable_cpus

    argv = ["sample", "--checkpoint", checkpoint, "--num-samples", 3, "--json"]
    rc, out, err = cli(*argv, "--threads", threads)
    assert rc == 0 and len(json.loads(out)["samples"]) == 3
    cpus = usable_cpus()
    note = f"note: --threads {threads}: this process may use {cpus} cores; using {cpus}\n"
    assert err == (f"microgpt-xp: {note}" if threads.isdigit() and int(threads) > cpus else "")


@pytest.mark.parametrize(
    ("param", "message", "line"),
    [
        ("seed", "seed must be a non-negative int, got -1", "--seed must be a non-negative int, got -1"),
        ("batch_size", "batch size must be positive", "--batch-size must be positive"),
        ("docs", "the corpus is\nempty", "--data: the corpus is empty"),
        ("budget_bytes", "too small", "--memory-budget: too small"),
        ("runner", "runner must be a Runner", "runner must be a Runner"),  # no option: as is
        (None, "a plain ValueError", "a plain ValueError"),
    ],
)  # fmt: skip
def test_library_errors_name_their_cli_option(param: str | None, message: str, line: str) -> None:
    from microgpt_xp._errors import ArgumentValueError
    from microgpt_xp.cli._common import in_option_words

    error = ValueError(message) if param is None else ArgumentValueError(param, message)
    assert in_option_words(error) == line


# -- dask.distributed ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scheduler_address() -> Iterator[str]:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def same_dask_scheduler() -> Iterator[None]:
    """Dask's default scheduler is the same after the command."""
    import dask

    before = dask.config.get("scheduler", None)
    yield
    assert dask.config.get("scheduler", None) == before


@pytest.fixture
def quick_connect(monkeypatch: MP, same_dask_scheduler: None) -> None:
    """connect() waits 1 s for a scheduler (or for a lost one to come back), not 10 s."""
    monkeypatch.setattr(cluster, "connect", functools.partial(cluster.connect, timeout=1.0))


NO_ANSWER = "cannot reach the Dask scheduler at 'tcp://127.0.0.1:1' within 1 s"  # nothing there


@needs_distributed
def test_scheduler_runs_eval_and_train_on_the_cluster(
    cli: Cli, same_dask_scheduler: None, scheduler_address: str, checkpoint: Path, names16: Path
) -> None:
    on_it = ["--backend", "dask", "--scheduler", scheduler_address]
    argv = ["eval", "--checkpoint", checkpoint, "--data", names16]
    local = cli.json(*argv)["mean_loss"]
    result = cli.json(*argv, *on_it, "--chunk-size", 5)
    np.testing.assert_allclose(result["mean_loss"], local, rtol=1e-6)
    argv = train_cmd(names16, 1, "--num-samples", 0)
    numpy_loss = cli.json(*argv)["final_loss"]
    np.testing.assert_allclose(cli.json(*argv, *on_it)["final_loss"], numpy_loss, rtol=1e-6)


@needs_distributed
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ("eval --checkpoint {ckpt} --data {data} --scheduler tcp://127.0.0.1:1", NO_ANSWER),
        ("train --data {data} --steps 1 --batch-size 4 --scheduler tcp://127.0.0.1:1", NO_ANSWER),
        ("train --scheduler no-port", "address"),
        ("eval --checkpoint {ckpt} --scheduler bogus://x:1", "address"),
    ],
)
def test_a_scheduler_that_does_not_answer_is_one_line(
    cli: Cli, quick_connect: None, paths: dict[str, Path], argv: str, fragment: str
) -> None:
    cli.fails([*argv.format(**paths).split(), "--backend", "dask"], 1, fragment)


@needs_distributed
@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_scheduler_lost_mid_run_is_one_error_line(
    cli: Cli, monkeypatch: MP, quick_connect: None, checkpoint: Path, names16: Path, command: str
) -> None:
    import distributed

    from microgpt_xp.runners import DaskTasks

    lost = distributed.LocalCluster(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0"
    )
    if command == "train":  # the scheduler goes away after step 2
        on_call(monkeypatch, train_module._Loop, "step", lambda n: lost.close() if n == 3 else 0)
        argv = train_cmd(names16, 20)
    else:  # the scheduler goes away as the scoring is submitted
        on_call(monkeypatch, DaskTasks, "map", lambda n: lost.close())
        argv = ["eval", "--checkpoint", checkpoint, "--data", names16]
    # distributed logs its failed reconnection to its own stderr handler: no second line
    logged: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = logged.append  # type: ignore[method-assign]
    client_log = logging.getLogger("distributed.client")
    client_log.addHandler(handler)
    try:
        rc, out, err = cli(*argv, "--backend", "dask", "--scheduler", lost.scheduler_address)
    finally:
        client_log.removeHandler(handler)
        lost.close()
    assert rc == 1 and "done:" not in out and "mean loss" not in out
    assert_one_error_line(err, "lost the Dask scheduler at")
    if command == "train":  # where the run stopped, and how to go on
        assert "after step 2; nothing was saved" in err, err
    assert [r.getMessage() for r in logged] == []


_LOUD = """
import contextlib, logging, sys, warnings
from microgpt_xp.cli import _common, main
quiet = _common.quiet_dask
@contextlib.contextmanager
def loud(verbose=False):
    with quiet(verbose):
        warnings.warn('Sending large graph of size 20 MiB', UserWarning)
        logging.getLogger('distributed.client').warning('LOUD')
        yield
_common.quiet_dask = loud
sys.exit(main(sys.argv[1:]))
"""


@needs_distributed
@pytest.mark.parametrize(
    ("data", "status", "verbose"),
    [("data", 0, False), ("unknown_char", 1, False), ("data", 0, True)],
)
def test_dask_local_prints_only_the_commands_lines(
    paths: dict[str, Path], data: str, status: int, verbose: bool
) -> None:
    """--scheduler local: distributed's logs and warnings only with MICROGPT_XP_VERBOSE."""
    argv = ["eval", "--checkpoint", paths["ckpt"], "--data", paths[data], "--backend", "dask"]
    env = {**os.environ, "MICROGPT_XP_VERBOSE": "1" if verbose else "0"}
    command = [sys.executable, "-c", _LOUD, *map(str, argv), "--scheduler", "local"]
    command += ["--chunk-size", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == status, result.stderr
    if verbose:
        assert "LOUD" in result.stderr and "large graph" in result.stderr
    elif status:
        assert_one_error_line(result.stderr, "not in the tokenizer")
    else:
        assert all(line.startswith("microgpt-xp: ") for line in result.stderr.splitlines())
        assert "mean loss" in result.stdout


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """192,000 documents of NAMES: seconds of scoring, whatever the backend."""
    return written(tmp_path_factory, "big.txt", "\n".join(NAMES * 12000) + "\n")


@pytest.mark.parametrize("delay", [0.1, 0.3, 0.6])
def test_ctrl_c_during_start_up_is_one_line_and_130(
    checkpoint: Path, big_corpus: Path, delay: float
) -> None:
    """SIGINT while the command imports or starts eval (of a corpus longer than the delay)."""
    code = "import sys\nprint(flush=True)\nfrom microgpt_xp.cli import main\nsys.exit(main())\n"
    argv = ["eval", "--checkpoint", checkpoint, "--data", big_corpus, "--backend", "numpy"]
    child = start(code, *argv, text=True)

    def started() -> bool:  # Python runs the code
        return child.stdout is not None and child.stdout.readline() == "\n"

    out, err = signal_when(started, child, signal.SIGINT, delay)
    assert child.returncode == 130 and out == "", err
    assert_one_error_line(err, "interrupted")


# the command, printing a line once the Dask computation starts (eval prints nothing before)
_MARKED = (
    "import sys\nfrom microgpt_xp.cli import main\nfrom microgpt_xp.runners import DaskTasks\n"
    "compute = DaskTasks.map\n"
    "def marked(*args, **kwargs):\n"
    "    print('computing', flush=True)\n"
    "    return compute(*args, **kwargs)\n"
    "DaskTasks.map = marked\nsys.exit(main(sys.argv[1:]))\n"
)


def _big_dask_eval(checkpoint: Path, corpus: Path, scheduler: str) -> subprocess.Popen[str]:
    """``eval`` on ``scheduler`` in a session of its own, once it computes (within 120 s)."""
    argv = ["eval", "--checkpoint", checkpoint, "--data", corpus, "--backend", "dask"]
    argv += ["--scheduler", scheduler, "--chunk-size", "500"]
    child = start(_MARKED, *argv, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready and child.stdout.readline() == "computing\n", "it never started computing"
    except BaseException:
        _kill_session(child)
        raise
    time.sleep(0.2)  # submitting the graph, or computing it (a few seconds here)
    return child


def _kill_session(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)


@needs_distributed
def test_ctrl_c_under_dask_local_is_one_line(checkpoint: Path, big_corpus: Path) -> None:
    """Ctrl-C to the process group (as a terminal sends it): the workers stay quiet."""
    child = None
    try:
        child = _big_dask_eval(checkpoint, big_corpus, "local")
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=90)
    finally:
        if child is not None:
            _kill_session(child)
    assert child.returncode == 130 and out == "", err
    assert_one_error_line(err, "interrupted")


@needs_distributed
def test_a_killed_scheduler_is_one_line(tmp_path: Path, checkpoint: Path, big_corpus: Path) -> None:
    """kill -9 of a `dask scheduler` (with a worker) mid-eval: one line within seconds."""
    path = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_{}", "--host", "127.0.0.1"]
    where = ["--no-dashboard", "--scheduler-file", str(path)]
    null = subprocess.DEVNULL
    started: list[subprocess.Popen[str]] = []

    def spawn(role: str, *argv: str) -> subprocess.Popen[str]:
        command = [a.format(role) for a in [*dask, *argv, *where]]
        started.append(subprocess.Popen(command, stdout=null, stderr=null, start_new_session=True))
        return started[-1]

    try:
        scheduler = spawn("scheduler", "--port", "0")
        for _ in range(300):  # 30 s at most
            with contextlib.suppress(OSError, ValueError):
                address = json.loads(path.read_text())["address"]
                break
            time.sleep(0.1)
        else:
            pytest.fail("the scheduler wrote no scheduler file in 30 s")
        spawn("worker", "--no-nanny", "--nthreads", "1")
        assert address.startswith("tcp://127.0.0.1:")
        started.append(_big_dask_eval(checkpoint, big_corpus, address))
        scheduler.kill()
        killed = time.monotonic()
        out, err = started[-1].communicate(timeout=60)
        assert time.monotonic() - killed < 20
    finally:
        for proc in started:
            _kill_session(proc)
    assert started[-1].returncode == 1 and out == "", err
    assert_one_error_line(err, f"lost the Dask scheduler at {address}", "connection closed")


# -- help and version -----------------------------------------------------------------------------
HELP = {
    "": ["train", "sample", "eval", "export"],
    "train": ["--steps STEPS", "(default: 1000)", "(default: 32)", "(default: 0.01)",
              "(default: float32)", "(default: 0.5)", "(default: 20; with --text: 1 passage)",
              "(default: numpy)", "--decay {linear,cosine}", "--grad-clip NORM",
              "--n-layer N transformer blocks (default: 1)",
              "(default: the spec's 16, or the longest document + 1 where that is more)"],
    "sample": ["(default: 20;", "(default: 0.5)", "(default: 0)", "(default: numpy)",
               f"--batch-size N samples generated at once: memory grows with it, the names do "
               f"not depend on it (default: {sample_module.DEFAULT_BATCH_SIZE})"],
    "eval": ["--chunk-size N", "whose activations fit the memory budget", "(default: 500)",
             "(default: numpy)"],
    "export": ["--out FILE"],
}  # fmt: skip
for command in ("train", "sample"):
    HELP[command] += ["--workers N N processes (not threads) share each batch"]
    HELP[command] += ["--threads N BLAS threads of this process"]


@pytest.mark.parametrize("command", HELP)
def test_help_shows_each_default_once_in_plain_text(cli: Cli, command: str) -> None:
    out = cli.ok(*command.split(), "--help")
    flat = " ".join(out.split())
    assert flat.startswith(f"usage: microgpt-xp {command}")
    for text in HELP[command]:
        assert text in flat
    assert command or "bench" not in out
    assert "``" not in out and ":func:" not in out and ":mod:" not in out  # no rst markup
    for meaningless in ("(default: None)", "(default: False)", "(default: True)"):
        assert meaningless not in out
    # each option's help (from its line to the next option) names its default at most once
    for option_help in re.split(r" (?=-{1,2}[a-z][\w-]*[ ,])", flat):
        assert option_help.count("(default") <= 1, option_help


@pytest.mark.parametrize("how", ["console script", "python -m", "in-process"])
def test_console_script_and_python_m_agree(capsys: pytest.CaptureFixture[str], how: str) -> None:
    def call(*argv: str) -> tuple[int, str, str]:
        if how == "in-process":
            return (main(list(argv)), *capsys.readouterr())
        done = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr

    command = [sys.executable, "-m", "microgpt_xp.cli"]
    if how == "console script":
        found = shutil.which("microgpt-xp", path=str(Path(sys.executable).parent))
        if (found := found or shutil.which("microgpt-xp")) is None:
            pytest.skip("the microgpt-xp console script is not installed")
        command = [found]
    assert call("--version") == (0, f"microgpt-xp {__version__}\n", "")
    rc, out, _ = call("--help")
    assert rc == 0 and "usage: microgpt-xp" in out
    rc, out, err = call("train", "--steps", "0")
    assert rc == 2 and out == ""
    assert_one_error_line(err, "--steps")


def test_help_imports_no_heavy_module() -> None:
    code = (
        "import sys\nfrom microgpt_xp.cli import main\nassert main(['train', '--help']) == 0\n"
        "heavy = ['tqdm', 'dask', 'distributed', 'torch', 'jax', 'matplotlib', 'mimesis']\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == ""


# -- held-out loss, progress lines off a terminal -----------------------------------------------
def test_held_out_loss_in_text_json_and_checkpoint(cli: Cli, tmp_path: Path, names24: Path) -> None:
    ckpt = tmp_path / "run.npz"
    argv = train_cmd(names24, 6, "--val-fraction", 0.25, "--eval-every", 3, "--checkpoint", ckpt)
    summary = cli.json(*argv)
    assert summary["num_docs"] == 18 and summary["num_val_docs"] == 6
    assert len(summary["losses"]) == 6 and summary["final_loss"] == summary["losses"][-1]
    history = load(ckpt).meta["history"]
    assert history["losses"] == summary["losses"]
    # per document and per token; the speed of the steps
    for key, final in [
        ("val_losses", "final_val_loss"),
        ("val_token_losses", "final_val_token_loss"),
    ]:
        assert [step for step, _ in summary[key]] == [3, 6] and history[key] == summary[key]
        assert summary[final] == summary[key][-1][1]
    assert summary["mode"] == "docs" and summary["num_chars"] is None
    assert summary["ms_per_step"] > 0 and summary["tokens_per_s"] > 0
    assert 6 * 4 * 2 <= summary["tokens"] <= 6 * 4 * FIT  # predicted tokens of the 6 batches
    # resuming keeps the split: the same command with more steps extends the run
    rc, out, _ = cli(*argv, "--resume", "--steps", 9)
    assert rc == 0 and "held-out loss" in out.splitlines()[1]
    assert "(+6 held out)" in out.splitlines()[0]


def test_progress_lines_off_a_terminal(cli: Cli, monkeypatch: MP, names24: Path) -> None:
    monkeypatch.setattr(_progress, "LINE_SECONDS", 0.0)
    argv = train_cmd(names24, 200, "--num-samples", 0, "--val-data", names24, "--eval-every", 100)
    rc, out, err = cli(*argv)
    assert rc == 0 and out.startswith("train: ")
    lines = err.splitlines()
    assert lines and all(line.startswith("train: step ") for line in lines)
    assert "train: step 2/200 | loss " in lines[0]  # every 200 // 100 steps
    assert lines[-1].startswith("train: step 200/200 | loss ") and "| val " in lines[-1]
    speed = r" \| ms/step [0-9.e+-]+ \| tok/s [0-9.e+-]+k? \|"
    assert all(re.search(speed, line) for line in lines)


# -- a stream of text and the optimizer's options -----------------------------------------------
SCHEDULE = {"warmup": 3, "decay": "cosine", "min_lr": 0.001, "weight_decay": 0.1}
SCHEDULE |= {"grad_clip": 1.0, "init_std": 0.02}
SCHEDULE_ARGV = [a for k, v in SCHEDULE.items() for a in ("--" + k.replace("_", "-"), v)]


def test_options_reach_train_only_where_given(
    cli: Cli, monkeypatch: MP, tmp_path: Path, names16: Path, text_file: Path
) -> None:
    """train() records its keywords and stops (a ValueError: exit status 1)."""
    seen: dict[str, Any] = {}

    def recording(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs, args=args)
        raise ValueError("recorded")

    monkeypatch.setattr(train_module, "train", recording)
    argv = ["train", "--data", names16, "--batch-size", 4, *SCHEDULE_ARGV, "--beta1", 0.9]
    cli.fails([*argv, "--beta2", 0.95, "--val-fraction", 0.25, "--eval-tokens", 64], 1, "recorded")
    assert {k: seen[k] for k in SCHEDULE} == SCHEDULE and seen["eval_tokens"] == 64
    assert seen["optimizer"] == AdamConfig(beta1=0.9, beta2=0.95)  # the rest the spec's
    assert callable(seen["on_step"]) and "callback" not in seen
    assert seen["docs"] and seen["val_docs"] and "text" not in seen
    seen.clear()
    assert cli("train", "--data", names16, "--batch-size", 4)[0] == 1
    assert seen["optimizer"] is None  # nothing given: the library's defaults
    assert not set(seen) & {*SCHEDULE, "eval_tokens"}
    # a stream of text, its held-out part the last fraction or a file
    seen.clear()
    assert cli("train", "--text", text_file, "--val-fraction", 0.1)[0] == 1
    assert "docs" not in seen and "val_docs" not in seen
    assert seen["text"] == VERSE * 4 and seen["val_text"] is None and seen["val_fraction"] == 0.1
    held = tmp_path / "held.txt"
    held.write_text("Or to take arms", encoding="utf-8")
    seen.clear()
    assert cli("train", "--text", text_file, "--val-data", held)[0] == 1
    assert seen["val_text"] == "Or to take arms" and seen["val_fraction"] is None
    assert seen["tokenizer"] == Tokenizer.from_docs([VERSE])


def test_train_text_end_to_end(cli: Cli, tmp_path: Path, text_file: Path) -> None:
    """A run on a stream: header, speed, per-token held-out loss, a passage, eval."""
    ckpt = tmp_path / "text.npz"
    argv = ["train", "--text", text_file, "--steps", 6, "--batch-size", 4, "--block-size", 8]
    argv += ["--n-embd", 8, "--n-head", 2, "--val-fraction", 0.2, "--eval-every", 3]
    argv += ["--eval-tokens", 32, *SCHEDULE_ARGV, "--length", 40]
    out = cli.ok(*argv, "--checkpoint", ckpt)
    lines = out.splitlines()
    assert lines[0].startswith(f"train: {len(VERSE) * 4} characters (the last 0.2 held out) |")
    assert re.match(r"done: 6 steps in .* s \(.* ms/step, .* tokens/s\) \| final loss ", lines[1])
    assert re.search(r"\| held-out loss \d+\.\d{4} per token$", lines[1])
    passage = out.split("sample  1:\n", 1)[1][:-1]
    saved = load(ckpt)
    assert saved.meta["run"]["mode"] == "text"
    assert passage == sample(saved.params, saved.tokenizer, 1, length=40, seed=0)[0]
    assert len(passage) == 40

    summary = cli.json(*argv)
    assert summary["mode"] == "text" and summary["num_chars"] == len(VERSE) * 4
    assert summary["num_docs"] is None and summary["samples"] == [passage]
    assert [step for step, _ in summary["val_token_losses"]] == [3, 6]
    assert summary["val_token_losses"] == summary["val_losses"]  # a stream: both per token
    assert summary["tokens"] == 6 * 4 * 8 and summary["tokens_per_s"] > 0
    assert summary["final_loss"] == saved.meta["history"]["losses"][-1]

    scored = cli.json("eval", "--checkpoint", ckpt, "--data", text_file)
    assert scored["mode"] == "text" and scored["num_chars"] == len(VERSE) * 4
    assert 0 < scored["mean_loss"] == scored["token_loss"] < 10
    out = cli.ok("eval", "--checkpoint", ckpt, "--data", text_file)
    assert out.startswith(f"loss {scored['mean_loss']:.4f} per token over ")

"""What a practitioner relies on (issues 23 and 24): held-out loss, runs that claim their
checkpoint, checks before the work, diverged runs, prompts and top-k, the library's
default block size, and the one record of Adam's hyper-parameters."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import microgpt_xp as mx
from microgpt_xp.data import default_block_size, split_docs
from microgpt_xp.scoring import score_docs

DOCS = mx.default_docs()[:240]
ARGS: dict[str, Any] = dict(steps=6, batch_size=8, seed=2, dtype="float64")


# -- held-out loss ------------------------------------------------------------------------------
def test_held_out_loss_is_what_eval_gives_at_those_steps(tmp_path: Path) -> None:
    train_docs, val_docs = split_docs(DOCS, 0.1, seed=2)
    assert len(val_docs) == 24 and not set(val_docs) & set(train_docs)
    seen: list[tuple[int, float]] = []
    result = mx.train(
        train_docs, val_docs=val_docs, eval_every=4, on_eval=lambda s, v: seen.append((s, v)),
        checkpoint=tmp_path / "run.npz", **ARGS,
    )  # fmt: skip
    assert [s for s, _ in result.val_losses] == [4, 6] and seen == result.val_losses
    # the last one is the mean loss of the final weights on the held-out documents
    assert result.val_losses[-1][1] == score_docs(result.params, result.tokenizer, val_docs).mean
    # the training losses are those of a run without held-out documents
    plain = mx.train(train_docs, tokenizer=result.tokenizer, **ARGS)
    assert plain.losses == result.losses
    history = mx.load(tmp_path / "run.npz").meta["history"]
    assert history["losses"] == result.losses
    assert history["val_losses"] == [list(p) for p in result.val_losses]


def test_resuming_keeps_the_history_and_the_split(tmp_path: Path) -> None:
    train_docs, val_docs = split_docs(DOCS, 0.1, seed=2)
    path = tmp_path / "run.npz"
    args = dict(ARGS, val_docs=val_docs, eval_every=2, checkpoint=path)
    whole = mx.train(train_docs, **args)
    path.unlink()
    with pytest.raises(_Stop):
        mx.train(train_docs, **{**args, "checkpoint_every": 2}, callback=_stop_at(5))
    assert mx.load(path).step == 4
    resumed = mx.train(train_docs, **args, resume=True)
    assert resumed.losses == whole.losses[4:] and resumed.val_losses == whole.val_losses[2:]
    history = mx.load(path).meta["history"]
    assert history["losses"] == whole.losses
    assert history["val_losses"] == [list(p) for p in whole.val_losses]
    _, other_val = split_docs(DOCS, 0.1, seed=3)
    with pytest.raises(mx.ResumeError, match="val_docs"):
        mx.train(train_docs, **{**args, "val_docs": other_val}, resume=True)


class _Stop(Exception):
    """Stops a run from its callback (as a crash would, between two steps)."""


def _stop_at(step: int) -> Any:
    def callback(s: int, loss: float) -> None:
        if s == step:
            raise _Stop

    return callback


def test_a_split_is_fixed_by_its_seed() -> None:
    assert split_docs(DOCS, 0.25, 7) == split_docs(DOCS, 0.25, 7)
    assert split_docs(DOCS, 0.25, 7) != split_docs(DOCS, 0.25, 8)
    train_docs, held = split_docs(DOCS, 0.25, 7)
    assert sorted(train_docs + held) == sorted(DOCS) and len(held) == 60
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(mx.DataError, match="held-out fraction"):
            split_docs(DOCS, bad, 0)
    with pytest.raises(mx.DataError, match="leaves none to train on"):
        split_docs(DOCS[:2], 0.9, 0)


# -- the checkpoint is the run's --------------------------------------------------------------
def _claim_and_train(path: str, start: Any, results: Any) -> None:
    start.wait()
    try:
        mx.train(DOCS[:40], steps=30, batch_size=4, checkpoint=path)
        results.put("trained")
    except FileExistsError as exc:
        results.put(f"refused: {exc}")


def test_two_new_runs_on_one_checkpoint_exactly_one_proceeds(tmp_path: Path) -> None:
    path = str(tmp_path / "run.npz")
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    runs = [ctx.Process(target=_claim_and_train, args=(path, start, results)) for _ in range(2)]
    for p in runs:
        p.start()
    start.set()
    for p in runs:
        p.join(120)
    outcomes = sorted(results.get(timeout=5) for _ in runs)
    assert outcomes[1] == "trained", outcomes
    assert outcomes[0].startswith("refused:") and (
        "claimed" in outcomes[0] or "exists" in outcomes[0]
    )
    assert mx.load(path).step == 30


def test_a_replay_does_not_write_a_checkpoint_another_run_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from microgpt_xp._files import claim
    from microgpt_xp.cli import main

    path = tmp_path / "run.npz"
    argv = ["replay", "--steps", "2", "--num-samples", "0", "--checkpoint", str(path)]
    with claim(path):  # another run, still writing it
        assert main([*argv, "--overwrite"]) == 1
    assert "claimed by another run" in capsys.readouterr().err and not path.exists()
    assert main(argv) == 0 and mx.load(path).step == 2  # free again: the replay saves


def test_an_unwritable_checkpoint_is_found_before_any_step(tmp_path: Path) -> None:
    steps: list[int] = []
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path, tmp_path / "file" / "run.npz"):
        with pytest.raises(OSError, match="cannot write"):
            mx.train(
                DOCS[:40], steps=3, batch_size=4, checkpoint=bad, overwrite=True,
                callback=lambda step, loss: steps.append(step),
            )  # fmt: skip
    assert steps == []


# -- runs that go wrong ---------------------------------------------------------------------------
def test_a_diverged_run_stops_without_numpy_warnings(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here
        with pytest.raises(mx.TrainingError, match="training stopped") as info:
            mx.train(DOCS[:40], steps=30, batch_size=4, lr=1e6, checkpoint=tmp_path / "x.npz")
    text = str(info.value)
    assert "diverged" in text or "not finite" in text
    assert "no checkpoint of this run was written" in text and "is kept" not in text


def test_a_replay_checkpoint_is_not_resumed_by_batched_training(tmp_path: Path) -> None:
    path = tmp_path / "exact.npz"
    run = mx.run_exact(DOCS[:30], max_steps=2, num_samples=0, print_fn=lambda t, e: None)
    assert run.params is not None
    mx.save(path, run.params, adam=run.adam, step=2, tokenizer=run.tokenizer,
            meta={"microgpt_exact": {"sample_rng_state": None}})  # fmt: skip
    with pytest.raises(ValueError, match="microgpt-exact replay"):
        mx.train(DOCS[:30], steps=5, batch_size=4, checkpoint=path, resume=True,
                 config=run.params.config, tokenizer=run.tokenizer, dtype="float64")  # fmt: skip


def test_sampling_refuses_weights_that_are_not_finite() -> None:
    tokenizer = mx.Tokenizer.from_docs(DOCS)
    params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size), seed=0)
    broken = params.map(lambda a: a * np.nan)
    with pytest.raises(ValueError, match="not finite"):
        mx.sample(broken, tokenizer, 3)


# -- sampling like a tool ---------------------------------------------------------------------------
def test_prompt_and_top_k() -> None:
    tokenizer = mx.Tokenizer.from_docs(DOCS)
    params = mx.train(DOCS, steps=20, batch_size=16).params
    names = mx.sample(params, tokenizer, 40, prompt="ma", seed=1)
    assert all(name.startswith("ma") for name in names) and len(set(names)) > 5
    # the draws after the prompt are the same uniforms: top-k of the whole vocabulary is
    # no restriction, top-1 is the argmax at every position
    assert mx.sample(params, tokenizer, 40, seed=1, top_k=tokenizer.vocab_size) == mx.sample(
        params, tokenizer, 40, seed=1
    )
    greedy = mx.sample(params, tokenizer, 5, seed=1, top_k=1)
    assert (
        len(set(greedy)) == 1
        and greedy[0] == mx.sample(params, tokenizer, 1, temperature=1e-300)[0]
    )
    few = mx.sample(params, tokenizer, 200, seed=1, top_k=3, temperature=2.0)
    wide = mx.sample(params, tokenizer, 200, seed=1, temperature=2.0)
    assert len({n[0] for n in few if n}) <= 3 < len({n[0] for n in wide if n})
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        mx.sample(params, tokenizer, 2, prompt="ma!")
    with pytest.raises(ValueError, match="leaves no position to sample"):
        mx.sample(params, tokenizer, 2, prompt="a" * params.config.block_size)
    with pytest.raises(ValueError, match="top_k"):
        mx.sample(params, tokenizer, 2, top_k=0)


# -- one default, one record ---------------------------------------------------------------------------
def test_the_library_picks_the_block_size_as_the_cli_does() -> None:
    long_docs = [*DOCS[:20], "a" * 30]
    result = mx.train(long_docs, steps=1, batch_size=4)
    assert result.params.config.block_size == default_block_size(long_docs) == 31
    assert mx.train(DOCS[:20], steps=1, batch_size=4).params.config.block_size == 16


def test_adam_takes_one_record_and_train_refuses_unknown_options() -> None:
    config = mx.AdamConfig(lr=0.02, num_steps=10)
    params = mx.init_params(mx.GPTConfig(27))
    assert mx.Adam(params, config).config == config == mx.Adam(params, lr=0.02, num_steps=10).config
    with pytest.raises(ValueError, match="beta1"):
        mx.AdamConfig(beta1=1.0)
    with pytest.raises(TypeError, match="unknown Adam hyper-parameters"):
        mx.Adam(params, momentum=0.9)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        mx.train(DOCS, steps=1, learning_rate=0.1)  # type: ignore[call-arg]


def test_python_dash_m_microgpt_xp_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "microgpt_xp", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("microgpt-xp ")


def test_dask_sampling_with_zero_chunks_is_a_value_error() -> None:
    pytest.importorskip("dask")
    tokenizer = mx.Tokenizer.from_docs(DOCS)
    params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size), seed=0).to("dask")
    with pytest.raises(ValueError, match="chunks must be a positive int, got 0"):
        mx.sample(params, tokenizer, 4, chunks=0)
    assert mx.sample(params, tokenizer, 4, chunks=2) == mx.sample(params.to("numpy"), tokenizer, 4)

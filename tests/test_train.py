"""microgpt_xp.train: determinism, callbacks, resuming, non-finite losses, argument errors,
and (slow) that a short run on names.txt learns."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xp_testing import assert_params_equal, host_arrays, raises_about

from microgpt_xp import GPTConfig, Params, Tokenizer, init_params, loss_and_grads, read_docs, score
from microgpt_xp.checkpoint import load
from microgpt_xp.data import DataError, batch_indices, encode_docs, take_batch
from microgpt_xp.train import ResumeError, TrainingError, TrainResult, train

# Every document has the same length, so every batch has the same shape: backends that
# compile per shape (JAX) compile once for the whole file.
DOCS = ["abcd", "bcda", "cdab", "dabc", "acbd", "bdca", "cadb", "dbac"]
TOKENIZER = Tokenizer.from_docs(DOCS)
CONFIG = GPTConfig(TOKENIZER.vocab_size, n_layer=1, n_embd=8, n_head=2, block_size=8)
STEPS, BATCH = 4, 3


def _run(on: Any = None, docs: list[str] = DOCS, **kwargs: Any) -> TrainResult:
    """This file's run (steps, batch, config, seed 1, float64, lr 0.05) on backend ``on``."""
    args = dict(steps=STEPS, batch_size=BATCH, config=CONFIG, seed=1, dtype="float64", lr=0.05)
    if on is not None:
        args.update(backend=on.name, device=on.device)
    return train(docs, **{**args, **kwargs})


# -- determinism ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_deterministic_for_a_seed(backend: Any, dtype: str) -> None:
    r1 = _run(backend, dtype=dtype)
    r2 = _run(backend, dtype=dtype)
    assert len(r1.losses) == STEPS
    assert all(isinstance(x, float) and math.isfinite(x) for x in r1.losses)
    assert r1.losses == r2.losses
    assert_params_equal(r1.params, r2.params)
    assert r1.params.backend == backend.name and str(r1.params.dtype).endswith(dtype)
    assert r1.step == STEPS and r1.start_step == 0 and r1.adam.t == STEPS
    assert r1.adam.num_steps == STEPS and r1.tokenizer == TOKENIZER
    # training moved the weights
    init = host_arrays(init_params(CONFIG, seed=1, dtype=dtype))
    assert any(not np.array_equal(init[k], v) for k, v in host_arrays(r1.params).items())
    # the same seed gives the same run on every backend (float64, to rounding)
    if backend.name != "numpy" and dtype == "float64":
        np.testing.assert_allclose(r1.losses, _run().losses, rtol=1e-12, atol=0)


def test_callback_and_first_loss() -> None:
    """The callback gets (step, loss); losses[0] is the batch loss of the initial weights
    on step 0's documents; another seed gives another run."""
    calls: list[tuple[int, float]] = []
    result = _run(callback=lambda step, loss: calls.append((step, loss)))
    assert [s for s, _ in calls] == list(range(1, STEPS + 1))
    assert all(isinstance(s, int) and isinstance(x, float) for s, x in calls)
    assert [x for _, x in calls] == result.losses and _run(seed=2).losses != result.losses
    params = init_params(CONFIG, seed=1, dtype="float64")
    tokens, lengths = encode_docs(TOKENIZER, DOCS, CONFIG.block_size)
    tok, lens = take_batch(tokens, lengths, batch_indices(len(DOCS), BATCH, 0, seed=1))
    loss, _ = loss_and_grads(params, tok, lens)
    assert result.losses[0] == float(loss)
    # default corpus and tokenizer
    result = train(steps=1, batch_size=2, dtype="float64")
    assert set(result.tokenizer.chars) <= set("abcdefghijklmnopqrstuvwxyz")
    assert result.params.config == GPTConfig(result.tokenizer.vocab_size)
    assert len(result.losses) == 1


# -- checkpoints and resuming -------------------------------------------------------------------
class Interrupt(Exception):
    """Stands for a crash or a Ctrl-C in the middle of a run."""


def _interrupt_at(step_to_fail: int) -> Any:
    def callback(step: int, loss: float) -> None:
        if step == step_to_fail:
            raise Interrupt

    return callback


@pytest.mark.parametrize("k", [1, 2, 3])
def test_resume_gives_the_uninterrupted_run(backend: Any, tmp_path: Path, k: int) -> None:
    full = _run(backend)
    path = tmp_path / "run.ckpt"
    # checkpoint every step; the interrupt comes in step k + 1, before its save
    with pytest.raises(Interrupt):
        _run(backend, checkpoint=path, checkpoint_every=1, callback=_interrupt_at(k + 1))
    assert load(path).step == k
    seen: list[int] = []
    resumed = _run(
        backend, checkpoint=path, resume=True, callback=lambda step, loss: seen.append(step)
    )
    assert resumed.start_step == k and resumed.step == STEPS
    assert seen == list(range(k + 1, STEPS + 1)) and resumed.losses == full.losses[k:]
    assert_params_equal(resumed.params, full.params)
    assert resumed.adam.t == STEPS
    final = load(path)
    assert final.step == STEPS
    assert_params_equal(final.params, full.params.to("numpy"))


def test_resume_without_a_file_starts_fresh_and_a_finished_run_is_done(tmp_path: Path) -> None:
    path = tmp_path / "new.ckpt"
    result = _run(checkpoint=path, resume=True)
    assert result.start_step == 0 and result.losses == _run().losses
    saved = load(path)
    assert saved.step == STEPS and saved.tokenizer == TOKENIZER
    assert_params_equal(saved.params, result.params)
    again = _run(checkpoint=path, resume=True)
    assert again.losses == [] and again.start_step == again.step == STEPS
    assert_params_equal(again.params, result.params)
    # checkpoint every
    path = tmp_path / "every.ckpt"
    seen: list[int | None] = []

    def callback(step: int, loss: float) -> None:
        # step s's callback runs before step s's save, so it sees the previous save
        seen.append(load(path).step if path.exists() else None)

    _run(checkpoint=path, checkpoint_every=2, callback=callback)
    assert seen == [None, None, 2, 2] and load(path).step == STEPS


def _interrupted(path: Path, k: int = 2) -> None:
    """A checkpoint of this file's run interrupted after step ``k``."""
    with pytest.raises(Interrupt):
        _run(checkpoint=path, checkpoint_every=1, callback=_interrupt_at(k + 1))
    assert load(path).step == k


@pytest.mark.parametrize(
    ("change", "option", "saved", "given"),
    [({"seed": 2}, "seed", 1, 2), ({"batch_size": 2}, "batch_size", BATCH, 2),
     ({"lr": 0.02}, "lr", 0.05, 0.02), ({"dtype": "float32"}, "dtype", "float64", "float32"),
     ({"reduction": "token_mean"}, "reduction", "mean", "token_mean"),
     ({"steps": STEPS + 1}, "steps", STEPS, STEPS + 1)],
)  # fmt: skip
def test_resume_refuses_to_change_the_run(
    tmp_path: Path, change: dict[str, Any], option: str, saved: Any, given: Any
) -> None:
    path = tmp_path / "run.ckpt"
    _interrupted(path)
    with pytest.raises(
        ResumeError, match=f"with {option}={given!r}:.* has {option}={saved!r}"
    ) as info:
        _run(checkpoint=path, resume=True, **change)
    assert (info.value.option, info.value.saved, info.value.given) == (option, saved, given)
    assert load(path).step == 2  # the checkpoint is left as it was


def test_resume_extends_a_finished_run_and_refuses_what_would_mix_runs(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    _run(checkpoint=path)
    before = load(path)
    longer = _run(checkpoint=path, resume=True, steps=STEPS + 3)
    assert (longer.start_step, longer.step, len(longer.losses)) == (STEPS, STEPS + 3, 3)
    assert longer.adam.num_steps == STEPS + 3 and load(path).step == STEPS + 3
    # the same three steps by hand: the saved state, the schedule of a run of STEPS + 3
    params, adam = before.params, before.adam
    assert adam is not None
    adam.extend(STEPS + 3)
    tokens, lengths = encode_docs(TOKENIZER, DOCS, CONFIG.block_size)
    for step in range(STEPS, STEPS + 3):
        tok, lens = take_batch(tokens, lengths, batch_indices(len(DOCS), BATCH, step, 1))
        loss, grads = loss_and_grads(params, tok, lens)
        assert float(loss) == longer.losses[step - STEPS]
        params = adam.step(params, grads)
    assert adam.lr_at(STEPS) == pytest.approx(0.05 * 3 / (STEPS + 3))
    assert_params_equal(longer.params, params)
    # an existing checkpoint is not overwritten
    path = tmp_path / "other.ckpt"
    first = _run(checkpoint=path)
    with pytest.raises(FileExistsError, match=r"resume=True.*overwrite=True"):
        _run(checkpoint=path, seed=7)
    assert_params_equal(load(path).params, first.params)
    other = _run(checkpoint=path, seed=7, overwrite=True)
    assert_params_equal(load(path).params, other.params)
    # resume refuses another corpus or config
    path = tmp_path / "refused.ckpt"
    _interrupted(path)
    with pytest.raises(ResumeError, match="with docs='sha256:") as info:
        _run(docs=list(reversed(DOCS)), checkpoint=path, resume=True)
    assert info.value.option == "docs"
    other = GPTConfig(TOKENIZER.vocab_size, n_layer=1, n_embd=4, n_head=2, block_size=8)
    with pytest.raises(ResumeError, match=r"with config=GPTConfig.*n_embd=4") as info:
        _run(checkpoint=path, resume=True, config=other)
    assert info.value.option == "config" and info.value.saved == CONFIG
    # other characters in a tokenizer of the same size: the same config
    other_docs = [d.replace("d", "e") for d in DOCS]
    with pytest.raises(ResumeError, match=r"chars 'abce'.*has tokenizer=.chars 'abcd'") as info:
        _run(docs=other_docs, checkpoint=path, resume=True)
    assert info.value.option == "tokenizer"


# -- non-finite losses --------------------------------------------------------------------------
#: In float32 this learning rate makes a weight infinite at step 2 and the loss NaN at step 3.
DIVERGING = dict(lr=1e20, dtype="float32", steps=30)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_losses_and_weights(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="the loss is nan at step 3") as info:
        _run(**DIVERGING)
    assert "checkpoint" not in str(info.value)
    path = tmp_path / "run.ckpt"  # non-finite weights are never saved
    with pytest.raises(TrainingError, match="not finite after step 2"):
        _run(**DIVERGING, checkpoint=path, checkpoint_every=2)
    assert list(tmp_path.iterdir()) == []
    # a diverging run keeps the last good checkpoint
    seen: list[int] = []
    with pytest.raises(TrainingError, match="not finite after step 2") as info:
        _run(**DIVERGING, checkpoint=path, checkpoint_every=1, callback=lambda s, _: seen.append(s))
    assert str(path) in str(info.value) and seen == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    saved = load(path)
    assert saved.step == 1 and saved.adam is not None and saved.adam.t == 1
    assert all(np.isfinite(a).all() for a in host_arrays(saved.params).values())
    # the kept checkpoint is the good one: resuming from it fails the same way
    with pytest.raises(TrainingError, match="not finite after step 2"):
        _run(**DIVERGING, checkpoint=path, checkpoint_every=1, resume=True)
    assert load(path).step == 1


# -- argument errors -----------------------------------------------------------------------------
_BAD = [  # (arguments, error, the parameter it names, a phrase that tells the case apart)
    *[({"steps": v}, ValueError, "steps", None) for v in (0, -1, 2.5, True)],
    *[({"batch_size": v}, ValueError, "batch_size", None) for v in (0, -2, 1.0)],
    ({"backend": "nope"}, ValueError, "backend", "'nope'"),
    ({"dtype": "float16"}, ValueError, "dtype", "float16"),
    ({"docs": [], "steps": 1, "batch_size": 1}, DataError, "docs", "no documents"),
    ({"docs": "abc"}, TypeError, "docs", "not one string"),  # else one-character documents
    ({"docs": ["abc", 3]}, TypeError, "docs", "documents must be strings"),
    ({"docs": ["abc", None]}, TypeError, "docs", "got NoneType"),
    ({"resume": True}, ValueError, "resume", "checkpoint"),
    (
        {"config": GPTConfig(TOKENIZER.vocab_size + 1, n_embd=8, n_head=2)},
        ValueError,
        "config",
        None,
    ),
    # options that would do nothing (issue 31)
    ({"eval_every": 5}, ValueError, "eval_every", "held-out data"),
    ({"eval_tokens": 50}, ValueError, "eval_tokens", "held-out data"),
    ({"checkpoint_every": 2}, ValueError, "checkpoint_every", "checkpoint"),
    ({"overwrite": True}, ValueError, "overwrite", "checkpoint"),
    ({"batch_size": len(DOCS) + 1}, DataError, "batch_size", "8 documents, fewer than .* 9"),
    (
        {"docs": [*DOCS, "abce"], "steps": 1, "batch_size": 1, "tokenizer": TOKENIZER},
        ValueError,
        None,
        "'e'",
    ),
]


@pytest.mark.parametrize(("args", "error", "param", "match"), _BAD)
def test_bad_arguments(args: dict[str, Any], error: type, param: str, match: str) -> None:
    with raises_about(error, param, match):
        _run(**args)


# -- it learns -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_it_learns_names(names_txt: Path) -> None:
    docs = read_docs(names_txt)
    tok = Tokenizer.from_docs(docs)
    config = GPTConfig(tok.vocab_size)
    tokens, lengths = encode_docs(tok, docs, config.block_size)

    def mean_loss(params: Params) -> float:  # over the corpus, in chunks of 2048 documents
        chunks = [np.arange(i, min(i + 2048, len(docs))) for i in range(0, len(docs), 2048)]
        rows = [score(params, *take_batch(tokens, lengths, idx)) for idx in chunks]
        return sum(float(np.sum(np.asarray(r, dtype=np.float64))) for r in rows) / len(docs)

    before = mean_loss(init_params(config, seed=0))
    after = mean_loss(train(docs, steps=200, batch_size=32, seed=0).params)
    assert abs(before - math.log(tok.vocab_size)) < 0.1  # about uniform: ~3.3
    assert after < 2.4


def test_a_dask_run_resumes_with_the_losses_of_numpy(tmp_path: Path) -> None:
    """A run on Dask tasks resumed from its checkpoint (its moments placed with its weights)
    gives the losses of the same NumPy run resumed."""
    pytest.importorskip("dask.array")
    losses = {}
    for backend in ("numpy", "dask"):
        path = tmp_path / f"{backend}.npz"
        train(DOCS, steps=2, batch_size=4, backend=backend, checkpoint=path, config=CONFIG)
        again = train(
            DOCS, steps=3, batch_size=4, backend=backend, checkpoint=path, config=CONFIG,
            resume=True,
        )  # fmt: skip
        losses[backend] = again.losses
    assert len(losses["numpy"]) == 1 and losses["dask"] == losses["numpy"]

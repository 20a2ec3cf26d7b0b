"""Training on a stream of text, bounded held-out scoring, StepStats, length groups of
documents, the run's mode in its checkpoint and the save at an interrupt."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xp_testing import assert_params_equal, raises_about

import microgpt_xp as mx
from microgpt_xp import GPTConfig, StepStats, Tokenizer, init_params, load, loss_and_grads, save
from microgpt_xp import data as D
from microgpt_xp.export import _metadata
from microgpt_xp.optim import AdamConfig
from microgpt_xp.scoring import score_docs, score_encoded
from microgpt_xp.train import ResumeError, TrainResult, train

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved.\n"
)
TOKENIZER = Tokenizer(set(TEXT))
CONFIG = GPTConfig(TOKENIZER.vocab_size, n_layer=1, n_embd=8, n_head=2, block_size=8)
ARGS: dict[str, Any] = dict(steps=4, batch_size=3, seed=1, dtype="float64", config=CONFIG)
DOCS = ["ab", "abcdefg", "abc", "abcdef", "a", "abcd", "abcde", "b", "bcd", "cdefg", "ba", "dc"]


def _text(**kwargs: Any) -> TrainResult:
    return train(**{**ARGS, "text": TEXT, **kwargs})


# -- windows of a stream ------------------------------------------------------------------------
def test_text_windows_are_the_seeds_and_the_first_loss_is_theirs() -> None:
    ids = D.encode_text(TOKENIZER, TEXT)
    assert TOKENIZER.decode(ids) == TEXT and ids.dtype == np.int64  # newlines are tokens
    starts = [D.text_windows(len(ids), 8, 3, s, seed=1) for s in range(4)]
    for s, x in enumerate(starts):
        np.testing.assert_array_equal(D.text_windows(len(ids), 8, 3, s, seed=1), x)
        assert x.min() >= 0 and x.max() <= len(ids) - 9
    assert not np.array_equal(starts[0], starts[1])
    tokens, lengths = D.take_windows(ids, starts[0], 8)
    assert tokens.shape == (3, 9) and lengths.tolist() == [9, 9, 9]
    assert TOKENIZER.bos not in tokens  # no BOS in a stream
    np.testing.assert_array_equal(tokens[1], ids[starts[0][1] : starts[0][1] + 9])
    result, again = _text(), _text()
    assert result.losses == again.losses and len(result.losses) == 4
    loss, _ = loss_and_grads(init_params(CONFIG, seed=1, dtype="float64"), tokens, lengths)
    assert result.losses[0] == float(loss)
    assert result.tokenizer == TOKENIZER  # every character of the text, newlines too
    default = train(text=TEXT, steps=1, batch_size=2)
    assert default.params.config.block_size == 16  # the spec's


def test_read_text_reads_the_file_as_open_does(tmp_path: Path) -> None:
    path = tmp_path / "play.txt"
    path.write_bytes(b"\xef\xbb\xbfKING:\r\nNay.\r\rAll:\n")
    assert D.read_text(path) == "KING:\nNay.\n\nAll:\n"
    path.write_bytes(b"a")
    with pytest.raises(D.DataError, match="1 characters"):
        D.read_text(path)
    with pytest.raises(D.DataError, match="not a regular file"):
        D.read_text(tmp_path)


def test_held_out_text_is_the_last_fraction_scored_on_fixed_windows() -> None:
    head, tail = D.split_text(TEXT, 0.25)
    assert head + tail == TEXT and len(tail) == round(0.25 * len(TEXT))
    result = _text(val_fraction=0.25, eval_every=2, eval_tokens=40)
    whole = _text(val_text=tail, text=head, tokenizer=TOKENIZER, eval_every=2, eval_tokens=40)
    assert result.losses == whole.losses and result.val_losses == whole.val_losses
    # by hand: the windows of the tail, at most 40 predicted tokens
    ids = D.encode_text(TOKENIZER, tail)
    starts = D.eval_windows(len(ids), 8, 40)
    assert len(starts) == 5
    want = score_encoded(result.params, *D.take_windows(ids, starts, 8)).token_mean
    assert [s for s, _ in result.val_token_losses] == [2, 4]
    assert result.val_token_losses[-1] == (4, want) and result.val_losses == result.val_token_losses


@pytest.mark.parametrize(("n", "max_tokens"), [(100, 40), (100, 10**6), (1000, 64), (9, 8), (5, 8)])
def test_eval_windows_are_evenly_spaced_disjoint_and_bounded(n: int, max_tokens: int) -> None:
    starts = D.eval_windows(n, 8, max_tokens)
    predicted = [set(range(s + 1, s + 9)) for s in starts]
    assert len(starts) >= 1
    if n >= 9:
        assert len(starts) * 8 <= max(8, max_tokens)  # the cost bound
        assert starts[0] == 0 and starts[-1] == (n - 9 if len(starts) > 1 else 0)
        assert sum(map(len, predicted)) == len(set().union(*predicted))  # disjoint
        gaps = np.diff(starts)
        assert len(gaps) == 0 or gaps.max() - gaps.min() <= 1  # evenly spaced
        if max_tokens >= n * 8:
            assert len(starts) == (n - 9) // 8 + 1  # as many as fit
    np.testing.assert_array_equal(D.eval_windows(n, 8, max_tokens), starts)  # fixed


def test_held_out_documents_are_the_first_ones_within_eval_tokens() -> None:
    val = ["abc", "bcd", "abcdefgh", "dcba", "a"]  # predicts 4, 4, 8 (cut), 5, 2 tokens
    result = train(DOCS, val_docs=val, eval_tokens=13, **{**ARGS, "config": None})
    params, tok = result.params, result.tokenizer
    first = score_docs(params, tok, val[:2])  # 4 + 4 <= 13 < 4 + 4 + 8
    assert result.val_losses[-1] == (4, first.mean)
    assert result.val_token_losses[-1] == (4, first.token_mean)
    everything = train(DOCS, val_docs=val, **{**ARGS, "config": None})  # all fit the default
    assert everything.val_token_losses[-1][1] == score_docs(params, tok, val).token_mean


def test_default_eval_cost_is_a_share_of_the_training_tokens(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    _text(checkpoint=path, val_fraction=0.5, steps=20, eval_every=5)
    # 0.3 x 5 steps x 3 rows x 8 tokens = 36, raised to the floor of 512
    assert load(path).meta["run"]["eval_tokens"] == 512
    # 50 steps: one evaluation every 5; 0.3 x 5 steps x 64 rows x 8 tokens
    train(text=TEXT * 40, **{**ARGS, "steps": 50, "batch_size": 64}, val_fraction=0.5,
          checkpoint=path, overwrite=True)  # fmt: skip
    assert load(path).meta["run"]["eval_tokens"] == math.ceil(0.3 * 5 * 64 * 8) == 768


# -- per-step numbers ---------------------------------------------------------------------------
def test_on_step_gets_step_loss_tokens_and_seconds() -> None:
    assert mx.StepStats is StepStats and "StepStats" in mx.__all__
    seen: list[StepStats] = []
    calls: list[tuple[int, float]] = []
    result = _text(on_step=seen.append, callback=lambda s, x: calls.append((s, x)))
    assert [s.step for s in seen] == [1, 2, 3, 4] and [s.loss for s in seen] == result.losses
    assert calls == [(s.step, s.loss) for s in seen]
    assert all(s.tokens == 3 * 8 and s.seconds > 0 for s in seen)
    docs_seen: list[StepStats] = []
    train(DOCS, on_step=docs_seen.append, **{**ARGS, "config": None})
    tok = Tokenizer.from_docs(DOCS)
    _, lengths = D.encode_docs(tok, DOCS, 16)
    want = [int(np.sum(lengths[D.batch_indices(len(DOCS), 3, s, 1)] - 1)) for s in range(4)]
    assert [s.tokens for s in docs_seen] == want


# -- documents of unequal lengths: computed in groups ------------------------------------------
def test_length_groups_partition_the_rows_where_a_cut_pays() -> None:
    lengths = np.array([3, 17, 4, 16, 3, 17, 5, 15])  # predicted 2, 16, 3, 15, ...
    assert [g.tolist() for g in D.length_groups(lengths, 16, 1e9)] == [list(range(8))]
    groups = D.length_groups(lengths, 16, 0.0)  # calls are free: no padding at all
    assert sorted(np.concatenate(groups).tolist()) == list(range(8))
    assert all(D.padding(lengths[g], 16)[0] == D.padding(lengths[g], 16)[1] for g in groups)
    two = D.length_groups(lengths, 16, 20.0)  # one more call is worth 20 positions
    assert [sorted(lengths[g].tolist()) for g in two] == [[3, 3, 4, 5], [15, 16, 17, 17]]


def test_a_step_in_groups_is_the_step_to_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    module = importlib.import_module("microgpt_xp.train")
    for reduction in ("mean", "token_mean"):
        runs = []
        for cost in (0.0, 1e30):  # every length its own group; one group
            monkeypatch.setattr(module, "CALL_COST", cost)
            runs.append(train(DOCS, **{**ARGS, "config": None, "reduction": reduction}))
        grouped, plain = runs
        np.testing.assert_allclose(grouped.losses, plain.losses, rtol=1e-12)
        assert grouped.losses != plain.losses or reduction == "token_mean"
        for name, a in grouped.params.arrays().items():
            np.testing.assert_allclose(a, getattr(plain.params, name), rtol=1e-9, atol=1e-12)


def test_groups_pay_on_shakespeare_lines_not_on_names(names_txt: Path) -> None:
    """At a 128-channel model's call cost, block 64, 32 a batch: Shakespeare's lines in
    groups with far less padding; names.txt's batches (where groups measured slower) whole."""
    from microgpt_xp.train import CALL_COST

    for name in ("names", "shakespeare"):
        path = names_txt.parent / f"{name}.txt"
        if not path.is_file():
            continue
        docs = D.read_docs(path)
        _, lengths = D.encode_docs(Tokenizer.from_docs(docs), docs, 64)
        whole, grouped, calls = np.zeros(2), np.zeros(2), 0
        for s in range(100):
            lens = lengths[D.batch_indices(len(docs), 32, s, 0)]
            whole += D.padding(lens, 64)
            groups = D.length_groups(lens, 64, CALL_COST / 128**2)
            calls += len(groups)
            grouped += sum(np.array(D.padding(lens[g], 64)) for g in groups)
        if name == "names":
            assert calls <= 110
        else:
            assert 1 - grouped[1] / grouped[0] <= 0.2 < 0.3 < 1 - whole[1] / whole[0]


# -- checkpoints: the mode, the options, an interrupt ------------------------------------------
def test_the_mode_is_recorded_and_a_resume_cannot_change_it(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    _text(checkpoint=path, steps=2)
    saved = load(path)
    run = saved.meta["run"]
    assert run["mode"] == "text" and run["warmup"] == 0 and run["decay"] == "linear"
    assert saved.mode == "text" and load(path).mode == "text"
    props = _metadata(saved.params, "forward", None, None, None, None, saved.mode)
    assert props["microgpt_xp.mode"] == "text"  # what export records of it
    with raises_about(ResumeError, "mode", "mode", attr="option") as info:
        train([TEXT] * 3, checkpoint=path, resume=True, **{**ARGS, "steps": 3})
    assert (info.value.saved, info.value.given) == ("text", "docs")
    with raises_about(ResumeError, "text", "text", attr="option"):
        train(text=TEXT[::-1], checkpoint=path, resume=True, **{**ARGS, "steps": 3})
    with raises_about(ResumeError, "warmup", attr="option"):
        _text(checkpoint=path, resume=True, warmup=1)
    with raises_about(ResumeError, "beta1", attr="option"):  # from the saved optimizer
        _text(checkpoint=path, resume=True, optimizer=AdamConfig(beta1=0.9))
    assert _text(checkpoint=path, resume=True, steps=3).start_step == 2  # a finished run, extended


def test_a_checkpoint_without_the_new_records_resumes_as_a_run_on_documents(tmp_path: Path) -> None:
    path = tmp_path / "old.ckpt"
    args = {**ARGS, "config": None}
    whole = train(DOCS, **args)
    with pytest.raises(ZeroDivisionError):  # a crash in step 3, after the save of step 2
        train(DOCS, checkpoint=path, checkpoint_every=2, callback=lambda s, x: s // (s - 3), **args)
    saved = load(path)
    old = {k: v for k, v in saved.meta["run"].items() if k in ("seed", "batch_size", "lr",
           "dtype", "reduction", "corpus", "val_corpus")}  # fmt: skip
    save(path, saved.params, adam=saved.adam, step=2, tokenizer=saved.tokenizer,
         meta={"run": old, "history": {"losses": whole.losses[:2], "val_losses": []}})  # fmt: skip
    resumed = train(DOCS, checkpoint=path, resume=True, **args)
    assert resumed.losses == whole.losses[2:]
    with raises_about(ResumeError, "grad_clip", attr="option"):  # an old run had none
        train(DOCS, checkpoint=path, resume=True, grad_clip=1.0, **args)


def test_a_warmup_longer_than_the_default_schedule_is_taken() -> None:
    # checked against the run's own steps, not AdamConfig's default num_steps=1000
    assert train(text=TEXT, warmup=1001, **{**ARGS, "steps": 1002}).adam.config.warmup == 1001


class Stop(KeyboardInterrupt):
    """Stands for Ctrl-C (or a SIGTERM the command turned into one)."""


@pytest.mark.parametrize(("k", "every"), [(1, 1), (3, 1), (2, 3)])
def test_an_interrupt_saves_the_last_completed_step(tmp_path: Path, k: int, every: int) -> None:
    args: dict[str, Any] = dict(val_fraction=0.3, eval_every=every, eval_tokens=16)
    whole = _text(**args)
    path = tmp_path / "run.ckpt"

    def stop(stats: StepStats) -> None:
        if stats.step == k + 1:
            raise Stop

    with pytest.raises(Stop):
        _text(checkpoint=path, on_step=stop, **args)
    # step k + 1 ran; it is complete unless its evaluation was due (and did not run)
    saved = k if (k + 1) % every == 0 else k + 1
    assert load(path).step == saved
    resumed = _text(checkpoint=path, resume=True, **args)
    assert resumed.losses == whole.losses[saved:]
    assert resumed.val_token_losses == [p for p in whole.val_token_losses if p[0] > saved]
    assert_params_equal(resumed.params, whole.params)
    history = load(path).meta["history"]
    assert history["losses"] == whole.losses
    assert history["val_token_losses"] == [list(p) for p in whole.val_token_losses]


def test_an_interrupt_before_a_step_completes_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"

    def stop(stats: StepStats) -> None:
        raise Stop

    with pytest.raises(Stop):  # step 1's evaluation was due: step 1 is not complete
        _text(checkpoint=path, on_step=stop, val_fraction=0.3, eval_every=1)
    assert not path.exists()
    with pytest.raises(Stop):  # without one, step 1 is complete when its update is
        _text(checkpoint=path, on_step=stop)
    assert load(path).step == 1


# -- argument errors ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "param", "error"),
    [
        ({"docs": DOCS, "text": TEXT}, "text", ValueError),
        ({"text": TEXT, "val_docs": DOCS}, "val_docs", ValueError),
        ({"docs": DOCS, "val_text": TEXT}, "val_text", ValueError),
        ({"text": TEXT, "val_text": TEXT, "val_fraction": 0.1}, "val_fraction", ValueError),
        ({"text": TEXT, "val_fraction": 1.5}, "val_fraction", ValueError),
        ({"docs": DOCS, "val_fraction": 0.0}, "val_fraction", ValueError),
        ({"text": TEXT, "val_fraction": "0.1"}, "val_fraction", TypeError),
        ({"text": ["a", "b"]}, "text", TypeError),
        ({"text": "abcdef"}, "text", D.DataError),  # shorter than a window of 9
        ({"text": TEXT, "eval_tokens": 0, "val_fraction": 0.1}, "eval_tokens", ValueError),
    ],
)
def test_bad_corpora(kwargs: dict[str, Any], param: str, error: type) -> None:
    args = {**ARGS, **kwargs}
    if "docs" in kwargs or kwargs.get("text") == "abcdef":
        args["config"] = None
    with raises_about(error, param):
        train(**args)


def test_a_text_run_on_dask_tasks_is_the_numpy_run() -> None:
    """Windows and held-out scoring in Dask tasks (one chunk): NumPy's numbers."""
    pytest.importorskip("dask.array")
    args = dict(val_fraction=0.3, eval_every=2, eval_tokens=24)
    numpy_run, dask_run = _text(**args), _text(backend="dask", **args)
    assert dask_run.losses == numpy_run.losses
    assert dask_run.val_token_losses == numpy_run.val_token_losses

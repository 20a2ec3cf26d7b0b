"""Document packing (issue 33): a batch's documents share rows, attention confined to each;
the packed step's loss and gradients are the unpacked step's (to rounding) on every backend,
padding falls to a few percent on names.txt and Shakespeare's lines, ``train(pack=True)``
resumes bit for bit and gives Dask's bits wherever its chunks run, ``--pack`` on the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xp_testing import params_on

import microgpt_xp as mx
from microgpt_xp import _xp
from microgpt_xp import primitives as P
from microgpt_xp._errors import ArgumentValueError
from microgpt_xp.checkpoint import load
from microgpt_xp.cli import main
from microgpt_xp.data import (
    Tokenizer,
    batch_indices,
    default_block_size,
    encode_docs,
    pack_batch,
    padding,
    read_docs,
    take_batch,
)
from microgpt_xp.model import loss_and_grads
from microgpt_xp.train import ResumeError

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"  # ../shared/data from the repository root

DOCS = [*mx.default_docs()[:60], "a-document-longer-than-the-block"]
TOKENIZER = Tokenizer.from_docs(DOCS)
CONFIG = mx.GPTConfig(TOKENIZER.vocab_size, n_layer=2, n_embd=16, n_head=4, block_size=12)
BLOCK = CONFIG.block_size


def _batch(count: int = 13) -> tuple[np.ndarray, np.ndarray]:
    """``count`` documents of unequal lengths and the long one (cut at the block)."""
    return encode_docs(TOKENIZER, [*DOCS[:count], DOCS[-1]], BLOCK)


# -- the packing ------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_packed_rows_hold_every_document_once_with_its_weights(reduction: str) -> None:
    tokens, lengths = _batch()
    n = np.minimum(lengths - 1, BLOCK)
    rows, lens, pos, weights = pack_batch(tokens, lengths, BLOCK, reduction)
    r, t = pos.shape
    assert rows.shape == (r, t + 1) and weights.shape == (r, t) and lens.shape == (r,)
    assert r < len(lengths) and t <= BLOCK and np.all(lens - 1 <= t)
    # each document is a run of positions 0..n-1 in one row, its tokens and targets its own
    found = []
    for b in range(r):
        starts = np.flatnonzero(pos[b, : lens[b] - 1] == 0)
        ends = [*starts[1:], lens[b] - 1]
        for a, e in zip(starts, ends, strict=True):
            np.testing.assert_array_equal(pos[b, a:e], np.arange(e - a))
            found.append(tuple(rows[b, a : e + 1]))
        assert np.all(weights[b, lens[b] - 1 :] == 0) and np.all(pos[b, lens[b] - 1 :] == 0)
    want = sorted(tuple(tokens[i, : n[i] + 1]) for i in range(len(n)))
    assert sorted(found) == want
    # the cut document (no closing BOS) has a row of its own
    long_row = [b for b in range(r) if len(np.flatnonzero(pos[b] == 0)) == 1 and lens[b] > BLOCK]
    assert len(long_row) == 1
    # the weights: 1 / (n·B) per prediction for "mean", 1 / Σn for "token_mean"
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    if reduction == "token_mean":
        assert set(np.unique(weights[weights > 0])) == {1.0 / n.sum()}
    # padding counted on the packed rows' lengths
    computed, useful = padding(lens, BLOCK)
    assert (computed, useful) == (r * t, int(n.sum()))
    assert useful / computed > padding(lengths, BLOCK)[1] / padding(lengths, BLOCK)[0]
    # a fixed width (a compiled run's one shape): rows of block_size inputs
    fixed = pack_batch(tokens, lengths, BLOCK, reduction, width=BLOCK)
    assert fixed[2].shape[1] == BLOCK and fixed[0].shape[1] == BLOCK + 1


@pytest.mark.parametrize(
    ("name", "batch", "block"), [("names.txt", 32, None), ("shakespeare.txt", 12, 64)]
)
def test_packing_leaves_at_most_15_percent_padding(name: str, batch: int, block: Any) -> None:
    """Issue 33: the shuffle's batches of names.txt (spec model) and Shakespeare's lines
    (block 64), 200 steps: a third padding unpacked, at most 15% packed."""
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    docs = read_docs(path)
    block = block or default_block_size(docs)
    tokens, lengths = encode_docs(Tokenizer.from_docs(docs), docs, block)
    before, after = np.zeros(2), np.zeros(2)
    for step in range(200):
        tok, lens = take_batch(tokens, lengths, batch_indices(len(lengths), batch, step, 0))
        before += padding(lens, block)
        after += padding(pack_batch(tok, lens, block)[1], block)
    assert before[1] == after[1]  # the same predictions
    assert 1 - before[1] / before[0] > 0.3
    assert 1 - after[1] / after[0] <= 0.15


# -- the model on a packed batch --------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_packed_loss_and_gradients_equal_the_unpacked(backend: Any, reduction: str) -> None:
    params = params_on(backend, CONFIG, 3)
    tokens, lengths = _batch()
    ints = lambda a: backend.asarray(a, "int64")  # noqa: E731
    want_loss, want = loss_and_grads(params, ints(tokens), ints(lengths), reduction=reduction)
    rows, lens, pos, weights = pack_batch(tokens, lengths, BLOCK, reduction)
    loss, grads = loss_and_grads(
        params, ints(rows), ints(lens), positions=ints(pos), weights=backend.asarray(weights)
    )
    assert _xp.backend_of(loss) == backend.name and grads.backend == params.backend
    np.testing.assert_allclose(_xp.to_numpy(loss), _xp.to_numpy(want_loss), rtol=1e-13)
    for name, g in grads.arrays().items():
        np.testing.assert_allclose(
            _xp.to_numpy(g), _xp.to_numpy(getattr(want, name)), rtol=1e-10, atol=1e-15, err_msg=name
        )
    # a step on it: train_step passes the packed batch through
    state = mx.adam_init(params)
    _, _, step_loss = mx.train_step(
        params, state, ints(rows), ints(lens), positions=ints(pos), weights=backend.asarray(weights)
    )
    np.testing.assert_allclose(_xp.to_numpy(step_loss), _xp.to_numpy(loss), rtol=1e-15)


def test_a_packed_batch_is_checked() -> None:
    params = mx.init_params(CONFIG, dtype="float64")
    tokens, lengths = _batch()
    rows, lens, pos, weights = pack_batch(tokens, lengths, BLOCK)
    with pytest.raises(ArgumentValueError, match="needs weights") as info:
        loss_and_grads(params, rows, lens, positions=pos)
    assert info.value.param == "weights"
    with pytest.raises(ArgumentValueError, match="shape") as info:
        loss_and_grads(params, rows, lens, positions=pos[:, :-1], weights=weights)
    assert info.value.param == "positions"
    with pytest.raises(ArgumentValueError, match="float64") as info:
        loss_and_grads(params, rows, lens, positions=pos, weights=weights.astype("float32"))
    assert info.value.param == "weights"
    bad = pos.copy()
    bad[0, 0] = 1  # position 1 at the row's first token: there is no token before it
    with pytest.raises(ArgumentValueError, match="count up") as info:
        loss_and_grads(params, rows, lens, positions=bad, weights=weights)
    assert info.value.param == "positions"
    with pytest.raises(ArgumentValueError, match="token_mean") as info:
        pack_batch(tokens, lengths, BLOCK, "sum")
    assert info.value.param == "reduction"


def _attention_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    b, t, c = 3, 9, 12
    qkv = rng.standard_normal((b, t, 3 * c))
    pos = np.array([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7, 8], [0] * 9])
    return qkv, pos, rng.standard_normal((b, t, c))


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_an_override_confines_attention_as_the_generic_code(library: str) -> None:
    """NumPy's and PyTorch's packed attention (forward and backward) against the generic
    ``__wrapped__`` code, and that against attention of each document alone."""
    qkv, pos, dy = _attention_case()
    move = (lambda a: a) if library == "numpy" else pytest.importorskip("torch").from_numpy
    y, cache = P.causal_attention(move(qkv), 3, 4, doc_positions=move(pos))
    want_y, want_cache = P.causal_attention.__wrapped__(move(qkv), 3, 4, doc_positions=move(pos))
    np.testing.assert_allclose(_xp.to_numpy(y), _xp.to_numpy(want_y), rtol=1e-12, atol=1e-14)
    dqkv = P.causal_attention_backward(move(dy), cache)
    want_d = P.causal_attention_backward.__wrapped__(move(dy), want_cache)
    np.testing.assert_allclose(_xp.to_numpy(dqkv), _xp.to_numpy(want_d), rtol=1e-12, atol=1e-14)
    # row 0 holds documents at 0..2, 3..4 and 5..8: each as its own unpacked row
    for a, e in ((0, 3), (3, 5), (5, 9)):
        alone, _ = P.causal_attention.__wrapped__(qkv[:1, a:e], 3, 4)
        np.testing.assert_allclose(_xp.to_numpy(y)[:1, a:e], alone, rtol=1e-12, atol=1e-14)


# -- training ---------------------------------------------------------------------------------
ARGS: dict[str, Any] = dict(steps=6, batch_size=9, seed=2, dtype="float64", config=CONFIG, lr=0.05)


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_a_packed_run_follows_the_unpacked_run(reduction: str) -> None:
    plain = mx.train(DOCS, reduction=reduction, **ARGS)
    packed = mx.train(DOCS, reduction=reduction, pack=True, **ARGS)
    np.testing.assert_allclose(packed.losses, plain.losses, rtol=1e-12)
    for name, a in packed.params.arrays().items():
        np.testing.assert_allclose(a, getattr(plain.params, name), rtol=1e-9, atol=1e-12)


def test_a_packed_run_resumes_bit_for_bit_and_only_packed(tmp_path: Path) -> None:
    full = mx.train(DOCS, pack=True, **ARGS)
    path = tmp_path / "run.ckpt"

    def stop_at_3(step: int, loss: float) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mx.train(DOCS, pack=True, checkpoint=path, callback=stop_at_3, **ARGS)
    assert load(path).step == 3 and load(path).meta["run"]["pack"] is True
    with pytest.raises(ResumeError) as info:
        mx.train(DOCS, checkpoint=path, resume=True, **ARGS)
    assert (info.value.option, info.value.saved, info.value.given) == ("pack", True, False)
    resumed = mx.train(DOCS, pack=True, checkpoint=path, resume=True, **ARGS)
    assert resumed.losses == full.losses[3:]
    for name, a in resumed.params.arrays().items():
        np.testing.assert_array_equal(a, getattr(full.params, name))
    # an unpacked run's record is as it was (no "pack" key), and refuses a packed resume
    plain = tmp_path / "plain.ckpt"
    mx.train(DOCS, checkpoint=plain, **{**ARGS, "steps": 2})
    assert "pack" not in load(plain).meta["run"]
    with pytest.raises(ResumeError, match="pack"):
        mx.train(DOCS, pack=True, checkpoint=plain, resume=True, **{**ARGS, "steps": 2})


def test_text_refuses_pack_and_pack_is_a_bool() -> None:
    with pytest.raises(ArgumentValueError, match="stream") as info:
        mx.train(text="to be or not to be, " * 20, pack=True, steps=1, batch_size=2)
    assert info.value.param == "pack"
    with pytest.raises(TypeError, match="pack") as type_info:
        mx.train(DOCS, pack=1, **ARGS)  # type: ignore[arg-type]
    assert type_info.value.param == "pack"  # type: ignore[attr-defined]


def test_dask_packed_steps_equal_numpy_and_repeat_bit_for_bit() -> None:
    pytest.importorskip("dask")
    ref = mx.train(DOCS, pack=True, **ARGS)
    one = mx.train(DOCS, pack=True, backend="dask", **ARGS)
    assert one.losses == ref.losses  # one chunk: NumPy's arithmetic, bit for bit
    chunked = mx.train(DOCS, pack=True, backend="dask", chunk_size=2, **ARGS)
    np.testing.assert_allclose(chunked.losses, ref.losses, rtol=1e-12)
    again = mx.train(DOCS, pack=True, backend="dask", chunk_size=2, **ARGS)
    assert again.losses == chunked.losses


def _chunk_tasks_seen(dask_scheduler: Any) -> int:
    """Training-chunk tasks the scheduler has seen (as tests/test_dask_steps.py counts)."""
    return sum("microgpt-chunk" in str(msg) for msg in dask_scheduler.transition_log)


def test_a_cluster_gives_the_threads_bits_for_packed_rows() -> None:
    """The same packed run's chunks on a cluster of two processes: the threads' bits."""
    pytest.importorskip("distributed")
    import cloudpickle

    from microgpt_xp.cluster import connect

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    threads = mx.train(DOCS, pack=True, backend="dask", chunk_size=2, **ARGS)
    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=60) as c:
        on_cluster = mx.train(DOCS, pack=True, backend="dask", chunk_size=2, **ARGS)
        ran = c.run_on_scheduler(_chunk_tasks_seen)
    assert ran >= ARGS["steps"] * 2  # the chunk tasks ran on the cluster
    assert on_cluster.losses == threads.losses
    for name, a in on_cluster.params.arrays().items():
        np.testing.assert_array_equal(_xp.to_numpy(a), _xp.to_numpy(getattr(threads.params, name)))


def test_worker_processes_split_packed_rows() -> None:
    ref = mx.train(DOCS, pack=True, **ARGS)
    shared = mx.train(DOCS, pack=True, workers=2, **ARGS)
    np.testing.assert_allclose(shared.losses, ref.losses, rtol=1e-12)


# -- the command ------------------------------------------------------------------------------
def test_the_cli_packs_and_refuses_pack_with_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "docs.txt"
    data.write_text("\n".join(DOCS[:40]) + "\n")
    ckpt = tmp_path / "run.ckpt"
    argv = ["train", "--data", data, "--steps", 3, "--batch-size", 8, "--num-samples", 0]
    assert main([str(a) for a in [*argv, "--pack", "--checkpoint", ckpt]]) == 0
    assert load(ckpt).meta["run"]["pack"] is True
    capsys.readouterr()
    assert main([str(a) for a in [*argv, "--checkpoint", ckpt, "--resume"]]) != 0
    assert "--pack" in capsys.readouterr().err
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question " * 10)
    assert main(["train", "--text", str(text), "--pack", "--steps", "1"]) != 0
    err = capsys.readouterr().err
    assert "--pack" in err and "stream" in err

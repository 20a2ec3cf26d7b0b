"""Nothing leaks, nothing lies: a float32 loss that stays the true loss, damaged files and
bad inputs that fail with one clear error, and files written with the usual mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ref_state
from xp_testing import params_on, raises_about, xp_assert_close

import microgpt_xp as mx
from microgpt_xp.checkpoint import CheckpointError
from microgpt_xp.params import Params

DOCS = ["abc", "bca", "cab", "aab", "bbc", "cca"]
TOKENIZER = mx.Tokenizer.from_docs(DOCS)
CONFIG = mx.GPTConfig(TOKENIZER.vocab_size, n_layer=1, n_embd=8, n_head=2, block_size=6)
GAP_CONFIG = mx.GPTConfig(vocab_size=7, n_layer=1, n_embd=8, n_head=2, block_size=6)


# -- the loss ---------------------------------------------------------------------------------
def _gap_params(backend: Any, dtype: str, gap: float) -> Params:
    """Weights (attention and MLP off) whose logits put every target ``gap`` below the max."""
    state = {k: np.zeros_like(np.asarray(v)) for k, v in ref_state(GAP_CONFIG, 0).items()}
    state["wte"][:, 0] = 1.0  # every hidden state is rmsnorm(e₀) ≈ sqrt(8)·e₀
    state["lm_head"][0, 0] = gap / np.sqrt(GAP_CONFIG.n_embd)  # id 0: the favourite
    return params_on(backend, GAP_CONFIG, state, dtype)


def test_float32_loss_is_the_true_loss_past_the_underflow(backend: Any) -> None:
    # the targets' logit is 120 below id 0's: exp(-120) underflows in float32; the loss is ~120
    tokens = np.array([[6, 1, 2, 3, 4, 5, 6], [6, 2, 2, 6, 0, 0, 0]])
    lengths = np.array([7, 4])
    losses = {}
    for dtype in ("float64", "float32"):
        params = _gap_params(backend, dtype, 120.0)
        tok = backend.asarray(tokens, "int64")
        lens = backend.asarray(lengths, "int64")
        loss, grads = mx.loss_and_grads(params, tok, lens)
        losses[dtype] = loss
        for name in ("wte", "lm_head"):
            assert np.isfinite(backend.to_numpy(getattr(grads, name))).all(), name
        scores = mx.score(params, tok, lens)
        assert np.isfinite(backend.to_numpy(scores)).all()
    want = float(backend.to_numpy(losses["float64"]))
    assert 119.0 < want < 122.0
    xp_assert_close(losses["float32"], want, rtol=2e-7, like=losses["float32"])


# -- checkpoints ------------------------------------------------------------------------------
def _checkpoint(tmp_path: Path) -> Path:
    result = mx.train(DOCS, steps=2, batch_size=2, config=CONFIG, dtype="float64")
    path = tmp_path / "run.ckpt"
    mx.save(path, result.params, adam=result.adam, step=2, tokenizer=result.tokenizer)
    return path


def test_every_damaged_byte_is_a_checkpoint_error(tmp_path: Path) -> None:
    """One bit flipped in each byte: the file loads as saved or is refused, nothing else."""
    path = _checkpoint(tmp_path)
    good = path.read_bytes()
    want = mx.load(path)
    damaged = tmp_path / "damaged.ckpt"
    refused = 0
    for i in range(len(good)):
        raw = bytearray(good)
        raw[i] ^= 1 << (i % 8)
        damaged.write_bytes(bytes(raw))
        try:
            got = mx.load(damaged)
        except CheckpointError:
            refused += 1
            continue
        assert got.step == want.step and got.tokenizer == want.tokenizer, i
        assert got.meta == want.meta and got.config == want.config, i
        for name, a in got.params.arrays().items():
            np.testing.assert_array_equal(a, getattr(want.params, name), err_msg=f"byte {i}")
    assert refused > 0.9 * len(good)


def test_non_finite_weights_are_refused_at_the_edges(tmp_path: Path) -> None:
    state = {k: np.asarray(v) for k, v in ref_state(CONFIG, 0).items()}
    for bad in (np.nan, np.inf):
        broken = dict(state, wpe=np.where(np.eye(6, 8) == 1, bad, state["wpe"]))
        with pytest.raises(ValueError, match=r"'wpe'.*not finite"):
            Params.from_state_dict(broken, config=CONFIG)
    # a file whose checksums are right but whose weights are not finite
    params = Params.from_state_dict(state, config=CONFIG, dtype="float64")
    nan = params.map(lambda a: a * np.nan)
    mx.save(tmp_path / "nan.ckpt", nan)
    with pytest.raises(CheckpointError, match="non-finite"):
        mx.load(tmp_path / "nan.ckpt")
    with pytest.raises(ValueError, match="not finite"):
        mx.train(DOCS, steps=1, batch_size=2, config=CONFIG, params=nan)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_are_written_with_the_umask_mode(tmp_path: Path, umask: int) -> None:
    from microgpt_xp._files import atomic_write  # what every file the library writes goes through

    params = mx.init_params(CONFIG)
    old = os.umask(umask)
    try:
        mx.save(tmp_path / "a.ckpt", params)
        atomic_write(tmp_path / "scores.txt", "1.5\n")
        atomic_write(tmp_path / "names.txt", "\n".join(mx.sample(params, TOKENIZER, 5)))
    finally:
        os.umask(old)
    for name in ("a.ckpt", "scores.txt", "names.txt"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == 0o666 & ~umask, (name, oct(mode))


# -- bad inputs ---------------------------------------------------------------------------
def test_an_empty_batch_is_refused(backend: Any) -> None:
    params = mx.init_params(CONFIG, backend=backend.name, device=backend.device)
    tokens = backend.asarray(np.zeros((0, 4), dtype=np.int64), "int64", chunks=-1)
    lengths = backend.asarray(np.zeros((0,), dtype=np.int64), "int64", chunks=-1)
    for call in (
        lambda: mx.loss_and_grads(params, tokens, lengths),
        lambda: mx.score(params, tokens, lengths),
        lambda: mx.forward(params, tokens),
        lambda: mx.decode_step(params, tokens[:, 0], mx.KVCache()),
    ):
        with pytest.raises(ValueError, match="empty batch"):
            call()


@pytest.mark.parametrize(
    ("call", "error", "param", "match"),
    [
        (lambda: mx.GPTConfig(vocab_size=1), ValueError, "vocab_size", "at least 2"),
        (lambda: mx.Adam(mx.init_params(CONFIG), lr="0.01"), TypeError, "lr", "a real number"),
        (lambda: mx.Adam(mx.init_params(CONFIG), eps=float("nan")), ValueError, "eps", "finite"),
    ],
)
def test_bad_hyperparameters(call: Any, error: type, param: str, match: str) -> None:
    with raises_about(error, param, match):
        call()


def test_adam_refuses_grads_that_would_change_the_params() -> None:
    params = mx.init_params(CONFIG, dtype="float32")
    adam = mx.Adam(params)
    with pytest.raises(TypeError, match="different dtypes: grads are float64, params float32"):
        adam.step(params, params.to(dtype="float64"))
    assert adam.t == 0  # nothing was taken

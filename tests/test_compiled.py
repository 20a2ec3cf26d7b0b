"""The one code path under ``jax.jit``: the records are pytrees, the pure functions
(``train_step``, ``adam_update``, ``decode_step``) compile as they are and equal the eager
NumPy computation, and ``train``/``score``/``sample`` compile once per shape where the
namespace has a compiler (``jit=None``), with the same results."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import microgpt_xp as mx
from microgpt_xp.data import batch_indices, encode_docs, take_batch
from microgpt_xp.params import FIELDS

pytestmark = pytest.mark.needs_jax
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

DOCS = mx.default_docs()[:200]
TOKENIZER = mx.Tokenizer.from_docs(DOCS)
CONFIG = mx.GPTConfig(TOKENIZER.vocab_size, n_layer=2, n_embd=8, n_head=2, block_size=12)


@pytest.fixture
def compiles() -> Iterator[list[str]]:
    """The names of the functions JAX compiles meanwhile (its compile log)."""
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith("Compiling "):  # "Compiling jit(name) with ..."
                seen.append(text.split()[1].removeprefix("jit(").removesuffix(")"))

    handler = Catch(level=logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("jax._src.interpreters.pxla", "jax._src.dispatch")]
    old_levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    with jax.log_compiles(True):
        yield seen
    for lg, level in zip(loggers, old_levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


# -- pytrees ------------------------------------------------------------------------------------
@pytest.mark.parametrize("jax_first", [True, False])
def test_records_are_pytrees_whichever_is_imported_first(jax_first: bool) -> None:
    imports = ["import jax", "import microgpt_xp as mx"]
    code = "\n".join(imports if jax_first else imports[::-1]) + textwrap.dedent(
        """
        p = mx.init_params(mx.GPTConfig(5, n_embd=4, n_head=2, block_size=3))
        q = jax.jit(lambda p: p)(p)
        assert type(q) is mx.Params and type(q.wte).__module__.startswith("jax")
        assert len(jax.tree_util.tree_leaves(p)) == 9
        doubled = jax.tree_util.tree_map(lambda a: 2 * a, p)
        assert type(doubled) is mx.Params and doubled.config == p.config
        s = mx.adam_init(p.to("jax"))
        assert len(jax.tree_util.tree_leaves(s)) == 19  # the moments of 9 weights, the step
        c = mx.KVCache.zeros(p.to("jax"), 3)
        assert type(jax.jit(lambda c: c)(c)) is mx.KVCache
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


# -- the pure step -----------------------------------------------------------------------------
def test_jitted_train_step_equals_eager_numpy() -> None:
    tokens, lengths = encode_docs(TOKENIZER, DOCS, CONFIG.block_size)
    numpy_params = mx.init_params(CONFIG, dtype="float64", seed=3)
    adam = mx.Adam(numpy_params)
    params = numpy_params.to("jax")
    state = mx.adam_init(params)
    step = jax.jit(mx.train_step)
    for s in range(5):
        tok, lens = take_batch(tokens, lengths, batch_indices(len(DOCS), 16, s, 0))
        loss_np, grads = mx.loss_and_grads(numpy_params, tok, lens)
        numpy_params = adam.step(numpy_params, grads)
        params, state, loss = step(params, state, jnp.asarray(tok), jnp.asarray(lens))
        assert float(loss) == pytest.approx(float(loss_np), rel=1e-12)
    assert int(state.step) == 5 == adam.t
    for name in FIELDS:
        got, want = np.asarray(getattr(params, name)), getattr(numpy_params, name)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
        np.testing.assert_allclose(
            np.asarray(getattr(state.m, name)), getattr(adam.m, name), rtol=1e-10, atol=1e-14
        )


def test_adam_update_compiles_once_for_every_step(compiles: list[str]) -> None:
    start = mx.init_params(CONFIG, backend="jax", dtype="float64")
    grads = start.map(lambda a: 0.1 * a + 0.01, check=False)
    update = jax.jit(mx.adam_update)
    params, state = start, mx.adam_init(start)
    for _ in range(4):
        params, state = update(params, grads, state)
    assert compiles.count("adam_update") == 1
    assert int(state.step) == 4
    # the stateful wrapper, eagerly, gives the same four updates
    adam, eager = mx.Adam(start), start
    for _ in range(4):
        eager = adam.step(eager, grads)
    for name in FIELDS:
        np.testing.assert_allclose(
            np.asarray(getattr(params, name)), np.asarray(getattr(eager, name)), rtol=1e-12
        )


# -- the drivers ---------------------------------------------------------------------------------
def _train_compiles(compiles: list[str]) -> list[int]:
    """How often train's two compiled functions compiled (loss and gradient; update)."""
    return [compiles.count(name) for name in ("_flat_loss_and_grads", "_update")]


def test_train_compiles_once_and_gives_numpy_losses(compiles: list[str]) -> None:
    args: dict[str, Any] = dict(steps=12, batch_size=8, config=CONFIG, dtype="float64", seed=2)
    want = mx.train(DOCS, **args)
    got = mx.train(DOCS, backend="jax", **args)  # batches of different lengths, one shape
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9)
    assert _train_compiles(compiles) == [1, 1]
    eager = mx.train(DOCS, backend="jax", jit=False, **args)
    np.testing.assert_allclose(eager.losses, want.losses, rtol=1e-9)
    assert _train_compiles(compiles) == [1, 1]  # jit=False compiled nothing more


def test_score_and_sample_compile_and_agree_with_numpy(compiles: list[str]) -> None:
    params = mx.train(DOCS, steps=30, batch_size=16, config=CONFIG, dtype="float64").params
    on_jax = params.to("jax")
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:40], CONFIG.block_size)
    got = mx.score(on_jax, jnp.asarray(tokens), jnp.asarray(lengths))
    np.testing.assert_allclose(np.asarray(got), mx.score(params, tokens, lengths), rtol=1e-12)
    assert compiles.count("score") == 1
    names = mx.sample(on_jax, TOKENIZER, 50, seed=4)
    assert names == mx.sample(params, TOKENIZER, 50, seed=4)
    assert compiles.count("_position") == 1  # one compilation for the batch size
    assert mx.sample(on_jax, TOKENIZER, 50, seed=4, jit=False) == names


def test_decode_step_compiles_once_for_all_positions(compiles: list[str]) -> None:
    params = mx.init_params(CONFIG, backend="jax", dtype="float64", seed=1)
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (3, CONFIG.block_size))
    step = jax.jit(mx.decode_step)
    cache = mx.KVCache.zeros(params, 3)
    logits = []
    for pos in range(CONFIG.block_size):
        out, cache = step(params, jnp.asarray(ids[:, pos]), cache)
        logits.append(np.asarray(out))
    assert compiles.count("decode_step") == 1
    full = np.asarray(mx.forward(params, jnp.asarray(ids)))
    np.testing.assert_allclose(np.stack(logits, axis=1), full, rtol=1e-12, atol=1e-13)


def test_jit_argument() -> None:
    with pytest.raises(ValueError, match="backend 'numpy' has no compiler"):
        mx.train(DOCS, steps=1, config=CONFIG, jit=True)
    with pytest.raises(TypeError, match="jit must be None, True or False"):
        mx.score(mx.init_params(CONFIG), *encode_docs(TOKENIZER, DOCS[:2], 12), jit="yes")  # type: ignore[arg-type]
    # jit=True on a namespace with a compiler is what jit=None does there
    args: dict[str, Any] = dict(steps=3, batch_size=4, config=CONFIG, dtype="float64")
    assert (
        mx.train(DOCS, backend="jax", jit=True, **args).losses
        == mx.train(DOCS, backend="jax", **args).losses
    )


def test_cli_jit_options(
    compiles: list[str], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--jit``/``--no-jit`` reach train, sample and eval: compiled by default on JAX,
    eager with ``--no-jit``, the same figures either way."""
    from microgpt_xp.cli import main

    data = tmp_path / "names.txt"
    data.write_text("\n".join(DOCS[:60]) + "\n", encoding="utf-8")
    ckpt = tmp_path / "model.npz"
    common = ["--data", data, "--steps", 4, "--batch-size", 4, "--dtype", "float64"]
    outs = {}
    for flag in ("--no-jit", "--jit"):
        argv = ["train", *common, "--backend", "jax", "--num-samples", 3, "--json", flag]
        assert main([str(a) for a in [*argv, "--checkpoint", ckpt, "--overwrite"]]) == 0
        outs[flag] = capsys.readouterr().out
        if flag == "--no-jit":
            assert _train_compiles(compiles) == [0, 0] and compiles.count("_position") == 0
    assert _train_compiles(compiles) == [1, 1] and compiles.count("_position") == 1
    eager, compiled = (json.loads(outs[f]) for f in ("--no-jit", "--jit"))
    np.testing.assert_allclose(compiled["final_loss"], eager["final_loss"], rtol=1e-9)
    assert compiled["samples"] == eager["samples"]
    got = {}
    for flag in ("--no-jit", "--jit"):
        argv = ["eval", "--checkpoint", ckpt, "--data", data, "--backend", "jax", "--json", flag]
        assert main([str(a) for a in argv]) == 0
        got[flag] = json.loads(capsys.readouterr().out)["mean_loss"]
    assert compiles.count("score") == 1
    np.testing.assert_allclose(got["--jit"], got["--no-jit"], rtol=1e-12)

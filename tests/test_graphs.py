"""Issue 32's graphs (prototype builders in ``microgpt_xp._graphs``) in onnxruntime equal
the library: ``generate`` gives ``mx.sample``'s ids, ``train_step`` NumPy's losses and
weights, with a dynamic batch."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import microgpt_xp as mx

ndx = pytest.importorskip("ndonnx")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from microgpt_xp import _graphs  # noqa: E402
from microgpt_xp.sample import decode_batch, row_uniforms  # noqa: E402

DEFAULT = mx.GPTConfig(27)
TWO = mx.GPTConfig(27, n_layer=2)


def session(model: Any) -> Any:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@functools.cache
def generate(
    config: mx.GPTConfig, dtype: str, clean: bool, drop_ended: bool = False
) -> tuple[Any, Any, Any]:
    params = mx.init_params(config, seed=1, dtype=dtype)
    model = _graphs.onnx_graph(params, "generate", clean=clean, drop_ended=drop_ended)
    return params, model, session(model)


@pytest.mark.parametrize(
    ("config", "dtype", "clean", "drop_ended"),
    [
        (DEFAULT, "float32", True, False),
        (TWO, "float32", True, False),
        (DEFAULT, "float64", False, False),
        (DEFAULT, "float32", True, True),
    ],
)
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_generate_equals_sample(
    config: mx.GPTConfig, dtype: str, clean: bool, drop_ended: bool, temperature: float
) -> None:
    params, _, sess = generate(config, dtype, clean, drop_ended)
    u = row_uniforms(5, 0, 1000, config.block_size)
    (ids,) = sess.run(
        None, {"uniforms": u.astype(dtype), "temperature": np.asarray(temperature, dtype=dtype)}
    )
    want = decode_batch(params, config.vocab_size - 1, u, 1.0 / temperature)
    assert ids.dtype == np.int64 and ids.shape == (1000, config.block_size)
    np.testing.assert_array_equal(ids, want)


def test_generate_any_batch_and_declared_shapes() -> None:
    params, model, sess = generate(DEFAULT, "float32", True)
    dims = [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch", DEFAULT.block_size]
    for b in (1, 3):
        u = row_uniforms(9, 0, b, DEFAULT.block_size)
        feed = {"uniforms": u.astype(np.float32), "temperature": np.asarray(0.7, np.float32)}
        (ids,) = sess.run(None, feed)
        np.testing.assert_array_equal(ids, decode_batch(params, 26, u, 1.0 / 0.7))


def _batches(steps: int, block_size: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of names of varying batch size and length (dynamic B and T)."""
    docs = mx.default_docs()
    tok = mx.Tokenizer.from_docs(docs)
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        b = (32, 5, 1, 17)[step % 4]
        rows = [[tok.bos, *tok.encode(docs[i]), tok.bos][: block_size + 1]
                for i in rng.integers(0, len(docs), b)]  # fmt: skip
        t = max(len(r) for r in rows)
        tokens = np.array([r + [0] * (t - len(r)) for r in rows], dtype=np.int64)
        out.append((tokens, np.array([len(r) for r in rows], dtype=np.int64)))
    return out


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-5), ("float64", 1e-10)])
def test_train_step_equals_numpy(dtype: str, tol: float) -> None:
    params = mx.init_params(DEFAULT, seed=2, dtype=dtype)
    model = _graphs.onnx_graph(params, "train_step")
    init = session(_graphs.initial_state_model(params))
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    state = dict(zip([o.name for o in init.get_outputs()], init.run(None, {}), strict=True))
    p, s = params, mx.adam_init(params)
    for tokens, lengths in _batches(100, DEFAULT.block_size, seed=3):
        res = dict(zip(names, sess.run(None, {"tokens": tokens, "lengths": lengths, **state}),
                       strict=True))  # fmt: skip
        p, s, loss = mx.train_step(p, s, tokens, lengths)
        assert abs(float(res["loss"]) - float(loss)) <= tol * abs(float(loss))
        state = {n[4:]: v for n, v in res.items() if n.startswith("new_")}
    assert int(state["adam_step"]) == 100
    for name, a in p.arrays().items():
        np.testing.assert_allclose(state[name], np.asarray(a), rtol=0, atol=1e3 * tol)

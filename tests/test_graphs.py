"""The generate and train_step graphs in onnxruntime equal the library: ``generate`` gives
``mx.sample``'s ids, ``train_step`` (from the ``train_init`` graph's state) NumPy's losses
and weights, with a dynamic batch or a fixed one; sizes past protobuf's limit and bad
arguments of every graph are refused before anything is built."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_testing import name_batches, run, session
from xp_testing import raises_about

import microgpt_xp as mx
from microgpt_xp.params import Params, field_shapes

ndx = pytest.importorskip("ndonnx")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from microgpt_xp.export import export_onnx, onnx_model  # noqa: E402
from microgpt_xp.sample import decode_batch, row_uniforms  # noqa: E402

DEFAULT = mx.GPTConfig(27)
TWO = mx.GPTConfig(27, n_layer=2)


@functools.cache
def generate(config: mx.GPTConfig, dtype: str, clean: bool) -> tuple[Any, Any, Any]:
    params = mx.init_params(config, seed=1, dtype=dtype)
    model = onnx_model(params, graph="generate", clean=clean)
    return params, model, session(model)


@pytest.mark.parametrize(
    ("config", "dtype", "clean"),
    [(DEFAULT, "float32", True), (TWO, "float32", True), (DEFAULT, "float64", False)],
)
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_generate_equals_sample(
    config: mx.GPTConfig, dtype: str, clean: bool, temperature: float
) -> None:
    params, _, sess = generate(config, dtype, clean)
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


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-5), ("float64", 1e-10)])
def test_train_step_equals_numpy(dtype: str, tol: float) -> None:
    params = mx.init_params(DEFAULT, seed=2, dtype=dtype)
    sess = session(onnx_model(params, graph="train_step"))
    state = run(session(onnx_model(params, graph="train_init")), {})
    p, s = params, mx.adam_init(params)
    for tokens, lengths in name_batches([32, 5, 1, 17] * 25, DEFAULT.block_size, seed=3):
        res = run(sess, {"tokens": tokens, "lengths": lengths, **state})
        p, s, loss = mx.train_step(p, s, tokens, lengths)
        assert abs(float(res["loss"]) - float(loss)) <= tol * abs(float(loss))
        state = {n[4:]: v for n, v in res.items() if n.startswith("new_")}
    assert int(state["adam_step"]) == 100
    for name, a in p.arrays().items():
        np.testing.assert_allclose(state[name], np.asarray(a), rtol=0, atol=1e3 * tol)


def test_train_step_every_optimizer_feature_equals_numpy() -> None:
    """Adam in the graph (traced once over the flat vectors) with every feature on: the
    clipped norm over all the weights, weight decay, warm-up, a floor; two layers (not the
    cosine decay: onnxruntime has no float64 Cos, ndonnx computes it in float32)."""
    hp = mx.AdamConfig(lr=0.02, num_steps=8, warmup=2, min_lr=0.001,
                       weight_decay=0.1, grad_clip=0.05)  # fmt: skip
    params = mx.init_params(TWO, seed=5, dtype="float64")
    sess = session(onnx_model(params, graph="train_step", optimizer=hp))
    state = run(session(onnx_model(params, graph="train_init")), {})
    p, s = params, mx.adam_init(params)
    for tokens, lengths in name_batches([6, 3, 9, 2] * 2, TWO.block_size, seed=6):
        res = run(sess, {"tokens": tokens, "lengths": lengths, **state})
        p, s, loss = mx.train_step(p, s, tokens, lengths, optimizer=hp)
        state = {n[4:]: v for n, v in res.items() if n.startswith("new_")}
        assert abs(float(res["loss"]) - float(loss)) <= 1e-10 * abs(float(loss))
    for name, a in p.arrays().items():
        np.testing.assert_allclose(state[name], np.asarray(a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state["adam_v"], np.asarray(mx.params.flatten(s.v)), rtol=1e-10)


def test_train_step_static_shapes_and_metadata(tmp_path: Path) -> None:
    params = mx.init_params(DEFAULT, seed=2)
    hp = mx.AdamConfig(lr=0.02, num_steps=50)
    path = export_onnx(params, tmp_path / "t.onnx", graph="train_step", batch=5, time=17,
                       optimizer=hp)  # fmt: skip
    sess = session(path)
    meta = sess.get_modelmeta().custom_metadata_map
    assert json.loads(meta["microgpt_xp.optimizer"]) == dataclasses.asdict(hp)
    assert sess.get_inputs()[0].shape == [5, 17]
    state = run(session(onnx_model(params, graph="train_init")), {})
    assert list(state) == [i.name for i in sess.get_inputs()][2:]
    tokens, lengths = name_batches([32, 5], DEFAULT.block_size, seed=4)[1]
    tokens = np.pad(tokens, ((0, 0), (0, 17 - tokens.shape[1])))
    loss = sess.run(["loss"], {"tokens": tokens, "lengths": lengths, **state})[0]
    want = mx.train_step(params, mx.adam_init(params), tokens, lengths, optimizer=hp)[2]
    assert abs(float(loss) - float(want)) <= 1e-5 * float(want)


def test_size_refusal(tmp_path: Path) -> None:
    """Past 2 GiB of weights, refused from the sizes alone (the arrays take no memory)."""
    big = mx.GPTConfig(27, n_layer=40, n_embd=2048, n_head=16, block_size=64)
    arrays = {k: np.broadcast_to(np.float32(0), a) for k, a in field_shapes(big).items()}
    huge = Params.trusted(big, arrays)
    path = tmp_path / "m.onnx"
    with raises_about(ValueError, "params", match="2 GiB"):
        export_onnx(huge, path, graph="generate")
    assert not path.exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "param", "match"),
    [({"params": {}}, TypeError, "params", None),
     ({"graph": "backward"}, ValueError, "graph", "choose one of forward, decode"),
     ({"tokenizer": "abc"}, TypeError, "tokenizer", None),
     ({"tokenizer": mx.Tokenizer("abc")}, ValueError, "tokenizer", "4 ids but the model 27"),
     ({"batch": 0}, ValueError, "batch", None),
     ({"time": 17}, ValueError, "time", "at most 16"),
     ({"graph": "decode", "time": 3}, ValueError, "time", "fixed by the decode graph"),
     ({"graph": "train_step", "optimizer": {"lr": 1.0}}, TypeError, "optimizer", None)],
)  # fmt: skip
def test_argument_refusals(
    tmp_path: Path, kwargs: dict[str, Any], error: Any, param: str, match: str | None
) -> None:
    path = tmp_path / "m.onnx"
    with raises_about(error, param, match=match):
        export_onnx(**{"params": mx.init_params(DEFAULT), "path": path, **kwargs})
    assert not path.exists()

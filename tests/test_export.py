"""The ONNX export: onnxruntime on the exported graphs gives NumPy's logits, for any batch
and time, and the example sampler built on the decode graph gives ``mx.sample``'s names."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_testing import ROOT, load_module, run, session
from xp_testing import xp_assert_close

import microgpt_xp as mx
from microgpt_xp.params import Params

ndx = pytest.importorskip("ndonnx")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from microgpt_xp.export import export_onnx, onnx_model  # noqa: E402

DEFAULT = mx.GPTConfig(27)
BIG = mx.GPTConfig(27, n_layer=4, n_embd=128, n_head=4, block_size=64)
#: several layers, whose caches the decode graph stacks, but quick to export
LAYERS = mx.GPTConfig(27, n_layer=3, n_embd=32, n_head=4, block_size=16)
#: the largest error allowed, relative to the largest logit
TOL = {"float32": 2e-5, "float64": 1e-10}


@functools.cache
def exported(config: mx.GPTConfig, dtype: str, graph: str) -> tuple[Params, Any, Any]:
    """``(params, model, session)``: NumPy params, their graph and an onnxruntime session."""
    params = mx.init_params(config, seed=1, dtype=dtype)
    model = onnx_model(params, graph=graph)
    return params, model, session(model)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("config", "sizes"),
    [
        *[(DEFAULT, [(b, t) for t in range(1, DEFAULT.block_size + 1)]) for b in (1, 3, 64, 1024)],
        (BIG, [(1, 64), (3, 1), (64, 33), (1024, 2)]),
    ],
    ids=["default-b1", "default-b3", "default-b64", "default-b1024", "bigger"],
)
def test_forward_equals_numpy(
    config: mx.GPTConfig, sizes: list[tuple[int, int]], dtype: str
) -> None:
    """Random rows of length ``1..t`` (the first full), padded with out-of-range ids."""
    params, _, sess = exported(config, dtype, "forward")
    for b, t in sizes:
        rng = np.random.default_rng(100 * b + t)
        lengths = rng.integers(1, t + 1, size=b)
        lengths[0] = t
        real = np.arange(t)[None, :] < lengths[:, None]
        ids = rng.integers(0, config.vocab_size, size=(b, t))
        tokens = np.where(real, ids, config.vocab_size + 5)
        (logits,) = sess.run(None, {"tokens": tokens, "lengths": lengths})
        want = mx.forward(params, tokens, lengths)
        assert logits.shape == (b, t, config.vocab_size) and want.dtype == np.dtype(dtype)
        xp_assert_close(logits[real], want[real], rtol=TOL[dtype])


def test_graphs_fix_no_batch_and_no_time() -> None:
    def shapes(model: Any) -> dict[str, list[Any]]:
        values = [*model.graph.input, *model.graph.output]
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in values}  # fmt: skip

    shape = shapes(exported(DEFAULT, "float32", "forward")[1])
    assert shape["tokens"] == ["batch", "time"] and shape["lengths"] == ["batch"]
    assert shape["logits"][2:] == [DEFAULT.vocab_size]
    assert not any(isinstance(d, int) for d in shape["logits"][:2])
    shape = shapes(exported(LAYERS, "float32", "decode")[1])
    cache = [LAYERS.block_size, LAYERS.n_embd, "batch"]
    layers = range(LAYERS.n_layer)
    assert shape == {
        "token_ids": ["batch"],
        **{f"{kind}_{i}": cache for kind in ("keys", "values") for i in layers},
        "pos": [],
        "logits": ["batch", LAYERS.vocab_size],
        **{f"new_{kind}_{i}": cache for kind in ("keys", "values") for i in layers},
        "new_pos": [],
    }


@pytest.mark.parametrize("graph", ["forward", "decode"])
def test_weights_are_initializers(graph: str) -> None:
    params, model, _ = exported(DEFAULT, "float32", graph)
    inits = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer]
    for name, weight in params.arrays().items():
        assert any(i.shape == weight.shape and np.array_equal(i, weight) for i in inits), name
    assert not [n for n in model.graph.node if n.op_type == "Constant"]


@pytest.mark.parametrize(
    ("config", "dtype"),
    [(DEFAULT, "float32"), (DEFAULT, "float64"), (LAYERS, "float64")],
    ids=["default-float32", "default-float64", "3-layers-float64"],
)
def test_decode_graph_equals_decode_step(config: mx.GPTConfig, dtype: str) -> None:
    params, _, sess = exported(config, dtype, "decode")
    rng = np.random.default_rng(3)
    b = 5
    cache = mx.KVCache()
    layers = range(config.n_layer)
    zeros = np.zeros((config.block_size, config.n_embd, b), dtype=dtype)
    feed = {
        **{f"{kind}_{i}": zeros for kind in ("keys", "values") for i in layers},
        "pos": np.array(0, dtype=np.int64),
    }
    for pos in range(config.block_size):
        ids = rng.integers(0, config.vocab_size, size=b)
        want, cache = mx.decode_step(params, ids, cache)
        got = run(sess, {**feed, "token_ids": ids})
        assert want.dtype == np.dtype(dtype)
        xp_assert_close(got["logits"], want, rtol=TOL[dtype])
        for i in layers:
            xp_assert_close(got[f"new_keys_{i}"], cache.keys[i], rtol=TOL[dtype])
            xp_assert_close(got[f"new_values_{i}"], cache.values[i], rtol=TOL[dtype])
        assert got["new_pos"].shape == () and int(got["new_pos"]) == pos + 1
        feed = {name[len("new_") :]: value for name, value in got.items() if name != "logits"}


def test_export_writes_a_standalone_file_or_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params, _, sess = exported(DEFAULT, "float32", "forward")
    tokenizer = mx.Tokenizer("abcdefghijklmnopqrstuvwxyz")
    path = tmp_path / "new" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(b"an older file")
    on_ndonnx = params.to(ndx)  # weights of another namespace, as they are
    assert export_onnx(on_ndonnx, path, tokenizer=tokenizer) == path
    assert [p.name for p in path.parent.iterdir()] == ["model.onnx"]  # no temporary left
    onnx.checker.check_model(onnx.load(path))
    loaded = session(path)
    meta = loaded.get_modelmeta().custom_metadata_map
    assert json.loads(meta["microgpt_xp.config"]) == DEFAULT.to_dict()
    assert meta["microgpt_xp.graph"] == "forward"
    assert mx.Tokenizer.from_dict(json.loads(meta["microgpt_xp.tokenizer"])) == tokenizer
    feed = {"tokens": np.array([[26, 0, 1]]), "lengths": np.array([3])}
    np.testing.assert_array_equal(loaded.run(None, feed)[0], sess.run(None, feed)[0])
    # without ndonnx (the other refusals: test_graphs.py)
    path = tmp_path / "m.onnx"
    monkeypatch.setitem(sys.modules, "ndonnx", None)  # what a missing package looks like
    with pytest.raises(ImportError, match=r"pip install 'microgpt-xp\[onnx\]'"):
        export_onnx(params, path)
    assert not path.exists()


# -- examples/onnx_sample.py ------------------------------------------------------------------
def load_example() -> Any:
    return load_module(ROOT / "examples/onnx_sample.py", "onnx_sample")


def test_onnx_sample_gives_the_names_of_mx_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    result = mx.train(steps=30, dtype="float64")  # float64: no draw within rounding of a flip
    path = export_onnx(
        result.params, tmp_path / "decode.onnx", graph="decode", tokenizer=result.tokenizer
    )
    sess = example.load_session(path)
    # 1e-306: below 1e4 / finfo(float64).max, the greedy limit
    for temperature, seed in [(0.5, 0), (1.0, 7), (1e-306, 2)]:
        names = example.sample_names(sess, 300, temperature=temperature, seed=seed, batch_size=128)
        assert names == mx.sample(
            result.params, result.tokenizer, 300, temperature=temperature, seed=seed
        )
    # onnx sample main and refusal
    example = load_example()
    _, _, sess = exported(DEFAULT, "float32", "forward")
    with pytest.raises(ValueError, match="not a decode graph"):
        example.decode_rows(sess, DEFAULT.vocab_size - 1, np.zeros((1, 16)), 0.5)
    assert example.main(["--steps", "20", "--samples", "3", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("sample ")]) == 3
    assert "the names of microgpt_xp.sample: True" in out

"""The generate graph's fast form: its ``Loop`` carries caches of an unknown number of slots,
which ndonnx's ``cache_write`` grows by one slot a position (attention over the slots seen,
no mask), and still gives ``mx.sample``'s ids for a trained model whose names end at many
lengths; buffers of a known size (the decode graph, eager arrays) keep the ``where`` write."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from onnx_testing import session

import microgpt_xp as mx
from microgpt_xp import layers as L
from microgpt_xp import primitives as P

ndx = pytest.importorskip("ndonnx")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from microgpt_xp.export import onnx_model  # noqa: E402
from microgpt_xp.sample import decode_batch, row_uniforms  # noqa: E402


@functools.cache
def trained() -> tuple[Any, Any]:
    """A model trained a little (names of 1 to ~10 characters) and its generate session."""
    params = mx.train(steps=60, dtype="float32", seed=4).params
    return params, session(onnx_model(params, graph="generate"))


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_a_trained_model_samples_as_numpy_as_rows_end_at_many_lengths(temperature: float) -> None:
    params, sess = trained()
    s = params.config.block_size
    u = row_uniforms(11, 0, 1000, s)
    feed = {"uniforms": u.astype(np.float32), "temperature": np.asarray(temperature, np.float32)}
    (ids,) = sess.run(None, feed)
    want = decode_batch(params, params.config.vocab_size - 1, u, 1.0 / temperature)
    np.testing.assert_array_equal(ids, want)
    ends = (want == params.config.vocab_size - 1).argmax(axis=1)
    assert len(set(ends.tolist())) >= 4 and ends.max() < s - 1  # the Loop stops early


def test_a_batch_of_no_rows_gives_no_ids() -> None:
    params, sess = trained()
    s = params.config.block_size
    feed = {"uniforms": np.zeros((0, s), np.float32), "temperature": np.asarray(1.0, np.float32)}
    (ids,) = sess.run(None, feed)
    assert ids.shape == (0, s) and ids.dtype == np.int64


def test_buffers_of_unknown_slots_grow_and_known_ones_are_written_in_place() -> None:
    c, b = 8, 3
    keys = ndx.argument(shape=(None, c, "batch"), dtype=ndx.float32)
    k = ndx.argument(shape=(c, "batch"), dtype=ndx.float32)
    pos = ndx.argument(shape=(), dtype=ndx.int64)
    new_keys, new_values, seen = P.cache_write(keys, keys, k, k, pos)
    assert seen is None and new_keys.shape == (None, c, None) == new_values.shape
    heads = P.slot_heads(new_keys, 2, c // 2)
    model = ndx.build({"keys": keys, "k": k, "pos": pos}, {"grown": new_keys, "heads": heads})
    rng = np.random.default_rng(0)
    old, new = rng.random((5, c, b), dtype=np.float32), rng.random((c, b), dtype=np.float32)
    grown, split = session(model).run(None, {"keys": old, "k": new, "pos": np.asarray(5)})
    np.testing.assert_array_equal(grown, np.concatenate([old, new[None]]))
    np.testing.assert_array_equal(split, grown.reshape(6, 2, c // 2, b))
    # known sizes (eager ndonnx): the generic write, a (P,) mask of the slots seen
    eager = ndx.asarray(old)
    written, _, mask = P.cache_write(eager, eager, ndx.asarray(new), ndx.asarray(new), 2)
    want = old.copy()
    want[2] = new
    np.testing.assert_array_equal(written.unwrap_numpy(), want)
    np.testing.assert_array_equal(mask.unwrap_numpy(), np.arange(5) <= 2)


def test_attention_over_every_slot_equals_the_masked_one() -> None:
    rng = np.random.default_rng(1)
    q, keys, values = (rng.standard_normal(s) for s in ((8, 3), (6, 8, 3), (6, 8, 3)))
    masked = L.decode_attention(q, keys, values, np.arange(6) <= 3, n_head=2, head_dim=4)
    shown = L.decode_attention(q, keys[:4], values[:4], None, n_head=2, head_dim=4)
    np.testing.assert_allclose(shown, masked, rtol=1e-12)

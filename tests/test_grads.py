"""Gradients of every layer and of ``loss_and_grads`` against central finite differences along
random directions (``(f(x + h u) − f(x − h u)) / 2h`` against ``<grad, u>``) and the scalar
autograd of ``tests/reference.py`` (spec §6–§7), in float64 on the ``backend``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import reference
from array_api_extra.testing import lazy_xp_function
from conftest import ref_state
from xp_testing import CONFIGS, params_on, state_dict_arrays, xp_assert_close

from microgpt_xp import GPTConfig, Params, loss_and_grads, score
from microgpt_xp import layers as L
from microgpt_xp import primitives as P

# on JAX these run under jax.jit, on Dask without a compute (conftest's backend fixture)
lazy_xp_function(loss_and_grads)
lazy_xp_function(score)

#: Directional derivatives agree with central differences to this relative error.
FD_RTOL = 1e-6
#: The array code agrees with the scalar autograd to this relative error.
REF_RTOL = 1e-12
#: Step of the central differences (O(h²) truncation, O(eps/h) rounding: both << FD_RTOL).
H = 1e-6


def check_directional(
    f: Callable[[dict[str, np.ndarray]], float],
    inputs: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    rng: np.random.Generator,
    *,
    each: bool = True,
) -> None:
    """Along 3 random directions of each input alone (``each``) or of all together, the
    central difference of the scalar ``f`` equals the directional derivative ``<grads, u>``."""
    for group in [[name] for name in inputs] if each else [list(inputs)]:
        for _ in range(3):
            u = {n: rng.standard_normal(inputs[n].shape) for n in group}
            assert all(grads[n].shape == inputs[n].shape for n in group), group
            plus = f({**inputs, **{n: inputs[n] + H * u[n] for n in group}})
            minus = f({**inputs, **{n: inputs[n] - H * u[n] for n in group}})
            fd = (plus - minus) / (2 * H)
            analytic = sum(float(np.sum(grads[n] * u[n])) for n in group)
            rel = abs(fd - analytic) / max(abs(fd), abs(analytic))
            assert rel <= FD_RTOL, f"d/d{group}: fd {fd!r} vs analytic {analytic!r} ({rel:.2e})"


def check_block(
    backend: Any,
    run: Callable[..., tuple[Any, Any]],
    backward: Callable[[Any, Any], Any],
    inputs: dict[str, np.ndarray],
    expected: np.ndarray,
    rtol: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, tuple[Any, ...]]:
    """``run`` (a block's forward of ``inputs`` on the backend in float64, in their order)
    gives ``expected``; ``backward`` of a random weight gives the directional derivatives of
    ``sum(y * weight)``. Returns the weight and the gradients (arrays of the backend)."""
    on = lambda x: [backend.asarray(x[n], "float64") for n in inputs]  # noqa: E731
    y, cache = run(*on(inputs))
    xp_assert_close(y, expected, rtol=rtol, like=on(inputs)[0], what="y")
    weight = rng.standard_normal(expected.shape)
    grads = backward(backend.asarray(weight, "float64"), cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    host = {name: backend.to_numpy(g) for name, g in zip(inputs, grads, strict=True)}
    f = lambda x: float(np.sum(backend.to_numpy(run(*on(x))[0]) * weight))  # noqa: E731
    check_directional(f, inputs, host, rng)
    return weight, grads


# -- each block alone ------------------------------------------------------------------------------
def test_embedding_block(backend: Any) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, size=(3, 4))  # ids 5, 6 of 7 are never used
    tokens[0, :2] = 3  # a repeated id: both uses add up
    # one more position than the batch uses: its row must get exactly zero gradient
    inputs = {"wte": rng.standard_normal((7, 5)), "wpe": rng.standard_normal((5, 5))}
    tok = backend.asarray(tokens, dtype="int64")
    expected = inputs["wte"][tokens] + inputs["wpe"][None, :4, :]
    run = functools.partial(L.embedding_forward, tok)
    _, (dwte, dwpe) = check_block(backend, run, L.embedding_backward, inputs, expected, 0, rng)
    assert (backend.to_numpy(dwte)[5:] == 0).all(), "unused token rows: exactly zero gradient"
    assert (backend.to_numpy(dwpe)[4:] == 0).all(), "unused position rows: exactly zero gradient"


def test_linear_and_rmsnorm_blocks(backend: Any) -> None:
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((6, 5)), "w": rng.standard_normal((4, 5))}
    expected = inputs["x"] @ inputs["w"].T
    check_block(backend, L.linear_forward, L.linear_backward, inputs, expected, 1e-15, rng)
    x = rng.standard_normal((5, 8))
    x[1] *= 0.003  # mean square ~1e-5: the eps is not negligible there
    x[2] *= 40.0
    expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    run = lambda x: L.rmsnorm_forward(x, 8)  # noqa: E731
    check_block(backend, run, L.rmsnorm_backward, {"x": x}, expected, 1e-15, rng)


def test_relu_block(backend: Any) -> None:
    rng = np.random.default_rng(3)
    # |x| >= 0.1 keeps x ± h·u on one side of the kink
    x = rng.choice([-1.0, 1.0], size=(6, 7)) * rng.uniform(0.1, 2.0, size=(6, 7))
    weight, (dx,) = check_block(
        backend, P.relu, P.relu_backward, {"x": x}, np.maximum(x, 0), 0, rng
    )
    like = backend.asarray(x, "float64")
    xp_assert_close(dx, weight * (x > 0), rtol=0, like=like, what="dx")
    # the derivative at exactly 0 is 0 (the spec's relu)
    y0, mask = P.relu(backend.asarray(np.zeros((1, 3)), "float64"))
    xp_assert_close(y0, np.zeros((1, 3)), rtol=0, like=like, what="relu(0)")
    dx0 = P.relu_backward(backend.asarray(np.ones((1, 3)), "float64"), mask)
    xp_assert_close(dx0, np.zeros((1, 3)), rtol=0, like=like, what="relu'(0)")


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """Plain softmax attention (the oracle for the forward of the block)."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        tq, tk = scores.shape[-2:]
        scores = np.where(np.tril(np.ones((tq, tk), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize(("tq", "tk", "causal"), [(5, 5, True), (1, 6, False), (3, 4, False)])
def test_attend_block(backend: Any, tq: int, tk: int, causal: bool) -> None:
    rng = np.random.default_rng(4)
    b, h, d = 2, 3, 4
    shapes = {"q": (1.5, tq), "k": (1.5, tk), "v": (1.0, tk)}
    inputs = {n: s * rng.standard_normal((b, h, t, d)) for n, (s, t) in shapes.items()}
    pos = backend.asarray(np.arange(tq), "int64")

    def run(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        return P.attention(q, k, v, P.causal_bias(pos, q.dtype) if causal else None, d)

    expected = _attention(*inputs.values(), causal)
    check_block(backend, run, P.attention_backward, inputs, expected, 1e-14, rng)


def test_causal_attention_block(backend: Any) -> None:
    rng = np.random.default_rng(5)
    b, t, n_head, c = 2, 5, 2, 6
    qkv = 1.5 * rng.standard_normal((b, t, 3 * c))
    heads = [
        np.transpose(qkv[..., i * c : (i + 1) * c].reshape(b, t, n_head, c // n_head), (0, 2, 1, 3))
        for i in range(3)
    ]
    expected = np.transpose(_attention(*heads, causal=True), (0, 2, 1, 3)).reshape(b, t, c)
    run = lambda qkv: P.causal_attention(qkv, n_head, c // n_head)  # noqa: E731
    check_block(backend, run, P.causal_attention_backward, {"qkv": qkv}, expected, 1e-14, rng)


def test_cross_entropy_block(backend: Any) -> None:
    rng = np.random.default_rng(6)
    logits, targets = 2.0 * rng.standard_normal((7, 5)), rng.integers(0, 5, size=7)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    expected = np.log(np.exp(shifted).sum(axis=-1)) - shifted[np.arange(7), targets]
    tgt = backend.asarray(targets, "int64")
    run = lambda logits: P.cross_entropy(logits, tgt, None)  # noqa: E731
    check_block(backend, run, P.cross_entropy_backward, {"logits": logits}, expected, 1e-14, rng)


# -- the whole model -------------------------------------------------------------------------------
@functools.cache
def ref_loss_and_grads(
    config: GPTConfig, seed: int, doc: tuple[int, ...]
) -> tuple[float, dict[str, np.ndarray]]:
    """The scalar autograd's loss and gradients of one document."""
    loss, grads = reference.loss_and_grads(ref_state(config, seed), list(doc), config.n_head)
    return loss, {k: np.asarray(g) for k, g in grads.items()}


def random_docs(
    rng: np.random.Generator, config: GPTConfig, lengths: list[int]
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Documents ``BOS, chars…, BOS`` (BOS = V − 1) of the given total lengths, and those."""
    bos = config.vocab_size - 1
    docs = [(bos, *(int(i) for i in rng.integers(0, bos, size=n - 2)), bos) for n in lengths]
    return docs, np.array(lengths)


def pad(docs: list[tuple[int, ...]], width: int, rng: np.random.Generator, v: int) -> np.ndarray:
    """Right-pad ``docs`` to ``width`` with random valid ids."""
    out = rng.integers(0, v, size=(len(docs), width))
    for row, doc in enumerate(docs):
        out[row, : len(doc)] = doc
    return out


def run_loss(
    backend: Any, params: Params, tokens: np.ndarray, lengths: np.ndarray, **kwargs: Any
) -> tuple[Any, Params]:
    """``loss_and_grads`` of a host batch on ``backend``: the loss (a 0-d array) and the
    gradients, both on the namespace, device and dtype of ``params``."""
    tok, lens = backend.asarray(tokens, "int64"), backend.asarray(lengths, "int64")
    loss, grads = loss_and_grads(params, tok, lens, **kwargs)
    assert tuple(loss.shape) == ()
    assert (grads.backend, str(grads.dtype)) == (params.backend, str(params.dtype))
    assert grads.config == params.config
    return loss, grads


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_single_doc_matches_reference_autograd(backend: Any, config_name: str) -> None:
    config = CONFIGS[config_name]
    params = params_on(backend, config, 1)
    close = functools.partial(xp_assert_close, rtol=REF_RTOL, like=params.wte)
    # the shortest document (BOS, BOS), a middling one and one that fills the block
    docs, _ = random_docs(np.random.default_rng(7), config, [2, 5, config.block_size + 1])
    for doc in docs:
        ref_loss, ref_grads = ref_loss_and_grads(config, 1, doc)
        loss, grads = run_loss(backend, params, np.array([doc]), np.array([len(doc)]))
        close(loss, ref_loss, what=f"loss (doc length {len(doc)})")
        got = state_dict_arrays(grads)
        assert list(got) == list(ref_grads)
        for key, g in got.items():
            close(g, ref_grads[key], what=f"d{key} (doc length {len(doc)})")


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_batch_is_the_mean_of_reference_docs(backend: Any, reduction: str) -> None:
    config = CONFIGS["two_layers"]
    rng = np.random.default_rng(8)
    docs, lengths = random_docs(rng, config, [4, config.block_size + 1, 2, 6])
    tokens = pad(docs, config.block_size + 1, rng, config.vocab_size)
    params = params_on(backend, config, 2)
    close = functools.partial(xp_assert_close, rtol=REF_RTOL, like=params.wte)
    loss, grads = run_loss(backend, params, tokens, lengths, reduction=reduction)
    refs = [ref_loss_and_grads(config, 2, d) for d in docs]
    n = np.minimum(lengths - 1, config.block_size).astype(np.float64)
    weights = np.full(len(docs), 1 / len(docs)) if reduction == "mean" else n / n.sum()
    close(loss, sum(w * r[0] for w, r in zip(weights, refs, strict=True)), what="loss")
    for key, g in state_dict_arrays(grads).items():
        expected = sum(w * r[1][key] for w, r in zip(weights, refs, strict=True))
        close(g, expected, what=f"d{key} ({reduction})")
    # the per-document losses are what score returns
    scores = score(params, backend.asarray(tokens, "int64"), backend.asarray(lengths, "int64"))
    close(scores, [r[0] for r in refs], what="score")

    # the whole model's directional derivatives agree with central differences
    def f(state: dict[str, np.ndarray]) -> float:
        params = params_on(backend, config, state)
        loss = run_loss(backend, params, tokens, lengths, reduction=reduction)[0]
        return float(backend.to_numpy(loss))

    state = {k: np.asarray(v) for k, v in ref_state(config, 2).items()}
    check_directional(f, state, grads.to_state_dict(), rng, each=False)


def test_unused_rows_get_exactly_zero_gradient(backend: Any) -> None:
    config = CONFIGS["default"]
    rng = np.random.default_rng(10)
    bos = config.vocab_size - 1
    used = [1, 4, 7, 8, 20]  # id 0 (what padding is replaced with) is not among them
    docs = [(bos, *(int(i) for i in rng.choice(used, size=n)), bos) for n in (3, 6, 1)]
    lengths = np.array([len(d) for d in docs])  # at most 8 tokens: 7 positions
    tokens = pad(docs, 10, rng, config.vocab_size)  # padding holds any valid ids
    grads = run_loss(backend, params_on(backend, config, 4), tokens, lengths)[1].to_state_dict()
    for row in range(config.vocab_size):
        assert bool(np.any(grads["wte"][row] != 0)) == (row in {bos, *used}), f"wte row {row}"
    n_max = int(lengths.max()) - 1
    assert np.all(grads["wpe"][:n_max] != 0)
    assert np.all(grads["wpe"][n_max:] == 0)


def test_padding_does_not_change_loss_or_grads(backend: Any) -> None:
    """Other padding ids of the same width: bitwise the same; wider: up to rounding."""
    config = CONFIGS["two_layers"]
    rng = np.random.default_rng(11)
    docs, lengths = random_docs(rng, config, [3, 7, 5])
    params = params_on(backend, config, 5)
    loss_a, grads_a = run_loss(backend, params, pad(docs, 7, rng, config.vocab_size), lengths)
    for width, rtol in ((7, 0.0), (9, REF_RTOL)):
        loss, grads = run_loss(backend, params, pad(docs, width, rng, config.vocab_size), lengths)
        xp_assert_close(loss, loss_a, rtol=rtol, what=f"loss, width {width}")
        for name, g in grads.arrays().items():
            xp_assert_close(g, grads_a.arrays()[name], rtol=rtol, what=f"d{name}, width {width}")


def test_padding_whose_target_probability_underflows_stays_out_of_the_loss(backend: Any) -> None:
    # Attention and MLP weights at zero leave every hidden state at rmsnorm(wte[0]) = 4·e₀,
    # so the logits are 4·lm_head[:, 0]: id 0 gets −4000 (probability exactly 0) and every
    # other id 0 (probability 1/(V−1)). Padding is fed to the model as id 0 with target
    # id 0, whose −log 0 = inf must not reach the loss (inf·0 would make it NaN).
    config = CONFIGS["two_layers"]
    state = {k: np.zeros_like(np.asarray(v)) for k, v in ref_state(config, 1).items()}
    state["wte"][:, 0] = 1.0
    state["lm_head"][0, 0] = -1000.0
    params = params_on(backend, config, state)
    close = functools.partial(xp_assert_close, rtol=1e-12, like=params.wte)
    bos = config.vocab_size - 1
    tokens = np.array([[bos, 3, 5, bos, 0, 0], [bos, 7, 1, 2, 9, bos]])
    lengths, expected = np.array([4, 6]), np.log(config.vocab_size - 1)
    loss, grads = run_loss(backend, params, tokens, lengths)
    close(loss, expected, what="loss")
    assert all(np.isfinite(g).all() for g in grads.to_state_dict().values())
    loss_t, _ = run_loss(backend, params, tokens, lengths, reduction="token_mean")
    close(loss_t, expected, what="token_mean loss")
    scores = score(params, backend.asarray(tokens, "int64"), backend.asarray(lengths, "int64"))
    close(scores, [expected, expected], what="scores", elementwise=True)

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
from xp_testing import state_dict_arrays, xp_assert_close

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

CONFIGS = {
    "default": GPTConfig(vocab_size=27),
    "two_layers": GPTConfig(vocab_size=11, n_layer=2, n_embd=8, n_head=2, block_size=8),
}


def check_directional(
    f: Callable[[dict[str, np.ndarray]], float],
    inputs: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    rng: np.random.Generator,
    *,
    n_dirs: int = 3,
) -> None:
    """For each input alone and ``n_dirs`` random directions, the central difference of the
    scalar ``f`` equals the directional derivative ``<grads[name], u>``."""
    for name, x in inputs.items():
        assert grads[name].shape == x.shape, name
        for _ in range(n_dirs):
            u = rng.standard_normal(x.shape)
            plus = f({**inputs, name: x + H * u})
            minus = f({**inputs, name: x - H * u})
            fd = (plus - minus) / (2 * H)
            analytic = float(np.sum(grads[name] * u))
            rel = abs(fd - analytic) / max(abs(fd), abs(analytic))
            assert rel <= FD_RTOL, f"d/d{name}: fd {fd!r} vs analytic {analytic!r} (rel {rel:.2e})"


def check_block(
    backend: Any,
    run: Callable[[dict[str, np.ndarray]], Any],
    grads: Any,
    inputs: dict[str, np.ndarray],
    weight: np.ndarray,
    rng: np.random.Generator,
) -> None:
    """:func:`check_directional` of ``sum(run(inputs)[0] * weight)`` against ``grads``, the
    backward's gradients (arrays of the backend) in the order of ``inputs``."""
    host = {name: backend.to_numpy(g) for name, g in zip(inputs, grads, strict=True)}
    f = lambda x: float(np.sum(backend.to_numpy(run(x)[0]) * weight))  # noqa: E731
    check_directional(f, inputs, host, rng)


# -- each block alone ------------------------------------------------------------------------------
def test_embedding_block(backend: Any) -> None:
    rng = np.random.default_rng(0)
    v, c, b, t = 7, 5, 3, 4
    tokens = rng.integers(0, 5, size=(b, t))  # ids 5, 6 are never used
    tokens[0, :2] = 3  # a repeated id: both uses add up
    # one more position than the batch uses: its row must get exactly zero gradient
    inputs = {"wte": rng.standard_normal((v, c)), "wpe": rng.standard_normal((t + 1, c))}
    weight = rng.standard_normal((b, t, c))
    tok = backend.asarray(tokens, dtype="int64")

    def run(x: dict[str, np.ndarray]) -> tuple[Any, Any]:
        wte, wpe = (backend.asarray(x[n], "float64") for n in ("wte", "wpe"))
        return L.embedding_forward(tok, wte, wpe)

    e, cache = run(inputs)
    expected = inputs["wte"][tokens] + inputs["wpe"][None, :t, :]
    like = backend.asarray(inputs["wte"], "float64")
    xp_assert_close(e, expected, rtol=0, like=like, what="embedding")
    dwte, dwpe = L.embedding_backward(backend.asarray(weight, "float64"), cache)
    assert (backend.to_numpy(dwte)[5:] == 0).all(), "unused token rows: exactly zero gradient"
    assert (backend.to_numpy(dwpe)[t:] == 0).all(), "unused position rows: exactly zero gradient"
    check_block(backend, run, (dwte, dwpe), inputs, weight, rng)


def test_linear_block(backend: Any) -> None:
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((6, 5)), "w": rng.standard_normal((4, 5))}
    weight = rng.standard_normal((6, 4))

    def run(x: dict[str, np.ndarray]) -> tuple[Any, Any]:
        return L.linear_forward(
            backend.asarray(x["x"], "float64"), backend.asarray(x["w"], "float64")
        )

    y, cache = run(inputs)
    like = backend.asarray(inputs["x"], "float64")
    xp_assert_close(y, inputs["x"] @ inputs["w"].T, rtol=1e-15, like=like, what="y")
    grads = L.linear_backward(backend.asarray(weight, "float64"), cache)
    check_block(backend, run, grads, inputs, weight, rng)


def test_rmsnorm_block(backend: Any) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 8))
    x[1] *= 0.003  # mean square ~1e-5: the eps is not negligible there
    x[2] *= 40.0
    weight = rng.standard_normal((5, 8))

    def run(d: dict[str, np.ndarray]) -> tuple[Any, Any]:
        return L.rmsnorm_forward(backend.asarray(d["x"], "float64"), x.shape[-1])

    y, cache = run({"x": x})
    expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    xp_assert_close(y, expected, rtol=1e-15, like=backend.asarray(x, "float64"), what="y")
    dx = L.rmsnorm_backward(backend.asarray(weight, "float64"), cache)
    check_block(backend, run, (dx,), {"x": x}, weight, rng)


def test_relu_block(backend: Any) -> None:
    rng = np.random.default_rng(3)
    # |x| >= 0.1 keeps x ± h·u on one side of the kink
    x = rng.choice([-1.0, 1.0], size=(6, 7)) * rng.uniform(0.1, 2.0, size=(6, 7))
    weight = rng.standard_normal((6, 7))

    def run(d: dict[str, np.ndarray]) -> tuple[Any, Any]:
        return P.relu(backend.asarray(d["x"], "float64"))

    y, cache = run({"x": x})
    like = backend.asarray(x, "float64")
    xp_assert_close(y, np.maximum(x, 0.0), rtol=0, like=like, what="y")
    dx = P.relu_backward(backend.asarray(weight, "float64"), cache)
    xp_assert_close(dx, weight * (x > 0), rtol=0, like=like, what="dx")
    check_block(backend, run, (dx,), {"x": x}, weight, rng)
    # the derivative at exactly 0 is 0 (the spec's relu)
    zeros = backend.asarray(np.zeros((1, 3)), "float64")
    y0, mask = P.relu(zeros)
    xp_assert_close(y0, np.zeros((1, 3)), rtol=0, like=zeros, what="relu(0)")
    dx0 = P.relu_backward(backend.asarray(np.ones((1, 3)), "float64"), mask)
    xp_assert_close(dx0, np.zeros((1, 3)), rtol=0, like=zeros, what="relu'(0)")


def _numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
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
    inputs = {
        "q": 1.5 * rng.standard_normal((b, h, tq, d)),
        "k": 1.5 * rng.standard_normal((b, h, tk, d)),
        "v": rng.standard_normal((b, h, tk, d)),
    }
    weight = rng.standard_normal((b, h, tq, d))

    def run(x: dict[str, np.ndarray]) -> tuple[Any, Any]:
        q, k, v = (backend.asarray(x[n], "float64") for n in ("q", "k", "v"))
        pos = backend.asarray(np.arange(tq), "int64")
        return P.attention(q, k, v, P.causal_bias(pos, q.dtype) if causal else None, d)

    y, cache = run(inputs)
    expected = _numpy_attention(inputs["q"], inputs["k"], inputs["v"], causal)
    like = backend.asarray(inputs["q"], "float64")
    xp_assert_close(y, expected, rtol=1e-14, like=like, what="attention output")
    grads = P.attention_backward(backend.asarray(weight, "float64"), cache)
    check_block(backend, run, grads, inputs, weight, rng)


def test_causal_attention_block(backend: Any) -> None:
    rng = np.random.default_rng(5)
    b, t, n_head, c = 2, 5, 2, 6
    qkv = 1.5 * rng.standard_normal((b, t, 3 * c))
    weight = rng.standard_normal((b, t, c))

    def run(d: dict[str, np.ndarray]) -> tuple[Any, Any]:
        return P.causal_attention(backend.asarray(d["qkv"], "float64"), n_head, c // n_head)

    y, cache = run({"qkv": qkv})
    heads = [
        np.transpose(qkv[..., i * c : (i + 1) * c].reshape(b, t, n_head, c // n_head), (0, 2, 1, 3))
        for i in range(3)
    ]
    expected = np.transpose(_numpy_attention(*heads, causal=True), (0, 2, 1, 3)).reshape(b, t, c)
    like = backend.asarray(qkv, "float64")
    xp_assert_close(y, expected, rtol=1e-14, like=like, what="attention output")
    dqkv = P.causal_attention_backward(backend.asarray(weight, "float64"), cache)
    check_block(backend, run, (dqkv,), {"qkv": qkv}, weight, rng)


def test_cross_entropy_block(backend: Any) -> None:
    rng = np.random.default_rng(6)
    n, v = 7, 5
    logits = 2.0 * rng.standard_normal((n, v))
    targets = rng.integers(0, v, size=n)
    dlosses = rng.uniform(0.1, 1.0, size=n)
    tgt = backend.asarray(targets, dtype="int64")

    def run(d: dict[str, np.ndarray]) -> tuple[Any, Any]:
        return P.cross_entropy(backend.asarray(d["logits"], "float64"), tgt, None)

    losses, cache = run({"logits": logits})
    shifted = logits - logits.max(axis=-1, keepdims=True)
    expected = np.log(np.exp(shifted).sum(axis=-1)) - shifted[np.arange(n), targets]
    like = backend.asarray(logits, "float64")
    xp_assert_close(losses, expected, rtol=1e-14, like=like, what="losses")
    dlogits = P.cross_entropy_backward(backend.asarray(dlosses, "float64"), cache)
    check_block(backend, run, (dlogits,), {"logits": logits}, dlosses, rng)


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
) -> list[tuple[int, ...]]:
    """Documents ``BOS, chars…, BOS`` (BOS = V − 1) of the given total lengths."""
    bos = config.vocab_size - 1
    return [(bos, *(int(i) for i in rng.integers(0, bos, size=n - 2)), bos) for n in lengths]


def pad(docs: list[tuple[int, ...]], width: int, rng: np.random.Generator, v: int) -> np.ndarray:
    """Right-pad ``docs`` to ``width`` with random valid ids."""
    out = rng.integers(0, v, size=(len(docs), width))
    for row, doc in enumerate(docs):
        out[row, : len(doc)] = doc
    return out


def params_on(backend: Any, config: GPTConfig, seed: int) -> Params:
    return Params.from_state_dict(
        ref_state(config, seed),
        config=config,
        backend=backend.name,
        device=backend.device,
        dtype="float64",
    )


def run_loss(
    backend: Any, params: Params, tokens: np.ndarray, lengths: np.ndarray, **kwargs: Any
) -> tuple[Any, Params]:
    """``loss_and_grads`` of a host batch on ``backend``: the loss (a 0-d array) and the
    gradients, both on the namespace, device and dtype of ``params``."""
    loss, grads = loss_and_grads(
        params,
        backend.asarray(tokens, dtype="int64"),
        backend.asarray(lengths, dtype="int64"),
        **kwargs,
    )
    assert tuple(loss.shape) == ()
    assert grads.backend == params.backend
    assert str(grads.dtype) == str(params.dtype)
    assert grads.config == params.config
    return loss, grads


def host_loss(
    backend: Any, params: Params, tokens: np.ndarray, lengths: np.ndarray, **kw: Any
) -> float:
    """The loss of :func:`run_loss` as a Python float (for finite differences)."""
    return float(backend.to_numpy(run_loss(backend, params, tokens, lengths, **kw)[0]))


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_single_doc_matches_reference_autograd(backend: Any, config_name: str) -> None:
    config = CONFIGS[config_name]
    rng = np.random.default_rng(7)
    params = params_on(backend, config, 1)
    # the shortest document (BOS, BOS), a middling one and one that fills the block
    for doc in random_docs(rng, config, [2, 5, config.block_size + 1]):
        ref_loss, ref_grads = ref_loss_and_grads(config, 1, doc)
        loss, grads = run_loss(backend, params, np.array([doc]), np.array([len(doc)]))
        what = f"doc length {len(doc)}"
        xp_assert_close(loss, ref_loss, rtol=REF_RTOL, like=params.wte, what=f"loss ({what})")
        got = state_dict_arrays(grads)
        assert list(got) == list(ref_grads)
        for key, g in got.items():
            xp_assert_close(
                g, ref_grads[key], rtol=REF_RTOL, like=params.wte, what=f"d{key} ({what})"
            )


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_batch_is_the_mean_of_reference_docs(backend: Any, reduction: str) -> None:
    config = CONFIGS["two_layers"]
    rng = np.random.default_rng(8)
    docs = random_docs(rng, config, [4, config.block_size + 1, 2, 6])
    lengths = np.array([len(d) for d in docs])
    tokens = pad(docs, config.block_size + 1, rng, config.vocab_size)
    params = params_on(backend, config, 2)
    loss, grads = run_loss(backend, params, tokens, lengths, reduction=reduction)
    refs = [ref_loss_and_grads(config, 2, d) for d in docs]
    n = np.minimum(lengths - 1, config.block_size).astype(np.float64)
    weights = np.full(len(docs), 1 / len(docs)) if reduction == "mean" else n / n.sum()
    expected_loss = sum(w * r[0] for w, r in zip(weights, refs, strict=True))
    xp_assert_close(loss, expected_loss, rtol=REF_RTOL, like=params.wte, what="loss")
    for key, g in state_dict_arrays(grads).items():
        expected = sum(w * r[1][key] for w, r in zip(weights, refs, strict=True))
        xp_assert_close(g, expected, rtol=REF_RTOL, like=params.wte, what=f"d{key} ({reduction})")
    # the per-document losses are what score returns
    scores = score(
        params, backend.asarray(tokens, dtype="int64"), backend.asarray(lengths, dtype="int64")
    )
    xp_assert_close(scores, [r[0] for r in refs], rtol=REF_RTOL, like=params.wte, what="score")


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_whole_model_directional_derivative(backend: Any, reduction: str) -> None:
    config = CONFIGS["two_layers"]
    rng = np.random.default_rng(9)
    docs = random_docs(rng, config, [5, config.block_size + 1, 3])
    lengths = np.array([len(d) for d in docs])
    tokens = pad(docs, config.block_size + 1, rng, config.vocab_size)
    sd = {k: np.asarray(v) for k, v in ref_state(config, 3).items()}

    def f(state: dict[str, np.ndarray]) -> float:
        p = Params.from_state_dict(
            state, config=config, backend=backend.name, device=backend.device, dtype="float64"
        )
        return host_loss(backend, p, tokens, lengths, reduction=reduction)

    _, on_backend = run_loss(
        backend, params_on(backend, config, 3), tokens, lengths, reduction=reduction
    )
    grads = on_backend.to_state_dict()
    for _ in range(3):
        u = {k: rng.standard_normal(v.shape) for k, v in sd.items()}
        plus = f({k: v + H * u[k] for k, v in sd.items()})
        minus = f({k: v - H * u[k] for k, v in sd.items()})
        fd = (plus - minus) / (2 * H)
        analytic = sum(float(np.sum(grads[k] * u[k])) for k in sd)
        rel = abs(fd - analytic) / max(abs(fd), abs(analytic))
        assert rel <= FD_RTOL, f"fd {fd!r} vs analytic {analytic!r} (rel {rel:.2e})"


def test_unused_rows_get_exactly_zero_gradient(backend: Any) -> None:
    config = CONFIGS["default"]
    rng = np.random.default_rng(10)
    bos = config.vocab_size - 1
    used = [1, 4, 7, 8, 20]  # id 0 (what padding is replaced with) is not among them
    docs = [(bos, *(int(i) for i in rng.choice(used, size=n)), bos) for n in (3, 6, 1)]
    lengths = np.array([len(d) for d in docs])  # at most 8 tokens: 7 positions
    tokens = pad(docs, 10, rng, config.vocab_size)  # padding holds any valid ids
    grads = run_loss(backend, params_on(backend, config, 4), tokens, lengths)[1].to_state_dict()
    inputs = {bos, *used}
    for row in range(config.vocab_size):
        nonzero = bool(np.any(grads["wte"][row] != 0))
        assert nonzero == (row in inputs), f"wte row {row}"
    n_max = int(lengths.max()) - 1
    assert np.all(grads["wpe"][:n_max] != 0)
    assert np.all(grads["wpe"][n_max:] == 0)


def test_padding_does_not_change_loss_or_grads(backend: Any) -> None:
    config = CONFIGS["two_layers"]
    rng = np.random.default_rng(11)
    docs = random_docs(rng, config, [3, 7, 5])
    lengths = np.array([len(d) for d in docs])
    params = params_on(backend, config, 5)
    loss_a, grads_a = run_loss(backend, params, pad(docs, 7, rng, config.vocab_size), lengths)
    loss_b, grads_b = run_loss(backend, params, pad(docs, 7, rng, config.vocab_size), lengths)
    # other padding ids of the same width: bitwise the same
    xp_assert_close(loss_b, loss_a, rtol=0, like=params.wte, what="loss")
    for name, g in grads_b.arrays().items():
        xp_assert_close(g, grads_a.arrays()[name], rtol=0, like=params.wte, what=f"d{name}")
    # wider padding: the same numbers up to rounding
    loss_c, grads_c = run_loss(backend, params, pad(docs, 9, rng, config.vocab_size), lengths)
    xp_assert_close(loss_c, loss_a, rtol=REF_RTOL, like=params.wte, what="loss, wider")
    for name, g in grads_c.arrays().items():
        xp_assert_close(
            g, grads_a.arrays()[name], rtol=REF_RTOL, like=params.wte, what=f"d{name}, wider"
        )


def test_padding_whose_target_probability_underflows_stays_out_of_the_loss(backend: Any) -> None:
    # Attention and MLP weights at zero leave every hidden state at rmsnorm(wte[0]) = 4·e₀,
    # so the logits are 4·lm_head[:, 0]: id 0 gets −4000 (probability exactly 0) and every
    # other id 0 (probability 1/(V−1)). Padding is fed to the model as id 0 with target
    # id 0, whose −log 0 = inf must not reach the loss (inf·0 would make it NaN).
    config = CONFIGS["two_layers"]
    state = {k: np.zeros_like(np.asarray(v)) for k, v in ref_state(config, 1).items()}
    state["wte"][:, 0] = 1.0
    state["lm_head"][0, 0] = -1000.0
    params = Params.from_state_dict(
        state, config=config, backend=backend.name, device=backend.device, dtype="float64"
    )
    bos = config.vocab_size - 1
    docs = [(bos, 3, 5, bos), (bos, 7, 1, 2, 9, bos)]
    lengths = np.array([len(d) for d in docs])
    tokens = np.zeros((2, 6), dtype=np.int64)
    for row, doc in enumerate(docs):
        tokens[row, : len(doc)] = doc
    expected = np.log(config.vocab_size - 1)
    loss, grads = run_loss(backend, params, tokens, lengths)
    xp_assert_close(loss, expected, rtol=1e-12, like=params.wte, what="loss")
    assert all(np.isfinite(g).all() for g in grads.to_state_dict().values())
    loss_t, _ = run_loss(backend, params, tokens, lengths, reduction="token_mean")
    xp_assert_close(loss_t, expected, rtol=1e-12, like=params.wte, what="token_mean loss")
    scores = score(
        params, backend.asarray(tokens, dtype="int64"), backend.asarray(lengths, "int64")
    )
    xp_assert_close(
        scores, [expected, expected], rtol=1e-12, like=params.wte, what="scores", elementwise=True
    )

"""The reductions that define the math — RMSNorm's mean square, softmax denominators, the
loss — never go through a matrix product where products may be computed in lower
precision (TF32 on CUDA, bfloat16 passes under JAX's default precision on GPUs and TPUs):
with every product's inputs rounded to bfloat16, they stay exact to float32."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pytest

from microgpt_xp import layers as L
from microgpt_xp import primitives as P

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((64, 16)) * 3 + 0.5).astype(np.float32)  # rows for RMSNorm
Z = (RNG.standard_normal((8, 4, 16, 16)) * 4).astype(np.float32)  # attention scores
LOGITS_T = (RNG.standard_normal((27, 96)) * 5).astype(np.float32)  # (V, N) logits
TARGETS = RNG.integers(0, 27, 96)


def _bf16_torch() -> tuple[Any, Callable[[], AbstractContextManager[Any]]]:
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    products = {torch.matmul, torch.mm, torch.bmm}
    products |= {
        getattr(torch.Tensor, n) for n in ("__matmul__", "__rmatmul__", "matmul", "mm", "bmm")
    }

    class Bfloat16Products(TorchFunctionMode):
        """Every matrix product takes its float32 inputs rounded to bfloat16, as a GPU
        in a lowered precision mode would."""

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func in products:
                args = tuple(
                    a.to(torch.bfloat16).to(a.dtype)
                    if isinstance(a, torch.Tensor) and a.dtype == torch.float32
                    else a
                    for a in args
                )
            return func(*args, **(kwargs or {}))

    return torch, Bfloat16Products


def _bf16_jax() -> tuple[Any, Callable[[], AbstractContextManager[Any]]]:
    jax = pytest.importorskip("jax")
    return jax.numpy, lambda: jax.default_matmul_precision("bfloat16")


@pytest.fixture(
    params=[
        pytest.param("torch", marks=pytest.mark.needs_torch),
        pytest.param("jax", marks=pytest.mark.needs_jax),
    ]
)
def lowered(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Callable[[Any], Any]]]:
    """``(to_backend, context)``: float32 arrays of a namespace and the context that lowers
    its products' precision."""
    if request.param == "torch":
        torch, mode = _bf16_torch()
        with mode():
            yield (lambda a: torch.from_numpy(np.ascontiguousarray(a))), (lambda x: x.numpy())
    else:
        jnp, precision = _bf16_jax()
        with precision():
            yield jnp.asarray, np.asarray


@pytest.mark.needs_torch
def test_the_products_really_are_lowered() -> None:
    """The torch mode does what it says: a product with ones loses the sum's digits."""
    torch, mode = _bf16_torch()
    x = torch.from_numpy(X)
    with mode():
        by_product = (x @ torch.ones((16, 1)))[:, 0]
    exact = x.sum(-1)
    assert float((by_product - exact).abs().max()) > 1e-3


def test_rmsnorm_is_exact_under_lowered_products(lowered: Any) -> None:
    to_backend, to_host = lowered
    y, _ = L.rmsnorm_forward(to_backend(X), X.shape[-1])
    ms = (to_host(y).astype(np.float64) ** 2).mean(axis=-1)
    want = (X.astype(np.float64) ** 2).mean(-1) / ((X.astype(np.float64) ** 2).mean(-1) + 1e-5)
    np.testing.assert_allclose(ms, want, rtol=4e-7)


def test_softmax_is_exact_under_lowered_products(lowered: Any) -> None:
    to_backend, to_host = lowered
    att = to_host(P.softmax(to_backend(Z))).astype(np.float64)
    np.testing.assert_allclose(att.sum(axis=-1), 1.0, rtol=4e-7)
    z = Z.astype(np.float64)
    want = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(att, want / want.sum(-1, keepdims=True), rtol=2e-6, atol=1e-7)


def test_the_loss_is_exact_under_lowered_products(lowered: Any) -> None:
    to_backend, to_host = lowered
    losses, _ = P.cross_entropy(to_backend(LOGITS_T.T), to_backend(TARGETS), None)
    z = LOGITS_T.astype(np.float64)
    top = z.max(axis=0)
    want = np.log(np.exp(z - top).sum(axis=0)) + top - z[TARGETS, np.arange(z.shape[1])]
    np.testing.assert_allclose(to_host(losses), want, rtol=4e-6, atol=4e-7)

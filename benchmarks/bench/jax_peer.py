"""The same GPT in ``jax.numpy`` (the architecture of :mod:`.torch_peer`), trained by
``jax.value_and_grad`` and microgpt's Adam under one ``jax.jit``: the peer of our compiled
step on JAX. Imported only with JAX."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from microgpt_xp.config import GPTConfig

Weights = dict[str, Any]


def _rmsnorm(x: Any) -> Any:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)


def logits(w: Weights, idx: Any, config: GPTConfig) -> Any:
    """``idx (B, T)`` -> logits ``(B, T, V)``."""
    (b, t), c, h, d = idx.shape, config.n_embd, config.n_head, config.head_dim
    x = _rmsnorm(w["wte"][idx] + w["wpe"][:t])
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    for layer in range(config.n_layer):
        qkv = _rmsnorm(x) @ w["wqkv"][layer].T
        q, k, v = (z.reshape(b, t, h, d).transpose(0, 2, 1, 3) for z in jnp.split(qkv, 3, -1))
        att = jnp.where(mask, (q @ k.transpose(0, 1, 3, 2)) * d**-0.5, -jnp.inf)
        y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        x = x + y @ w["wo"][layer].T
        x = x + jax.nn.relu(_rmsnorm(x) @ w["fc1"][layer].T) @ w["fc2"][layer].T
    return x @ w["lm_head"].T


def _nll(w: Weights, tokens: Any, config: GPTConfig) -> Any:
    logp = jax.nn.log_softmax(logits(w, tokens[:, :-1], config), axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


class JaxGPT:
    """microgpt in ``jax.numpy`` with ``jax.value_and_grad``. ``host`` holds layer-stacked
    NumPy weights with the ``Params`` field names, so that the peer starts from the same
    numbers as ours; ``device`` a JAX device (``None``: the default)."""

    def __init__(
        self,
        host: Mapping[str, np.ndarray],
        config: GPTConfig,
        dtype: str = "float32",
        *,
        lr: float = 0.01,
        device: Any = None,
    ) -> None:
        if dtype == "float64":
            jax.config.update("jax_enable_x64", True)  # as microgpt_xp does for its arrays
        put = lambda a: jax.device_put(jnp.asarray(np.asarray(a), dtype=dtype), device)  # noqa: E731
        names = {
            "wte": "wte",
            "wpe": "wpe",
            "lm_head": "lm_head",
            "wo": "attn_wo",
            "fc1": "mlp_fc1",
            "fc2": "mlp_fc2",
        }
        self.initial: Weights = {k: put(host[v]) for k, v in names.items()}
        self.initial["wqkv"] = put(
            np.concatenate([host["attn_wq"], host["attn_wk"], host["attn_wv"]], 1)
        )
        self.w, self.t = self.initial, jnp.asarray(0)
        self.m = self.v = jax.tree_util.tree_map(jnp.zeros_like, self.w)
        b1, b2, eps, tree_map = 0.85, 0.99, 1e-8, jax.tree_util.tree_map

        def step(w: Weights, m: Weights, v: Weights, t: Any, tokens: Any) -> Any:
            loss, g = jax.value_and_grad(lambda w: jnp.mean(_nll(w, tokens, config)))(w)
            m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
            v = tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
            bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
            w = tree_map(lambda p, m, v: p - lr * (m / bc1) / ((v / bc2) ** 0.5 + eps), w, m, v)
            return w, m, v, t + 1, loss

        self._step = jax.jit(step)
        self._score = jax.jit(lambda w, tokens: jnp.mean(_nll(w, tokens, config), axis=1))

    def reset(self) -> None:
        """Back to the initial weights (the optimizer state is kept)."""
        self.w = self.initial

    def train_step(self, tokens: Any) -> float:
        """Loss, gradients and one Adam update on ``tokens (B, T+1)``, compiled; the loss."""
        self.w, self.m, self.v, self.t, loss = self._step(self.w, self.m, self.v, self.t, tokens)
        return float(loss)

    def score(self, tokens: Any) -> Any:
        """Per-document mean NLL ``(B,)`` of ``tokens (B, T+1)``, compiled."""
        return self._score(self.w, tokens)

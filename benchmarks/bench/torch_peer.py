"""The same GPT in PyTorch eager (CPU or CUDA), written as nanoGPT writes it: one leaf
tensor per weight, fused ``q|k|v`` ``F.linear``, a causal mask, ``F.cross_entropy``,
autograd and ``torch.optim.Adam``. The spec's architecture: token + position embedding,
RMSNorm, per block RMSNorm -> causal attention (no biases) -> residual, RMSNorm -> fc1 ->
ReLU -> fc2 -> residual, ``lm_head`` without a final norm. Imported only with torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from microgpt_xp.config import GPTConfig


def _rmsnorm(x: torch.Tensor) -> torch.Tensor:
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()


class TorchGPT:
    """microgpt in PyTorch eager from ``host``, layer-stacked NumPy weights with the
    ``Params`` field names (the same numbers as ours), with masked matmul attention (the
    same work as ours); ``device``: a torch device, where inputs go."""

    def __init__(
        self,
        host: Mapping[str, np.ndarray],
        config: GPTConfig,
        dtype: str = "float32",
        *,
        lr: float = 0.01,
        device: str = "cpu",
    ) -> None:
        self.config, self.device = config, torch.device(device)

        def leaf(a: np.ndarray) -> torch.Tensor:
            return torch.tensor(
                np.asarray(a), dtype=getattr(torch, dtype), device=self.device
            ).requires_grad_()

        self.wte, self.wpe, self.lm_head = (leaf(host[k]) for k in ("wte", "wpe", "lm_head"))
        self.layers = [
            (
                leaf(np.concatenate([host["attn_wq"][i], host["attn_wk"][i], host["attn_wv"][i]])),
                *(leaf(host[k][i]) for k in ("attn_wo", "mlp_fc1", "mlp_fc2")),
            )
            for i in range(config.n_layer)
        ]
        self.params = [self.wte, self.wpe, self.lm_head] + [w for ws in self.layers for w in ws]
        self.opt = torch.optim.Adam(self.params, lr=lr, betas=(0.85, 0.99), eps=1e-8)
        self._initial = [p.detach().clone() for p in self.params]
        self.mask = torch.ones(
            config.block_size, config.block_size, dtype=torch.bool, device=self.device
        ).tril()

    def reset(self) -> None:
        """Back to the initial weights (the optimizer state is kept)."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self._initial, strict=True):
                p.copy_(p0)

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx (B, T)`` int64 -> logits ``(B, T, V)``."""
        idx, c, h = idx.to(self.device), self.config.n_embd, self.config.n_head
        b, t = idx.shape
        x = _rmsnorm(self.wte[idx] + self.wpe[:t])
        for wqkv, wo, fc1, fc2 in self.layers:
            q, k, v = F.linear(_rmsnorm(x), wqkv).split(c, dim=-1)
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * ((c // h) ** -0.5)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
            x = x + F.linear(y, wo)
            x = x + F.linear(F.relu(F.linear(_rmsnorm(x), fc1)), fc2)
        return F.linear(x, self.lm_head)

    def loss(self, tokens: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy of full-length documents ``tokens (B, T+1)``: the mean, or with
        ``reduction="none"`` each token's ``(B * T,)``."""
        tokens = tokens.to(self.device)
        logits = self.logits(tokens[:, :-1])
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction=reduction
        )

    def train_step(self, tokens: torch.Tensor) -> float:
        """Forward, backward and one Adam step on ``tokens (B, T+1)``; returns the loss."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(tokens)
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def score(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-document mean NLL ``(B,)`` of ``tokens (B, T+1)``, without autograd."""
        with torch.no_grad():
            return self.loss(tokens, reduction="none").view(tokens.shape[0], -1).mean(dim=1)

    def decode(self, u: torch.Tensor, bos: int, temperature: float = 0.5) -> torch.Tensor:
        """Sample ``u.shape[1]`` tokens for ``u.shape[0]`` sequences from BOS with a KV cache
        that grows by concatenation; the draw is the inverse CDF of ``u (B, steps)`` as in
        :func:`microgpt_xp.sample.choose`. Returns the ``(B, steps)`` int64 ids."""
        u, (b, steps), c, h = u.to(self.device), u.shape, self.config.n_embd, self.config.n_head
        with torch.inference_mode():
            token = torch.full((b,), bos, dtype=torch.int64, device=self.device)
            keys: list[Any] = [None] * self.config.n_layer
            values: list[Any] = [None] * self.config.n_layer
            out = []
            for pos in range(steps):
                x = _rmsnorm(self.wte[token] + self.wpe[pos])
                for i, (wqkv, wo, fc1, fc2) in enumerate(self.layers):
                    q, k, v = F.linear(_rmsnorm(x), wqkv).split(c, dim=-1)
                    q, k, v = (z.view(b, h, 1, c // h) for z in (q, k, v))
                    keys[i] = k if pos == 0 else torch.cat([keys[i], k], dim=2)
                    values[i] = v if pos == 0 else torch.cat([values[i], v], dim=2)
                    att = (q @ keys[i].transpose(-2, -1)) * ((c // h) ** -0.5)
                    y = (att.softmax(dim=-1) @ values[i]).reshape(b, c)
                    x = x + F.linear(y, wo)
                    x = x + F.linear(F.relu(F.linear(_rmsnorm(x), fc1)), fc2)
                probs = (F.linear(x, self.lm_head) * (1.0 / temperature)).softmax(dim=-1)
                cdf = probs.cumsum(dim=-1)
                token = (cdf[:, :-1] <= (u[:, pos] * cdf[:, -1])[:, None]).sum(dim=-1)
                out.append(token)
            return torch.stack(out, dim=1)

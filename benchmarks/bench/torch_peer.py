"""The same GPT in PyTorch eager (on the CPU, or a CUDA GPU): the benchmark's strong peer.

Written as a PyTorch user would write it (nanoGPT style): one leaf tensor per weight,
a fused ``q|k|v`` projection, ``F.linear``, a registered causal mask, ``F.cross_entropy``
and ``torch.optim.Adam``; autograd does the backward pass. The architecture is the
spec's: token + position embedding, RMSNorm before the blocks, per block RMSNorm →
causal multi-head attention (scale ``1/sqrt(head_dim)``, no biases) → residual, RMSNorm
→ fc1 → ReLU → fc2 → residual, ``lm_head`` (no final norm), mean cross-entropy.

Only imported when torch is installed (``pip install 'microgpt-xp[bench]'``).
"""

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
    """microgpt in PyTorch eager. ``host`` holds layer-stacked NumPy weights with the
    ``Params`` field names (``wte (V, C)``, ``attn_wq (L, C, C)``, …), so that the peer starts
    from the same numbers as the array model. ``attention`` is ``"manual"`` (matmul,
    masked softmax, matmul: the same work as ours) or ``"sdpa"``
    (``F.scaled_dot_product_attention(is_causal=True)``). ``device`` is a torch device
    (``"cpu"``, ``"cuda:0"``); inputs given to the methods are moved there."""

    def __init__(
        self,
        host: Mapping[str, np.ndarray],
        config: GPTConfig,
        dtype: str = "float32",
        *,
        lr: float = 0.01,
        attention: str = "manual",
        device: str = "cpu",
    ) -> None:
        if attention not in ("manual", "sdpa"):
            raise ValueError(f"attention must be 'manual' or 'sdpa', got {attention!r}")
        self.config, self.attention = config, attention
        self.device = torch.device(device)
        tdtype = getattr(torch, dtype)

        def leaf(a: np.ndarray) -> torch.Tensor:
            return torch.tensor(np.asarray(a), dtype=tdtype, device=self.device).requires_grad_()

        self.wte, self.wpe, self.lm_head = (
            leaf(host["wte"]),
            leaf(host["wpe"]),
            leaf(host["lm_head"]),
        )
        self.layers = []
        for i in range(config.n_layer):
            qkv = np.concatenate([host["attn_wq"][i], host["attn_wk"][i], host["attn_wv"][i]])
            self.layers.append(
                (
                    leaf(qkv),
                    leaf(host["attn_wo"][i]),
                    leaf(host["mlp_fc1"][i]),
                    leaf(host["mlp_fc2"][i]),
                )
            )
        self.params = [self.wte, self.wpe, self.lm_head] + [w for ws in self.layers for w in ws]
        self.opt = torch.optim.Adam(self.params, lr=lr, betas=(0.85, 0.99), eps=1e-8)
        self._initial = [p.detach().clone() for p in self.params]
        t = config.block_size
        self.mask = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()

    def reset(self) -> None:
        """Back to the initial weights (the optimizer state is kept)."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self._initial, strict=True):
                p.copy_(p0)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        if self.attention == "sdpa":
            y: torch.Tensor = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y
        att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        out: torch.Tensor = att.softmax(dim=-1) @ v
        return out

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx (B, T)`` int64 -> logits ``(B, T, V)``."""
        cfg = self.config
        idx = idx.to(self.device)
        b, t = idx.shape
        c, h = cfg.n_embd, cfg.n_head
        x = _rmsnorm(self.wte[idx] + self.wpe[:t])
        for wqkv, wo, fc1, fc2 in self.layers:
            q, k, v = F.linear(_rmsnorm(x), wqkv).split(c, dim=-1)
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            y = self._attend(q, k, v).transpose(1, 2).reshape(b, t, c)
            x = x + F.linear(y, wo)
            x = x + F.linear(F.relu(F.linear(_rmsnorm(x), fc1)), fc2)
        return F.linear(x, self.lm_head)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of full-length documents ``tokens (B, T+1)``."""
        tokens = tokens.to(self.device)
        logits = self.logits(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def train_step(self, tokens: torch.Tensor) -> float:
        """Forward, backward and one Adam step on ``tokens (B, T+1)``; returns the loss."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(tokens)
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def score(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-document mean NLL ``(B,)`` of ``tokens (B, T+1)``, without autograd."""
        tokens = tokens.to(self.device)
        with torch.no_grad():
            logits = self.logits(tokens[:, :-1])
            nll = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none"
            )
            return nll.view(tokens.shape[0], -1).mean(dim=1)

    def decode(self, u: torch.Tensor, bos: int, temperature: float = 0.5) -> torch.Tensor:
        """Sample ``u.shape[1]`` tokens for ``u.shape[0]`` sequences from BOS with a KV cache
        that grows by concatenation; the draw is the inverse CDF of ``u (B, steps)`` as in
        :func:`microgpt_xp.sample.choose`. Returns the ``(B, steps)`` int64 ids."""
        cfg = self.config
        u = u.to(self.device)
        b, steps = u.shape
        c, h = cfg.n_embd, cfg.n_head
        with torch.inference_mode():
            token = torch.full((b,), bos, dtype=torch.int64, device=self.device)
            keys: list[Any] = [None] * cfg.n_layer
            values: list[Any] = [None] * cfg.n_layer
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

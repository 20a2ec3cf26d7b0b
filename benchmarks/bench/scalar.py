"""A pure-Python scalar GPT with reverse-mode autograd on ``Value`` nodes: the speed class
of the original microgpt, as the benchmark's slowest peer.

One ``Value`` per number, one graph node per arithmetic operation, one token at a time
through a KV cache, one document per step, Adam over a flat list of scalars. It is written
for the benchmark from the spec (``shared/docs/microgpt-spec.md``), independently of the
package's array code, and is never used to train anything real.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from microgpt_xp.config import GPTConfig


class Value:
    """A scalar that remembers how it was made: ``data``, ``grad``, and the child nodes
    with the local derivative of this node with respect to each."""

    __slots__ = ("_children", "_local", "data", "grad")

    def __init__(
        self, data: float, children: tuple[Value, ...] = (), local: tuple[float, ...] = ()
    ) -> None:
        self.data = data
        self.grad = 0.0
        self._children = children
        self._local = local

    def __add__(self, other: Value | float) -> Value:
        if isinstance(other, Value):
            return Value(self.data + other.data, (self, other), (1.0, 1.0))
        return Value(self.data + other, (self,), (1.0,))

    __radd__ = __add__

    def __mul__(self, other: Value | float) -> Value:
        if isinstance(other, Value):
            return Value(self.data * other.data, (self, other), (other.data, self.data))
        return Value(self.data * other, (self,), (other,))

    __rmul__ = __mul__

    def __pow__(self, c: float) -> Value:
        return Value(self.data**c, (self,), (c * self.data ** (c - 1),))

    def __neg__(self) -> Value:
        return self * -1.0

    def __sub__(self, other: Value | float) -> Value:
        return self + (-other)

    def log(self) -> Value:
        """Natural logarithm."""
        return Value(math.log(self.data), (self,), (1.0 / self.data,))

    def exp(self) -> Value:
        """Exponential."""
        e = math.exp(self.data)
        return Value(e, (self,), (e,))

    def relu(self) -> Value:
        """``max(0, x)`` with derivative 0 at 0."""
        return Value(max(0.0, self.data), (self,), (float(self.data > 0),))

    def backward(self) -> None:
        """Accumulate d self / d node into every node's ``grad`` (seeded with 1)."""
        order: list[Value] = []
        seen: set[int] = set()
        stack: list[tuple[Value, bool]] = [(self, False)]
        while stack:  # iterative post-order DFS (deep graphs exceed the recursion limit)
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in node._children)
        self.grad = 1.0
        for node in reversed(order):
            for child, local in zip(node._children, node._local, strict=True):
                child.grad += local * node.grad


Matrix = list[list[Value]]


def _linear(x: Sequence[Value], w: Matrix) -> list[Value]:
    return [sum((wi * xi for wi, xi in zip(row, x, strict=True)), Value(0.0)) for row in w]


def _softmax(z: Sequence[Value]) -> list[Value]:
    top = max(v.data for v in z)
    e = [(v - top).exp() for v in z]
    inv = sum(e, Value(0.0)) ** -1.0
    return [ei * inv for ei in e]


def _rmsnorm(x: Sequence[Value]) -> list[Value]:
    ms = sum((xi * xi for xi in x), Value(0.0)) * (1.0 / len(x))
    s = (ms + 1e-5) ** -0.5
    return [xi * s for xi in x]


class ScalarGPT:
    """microgpt on scalars: ``state`` maps the original's keys (``wte``, ``wpe``,
    ``lm_head``, ``layer{i}.attn_wq`` …) to row-major matrices of :class:`Value`.

    Built from host weights (nested lists or NumPy arrays in the original's layout, e.g.
    ``Params.to_state_dict()``), so that it starts from the same numbers as the array model.
    """

    def __init__(self, state_dict: Mapping[str, Any], config: GPTConfig, lr: float = 0.01) -> None:
        self.config = config
        self.state: dict[str, Matrix] = {
            k: [[Value(float(x)) for x in row] for row in rows] for k, rows in state_dict.items()
        }
        self.flat: list[Value] = [v for rows in self.state.values() for row in rows for v in row]
        self._initial = [v.data for v in self.flat]
        self.m = [0.0] * len(self.flat)
        self.v = [0.0] * len(self.flat)
        self.lr, self.beta1, self.beta2, self.eps = lr, 0.85, 0.99, 1e-8
        self.t = 0

    def reset(self) -> None:
        """Back to the initial weights (the optimizer state is kept)."""
        for v, x in zip(self.flat, self._initial, strict=True):
            v.data = x

    def _token(
        self, token: int, pos: int, keys: list[list[list[Value]]], values: list[list[list[Value]]]
    ) -> list[Value]:
        """Logits (V) of one token at ``pos``; appends its keys/values to the caches."""
        cfg, sd = self.config, self.state
        d = cfg.head_dim
        x = _rmsnorm([t + p for t, p in zip(sd["wte"][token], sd["wpe"][pos], strict=True)])
        for layer in range(cfg.n_layer):
            pre = f"layer{layer}."
            residual = x
            h = _rmsnorm(x)
            q = _linear(h, sd[pre + "attn_wq"])
            keys[layer].append(_linear(h, sd[pre + "attn_wk"]))
            values[layer].append(_linear(h, sd[pre + "attn_wv"]))
            heads: list[Value] = []
            for hd in range(cfg.n_head):
                lo, hi = hd * d, (hd + 1) * d
                scores = [
                    sum((qj * kj for qj, kj in zip(q[lo:hi], k[lo:hi], strict=True)), Value(0.0))
                    * (d**-0.5)
                    for k in keys[layer]
                ]
                att = _softmax(scores)
                heads += [
                    sum((a * v[j] for a, v in zip(att, values[layer], strict=True)), Value(0.0))
                    for j in range(lo, hi)
                ]
            x = [a + r for a, r in zip(_linear(heads, sd[pre + "attn_wo"]), residual, strict=True)]
            residual = x
            u = [ui.relu() for ui in _linear(_rmsnorm(x), sd[pre + "mlp_fc1"])]
            x = [a + r for a, r in zip(_linear(u, sd[pre + "mlp_fc2"]), residual, strict=True)]
        return _linear(x, sd["lm_head"])

    def loss(self, doc: Sequence[int]) -> Value:
        """The spec's loss of one encoded document ``BOS, ids…, BOS`` (a graph node)."""
        n = min(self.config.block_size, len(doc) - 1)
        keys: list[list[list[Value]]] = [[] for _ in range(self.config.n_layer)]
        values: list[list[list[Value]]] = [[] for _ in range(self.config.n_layer)]
        losses = [
            -_softmax(self._token(doc[p], p, keys, values))[doc[p + 1]].log() for p in range(n)
        ]
        return (1.0 / n) * sum(losses, Value(0.0))

    def train_step(self, doc: Sequence[int]) -> float:
        """Loss, backward and one Adam update (linear decay over 1000 steps); returns the
        loss before the update."""
        loss = self.loss(doc)
        loss.backward()
        t = self.t
        lr_t = self.lr * (1 - t / 1000) if t < 1000 else self.lr * 1e-3
        b1, b2 = self.beta1, self.beta2
        bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
        for i, p in enumerate(self.flat):
            g = p.grad
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            p.data -= lr_t * (self.m[i] / bc1) / ((self.v[i] / bc2) ** 0.5 + self.eps)
            p.grad = 0.0
        self.t = t + 1
        return loss.data

    def score(self, doc: Sequence[int]) -> float:
        """The loss of one document, forward only (the graph is built and dropped)."""
        return self.loss(doc).data

    def sample(
        self, bos: int, rng: random.Random, steps: int, temperature: float = 0.5
    ) -> list[int]:
        """``steps`` tokens drawn one at a time from BOS with ``choices`` at ``temperature``
        (no early stop at BOS, so every call samples the same number of tokens)."""
        keys: list[list[list[Value]]] = [[] for _ in range(self.config.n_layer)]
        values: list[list[list[Value]]] = [[] for _ in range(self.config.n_layer)]
        token, out = bos, []
        for pos in range(steps):
            logits = self._token(token, pos, keys, values)
            probs = _softmax([lg * (1.0 / temperature) for lg in logits])
            token = rng.choices(range(len(probs)), weights=[p.data for p in probs])[0]
            out.append(token)
        return out


def grads_of(model: ScalarGPT, doc: Iterable[int]) -> tuple[float, dict[str, list[list[float]]]]:
    """Loss and gradient of one document, as plain floats keyed like ``model.state``
    (used to check that the peer computes the same model as the array code)."""
    for p in model.flat:
        p.grad = 0.0
    loss = model.loss(list(doc))
    loss.backward()
    grads = {k: [[v.grad for v in row] for row in rows] for k, rows in model.state.items()}
    for p in model.flat:
        p.grad = 0.0
    return loss.data, grads

"""Independent pure-Python float64 oracle for Karpathy's ``microgpt.py``.

This module re-implements the original script (final gist revision, see
``shared/docs/microgpt-spec.md``) with nothing but the standard library. It follows the
original's arithmetic operation by operation so that it agrees with it bit for bit:

* every sum is a left-to-right Python ``sum`` starting from the integer 0;
* a division by a ``Value`` is a multiplication by its ``** -1`` (softmax ``e * S**-1``,
  rmsnorm mean ``sum * len(x)**-1``, attention scale ``* (head_dim**0.5)**-1``,
  temperature ``* temperature**-1``);
* the rmsnorm scale is ``(ms + 1e-5) ** -0.5``;
* ReLU is ``max(0, x)``;
* the scalar autograd graph has the same nodes, children order and topological order as the
  original, so gradients accumulate in the same order;
* all randomness comes from one ``random.Random(42)`` stream used in the original order
  (shuffle, 4192 ``gauss`` draws, then one ``choices`` call per sampled token).

The forward pass in :func:`gpt_logits` uses plain floats; since it performs exactly the same
IEEE-754 operations as the ``Value`` path it yields the same numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "SPEC_KEYS_GLOBAL",
    "SPEC_KEYS_LAYER",
    "Value",
    "adam_step",
    "gpt_logits",
    "init_state_dict",
    "loss_and_grads",
    "read_docs",
    "run_microgpt",
    "sample_one",
    "state_dict_keys",
    "zeros_like",
]

SPEC_KEYS_GLOBAL = ("wte", "wpe", "lm_head")
SPEC_KEYS_LAYER = ("attn_wq", "attn_wk", "attn_wv", "attn_wo", "mlp_fc1", "mlp_fc2")

Matrix = list[list[float]]
StateDict = dict[str, Matrix]


# --------------------------------------------------------------------------------------------
# Scalar autograd
# --------------------------------------------------------------------------------------------


class Value:
    """A scalar node of a reverse-mode autograd graph, in the style of microgpt.

    Attributes:
        data: the forward value (a Python number).
        grad: d(output)/d(self), accumulated by :meth:`backward` (starts as integer 0, as in
            the original).
    """

    __slots__ = ("_children", "_local_grads", "data", "grad")

    def __init__(
        self,
        data: float,
        children: tuple[Value, ...] = (),
        local_grads: tuple[float, ...] = (),
    ) -> None:
        """Create a node with value ``data``, its ``children`` and the local derivatives."""
        self.data = data
        self.grad: float = 0
        self._children = children
        self._local_grads = local_grads

    def __repr__(self) -> str:
        """Return a short representation with data and grad."""
        return f"Value(data={self.data!r}, grad={self.grad!r})"

    # ---- binary operations ------------------------------------------------------------------
    def __add__(self, other: Value | float) -> Value:
        """Return ``self + other`` (local grads 1, 1)."""
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data + other.data, (self, other), (1, 1))

    def __mul__(self, other: Value | float) -> Value:
        """Return ``self * other`` (local grads: the other operand)."""
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data * other.data, (self, other), (other.data, self.data))

    def __pow__(self, other: float) -> Value:
        """Return ``self ** other`` for a constant exponent (local grad c * x**(c-1))."""
        return Value(self.data**other, (self,), (other * self.data ** (other - 1),))

    def __neg__(self) -> Value:
        """Return ``self * -1``."""
        return self * -1

    def __radd__(self, other: float) -> Value:
        """Return ``other + self`` as ``self + other``."""
        return self + other

    def __sub__(self, other: Value | float) -> Value:
        """Return ``self + (-other)``."""
        return self + (-other)

    def __rsub__(self, other: float) -> Value:
        """Return ``other + (-self)``."""
        return other + (-self)

    def __rmul__(self, other: float) -> Value:
        """Return ``other * self`` as ``self * other``."""
        return self * other

    def __truediv__(self, other: Value | float) -> Value:
        """Return ``self * other**-1`` (division as multiplication by a reciprocal)."""
        return self * other**-1

    def __rtruediv__(self, other: float) -> Value:
        """Return ``other * self**-1``."""
        return other * self**-1

    # ---- unary functions --------------------------------------------------------------------
    def log(self) -> Value:
        """Return ``log(self)`` (local grad ``1 / x``)."""
        return Value(math.log(self.data), (self,), (1 / self.data,))

    def exp(self) -> Value:
        """Return ``exp(self)`` (local grad ``exp(x)``)."""
        return Value(math.exp(self.data), (self,), (math.exp(self.data),))

    def relu(self) -> Value:
        """Return ``max(0, self)`` (local grad 1.0 if x > 0 else 0.0)."""
        return Value(max(0, self.data), (self,), (float(self.data > 0),))

    # ---- backward ---------------------------------------------------------------------------
    def backward(self) -> None:
        """Backpropagate from this node, seeded with grad 1.

        The topological order is the post-order of a depth-first search over children in their
        stored order, exactly as the original's recursive ``build_topo``; it is computed
        iteratively here so that deep graphs cannot hit the recursion limit.
        """
        topo: list[Value] = []
        visited: set[Value] = {self}
        stack: list[tuple[Value, Any]] = [(self, iter(self._children))]
        while stack:
            node, children = stack[-1]
            for child in children:
                if child not in visited:
                    visited.add(child)
                    stack.append((child, iter(child._children)))
                    break
            else:
                stack.pop()
                topo.append(node)
        self.grad = 1
        for v in reversed(topo):
            for child, local_grad in zip(v._children, v._local_grads, strict=True):
                child.grad += local_grad * v.grad


Scalar = Value | float


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def state_dict_keys(n_layer: int) -> list[str]:
    """Return the state-dict keys in the spec's (insertion = Gaussian draw) order."""
    keys = list(SPEC_KEYS_GLOBAL)
    for i in range(n_layer):
        keys.extend(f"layer{i}.{name}" for name in SPEC_KEYS_LAYER)
    return keys


def _shapes(vocab_size: int, n_layer: int, n_embd: int, block_size: int) -> dict[str, tuple]:
    """Return ``{key: (n_out, n_in)}`` in key order."""
    shapes: dict[str, tuple[int, int]] = {
        "wte": (vocab_size, n_embd),
        "wpe": (block_size, n_embd),
        "lm_head": (vocab_size, n_embd),
    }
    for i in range(n_layer):
        shapes[f"layer{i}.attn_wq"] = (n_embd, n_embd)
        shapes[f"layer{i}.attn_wk"] = (n_embd, n_embd)
        shapes[f"layer{i}.attn_wv"] = (n_embd, n_embd)
        shapes[f"layer{i}.attn_wo"] = (n_embd, n_embd)
        shapes[f"layer{i}.mlp_fc1"] = (4 * n_embd, n_embd)
        shapes[f"layer{i}.mlp_fc2"] = (n_embd, 4 * n_embd)
    return shapes


def init_state_dict(
    vocab_size: int,
    n_layer: int = 1,
    n_embd: int = 16,
    block_size: int = 16,
    rng: random.Random | None = None,
    std: float = 0.08,
) -> StateDict:
    """Draw the initial parameters with ``rng.gauss(0, std)`` in the spec's §4 order.

    Keys in :func:`state_dict_keys` order, each matrix ``[n_out][n_in]`` filled row by row and
    column by column. ``rng`` defaults to a fresh ``random.Random(42)``, which yields the same
    stream as the original's module-level ``random`` seeded with 42. Note that in the original
    the doc shuffle comes first; pass the already-used generator to reproduce that.
    """
    if rng is None:
        rng = random.Random(42)
    return {
        key: [[rng.gauss(0, std) for _ in range(n_in)] for _ in range(n_out)]
        for key, (n_out, n_in) in _shapes(vocab_size, n_layer, n_embd, block_size).items()
    }


def zeros_like(state_dict: StateDict) -> StateDict:
    """Return a state dict of the same layout filled with ``0.0``."""
    return {key: [[0.0 for _ in row] for row in mat] for key, mat in state_dict.items()}


def _n_layer(state_dict: dict[str, Any]) -> int:
    """Infer the number of layers from the ``layer{i}.attn_wq`` keys (they must be 0..n-1)."""
    n = 0
    while f"layer{n}.attn_wq" in state_dict:
        n += 1
    return n


def _dims(state_dict: dict[str, Any], n_head: int) -> tuple[int, int, int, int]:
    """Return ``(vocab_size, n_layer, n_embd, block_size)`` inferred from the shapes."""
    vocab_size = len(state_dict["wte"])
    n_embd = len(state_dict["wte"][0])
    block_size = len(state_dict["wpe"])
    n_layer = _n_layer(state_dict)
    if n_head <= 0 or n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
    return vocab_size, n_layer, n_embd, block_size


# --------------------------------------------------------------------------------------------
# Model (generic over Value and float: the same operations in the same order)
# --------------------------------------------------------------------------------------------


def _data(x: Scalar) -> float:
    """Return the plain value of ``x``."""
    return x.data if isinstance(x, Value) else x


def _exp(x: Scalar) -> Scalar:
    """Return ``exp(x)`` for a Value or a float."""
    return x.exp() if isinstance(x, Value) else math.exp(x)


def _relu(x: Scalar) -> Scalar:
    """Return ``relu(x)`` (``max(0, x)``) for a Value or a float."""
    return x.relu() if isinstance(x, Value) else max(0, x)


def _linear(x: Sequence[Scalar], w: Sequence[Sequence[Scalar]]) -> list[Scalar]:
    """Return ``W . x``: for each row, the left-to-right sum of ``w_i * x_i`` from 0."""
    return [sum(wi * xi for wi, xi in zip(wo, x, strict=True)) for wo in w]


def _softmax(logits: Sequence[Scalar]) -> list[Scalar]:
    """Return ``e * S**-1`` with ``e = exp(z - max(z))`` (max on plain values) and ``S = sum e``."""
    max_val = max(_data(val) for val in logits)
    exps = [_exp(val - max_val) for val in logits]
    total = sum(exps)
    return [e * total**-1 for e in exps]


def _rmsnorm(x: Sequence[Scalar]) -> list[Scalar]:
    """Return ``x * (ms + 1e-5)**-0.5`` with ``ms = sum(x_i*x_i) * len(x)**-1``."""
    ms = sum(xi * xi for xi in x) * len(x) ** -1
    scale = (ms + 1e-5) ** -0.5
    return [xi * scale for xi in x]


def _gpt(
    state_dict: dict[str, Any],
    token_id: int,
    pos_id: int,
    keys: list[list[list[Scalar]]],
    values: list[list[list[Scalar]]],
    n_layer: int,
    n_head: int,
) -> list[Scalar]:
    """One-token forward pass with KV cache (spec §5); appends to ``keys``/``values``."""
    tok_emb = state_dict["wte"][token_id]
    pos_emb = state_dict["wpe"][pos_id]
    x = [t + p for t, p in zip(tok_emb, pos_emb, strict=True)]
    x = _rmsnorm(x)
    head_dim = len(x) // n_head
    inv_scale = (head_dim**0.5) ** -1
    for li in range(n_layer):
        x_residual = x
        x = _rmsnorm(x)
        q = _linear(x, state_dict[f"layer{li}.attn_wq"])
        k = _linear(x, state_dict[f"layer{li}.attn_wk"])
        v = _linear(x, state_dict[f"layer{li}.attn_wv"])
        keys[li].append(k)
        values[li].append(v)
        x_attn: list[Scalar] = []
        for h in range(n_head):
            hs = h * head_dim
            q_h = q[hs : hs + head_dim]
            k_h = [ki[hs : hs + head_dim] for ki in keys[li]]
            v_h = [vi[hs : hs + head_dim] for vi in values[li]]
            attn_logits = [
                sum(q_h[j] * k_h[t][j] for j in range(head_dim)) * inv_scale
                for t in range(len(k_h))
            ]
            attn_weights = _softmax(attn_logits)
            head_out = [
                sum(attn_weights[t] * v_h[t][j] for t in range(len(v_h))) for j in range(head_dim)
            ]
            x_attn.extend(head_out)
        x = _linear(x_attn, state_dict[f"layer{li}.attn_wo"])
        x = [a + b for a, b in zip(x, x_residual, strict=True)]
        x_residual = x
        x = _rmsnorm(x)
        x = _linear(x, state_dict[f"layer{li}.mlp_fc1"])
        x = [_relu(xi) for xi in x]
        x = _linear(x, state_dict[f"layer{li}.mlp_fc2"])
        x = [a + b for a, b in zip(x, x_residual, strict=True)]
    return _linear(x, state_dict["lm_head"])


def _check_tokens(tokens: Sequence[int], vocab_size: int, limit: int) -> None:
    """Raise ``ValueError`` if there are more than ``limit`` tokens or an id is out of range."""
    if len(tokens) > limit:
        raise ValueError(f"{len(tokens)} tokens exceed block_size={limit}")
    for tok in tokens:
        if not 0 <= tok < vocab_size:
            raise ValueError(f"token id {tok} out of range for vocab_size={vocab_size}")


def gpt_logits(state_dict: StateDict, tokens: list[int], n_head: int = 4) -> list[list[float]]:
    """Return the logits at every position for ``tokens`` fed one by one with a KV cache.

    ``tokens[t]`` is the input at position ``t``; the result has ``len(tokens)`` rows of
    ``vocab_size`` floats. Shapes are inferred from ``state_dict``. Raises ``ValueError`` if
    ``len(tokens) > block_size`` or a token id is out of range.
    """
    vocab_size, n_layer, _, block_size = _dims(state_dict, n_head)
    _check_tokens(tokens, vocab_size, block_size)
    keys: list[list[list[Scalar]]] = [[] for _ in range(n_layer)]
    values: list[list[list[Scalar]]] = [[] for _ in range(n_layer)]
    out = []
    for pos_id, token_id in enumerate(tokens):
        logits = _gpt(state_dict, token_id, pos_id, keys, values, n_layer, n_head)
        out.append([float(z) for z in logits])
    return out


def loss_and_grads(
    state_dict: StateDict, tokens: list[int], n_head: int = 4
) -> tuple[float, StateDict]:
    """Return the doc loss and its gradients via the scalar autograd (spec §6–§7).

    ``tokens`` is ``[BOS] + ids + [BOS]``; ``n = min(block_size, len(tokens) - 1)`` positions are
    used, input ``tokens[t]`` and target ``tokens[t+1]``. The loss is
    ``sum(-log(softmax(logits_t)[target_t])) * (1/n)``. The gradients have the layout of
    ``state_dict`` (``0.0`` for unused parameters). ``state_dict`` is not modified.
    """
    vocab_size, n_layer, _, block_size = _dims(state_dict, n_head)
    if len(tokens) < 2:
        raise ValueError("need at least two tokens (one input and one target)")
    n = min(block_size, len(tokens) - 1)
    _check_tokens(tokens[: n + 1], vocab_size, block_size + 1)
    params = {key: [[Value(p) for p in row] for row in mat] for key, mat in state_dict.items()}
    keys: list[list[list[Scalar]]] = [[] for _ in range(n_layer)]
    values: list[list[list[Scalar]]] = [[] for _ in range(n_layer)]
    losses: list[Value] = []
    for pos_id in range(n):
        token_id, target_id = tokens[pos_id], tokens[pos_id + 1]
        logits = _gpt(params, token_id, pos_id, keys, values, n_layer, n_head)
        probs = _softmax(logits)
        target = probs[target_id]
        assert isinstance(target, Value)
        losses.append(-target.log())
    total = sum(losses)
    assert isinstance(total, Value)
    loss = total * (1 / n)  # the original's ``(1 / n) * sum(losses)`` (via __rmul__)
    loss.backward()
    grads = {key: [[float(p.grad) for p in row] for row in mat] for key, mat in params.items()}
    return loss.data, grads


# --------------------------------------------------------------------------------------------
# Optimiser
# --------------------------------------------------------------------------------------------


def adam_step(
    state_dict: StateDict,
    grads: StateDict,
    m: StateDict,
    v: StateDict,
    step: int,
    lr: float = 0.01,
    beta1: float = 0.85,
    beta2: float = 0.99,
    eps: float = 1e-8,
    num_steps: int = 1000,
) -> None:
    """Apply one Adam update in place to ``state_dict``, ``m`` and ``v`` (spec §8).

    ``step`` is 0-based. Every parameter is updated, including those with zero gradient.
    ``grads`` is left unchanged (the original resets its grads to 0 afterwards).
    """
    lr_t = lr * (1 - step / num_steps)
    bc1 = 1 - beta1 ** (step + 1)
    bc2 = 1 - beta2 ** (step + 1)
    for key, mat in state_dict.items():
        g_mat, m_mat, v_mat = grads[key], m[key], v[key]
        for r, row in enumerate(mat):
            g_row, m_row, v_row = g_mat[r], m_mat[r], v_mat[r]
            for c in range(len(row)):
                g = g_row[c]
                m_row[c] = beta1 * m_row[c] + (1 - beta1) * g
                v_row[c] = beta2 * v_row[c] + (1 - beta2) * g**2
                m_hat = m_row[c] / bc1
                v_hat = v_row[c] / bc2
                row[c] -= lr_t * m_hat / (v_hat**0.5 + eps)


# --------------------------------------------------------------------------------------------
# Sampling, data and the whole script
# --------------------------------------------------------------------------------------------


def sample_one(
    state_dict: StateDict,
    rng: random.Random,
    bos: int,
    temperature: float = 0.5,
    n_head: int = 4,
) -> list[int]:
    """Sample one sequence of token ids (spec §10), without the terminating BOS.

    Starts from ``bos`` at position 0 with an empty KV cache, for at most ``block_size`` steps;
    each step draws ``rng.choices(range(vocab_size), weights=softmax(logits * temperature**-1))``
    (one ``random()`` call per token, the final BOS included).
    """
    vocab_size, n_layer, _, block_size = _dims(state_dict, n_head)
    keys: list[list[list[Scalar]]] = [[] for _ in range(n_layer)]
    values: list[list[list[Scalar]]] = [[] for _ in range(n_layer)]
    inv_temperature = temperature**-1
    token_id = bos
    sample: list[int] = []
    for pos_id in range(block_size):
        logits = _gpt(state_dict, token_id, pos_id, keys, values, n_layer, n_head)
        probs = _softmax([z * inv_temperature for z in logits])
        token_id = rng.choices(range(vocab_size), weights=probs)[0]
        if token_id == bos:
            break
        sample.append(token_id)
    return sample


def read_docs(path: str) -> list[str]:
    """Read the docs file: one doc per line, whitespace stripped, empty lines dropped (spec §1)."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def run_microgpt(
    docs: Iterable[str],
    num_steps: int = 1000,
    max_steps: int | None = None,
    num_samples: int = 20,
    n_layer: int = 1,
    n_embd: int = 16,
    block_size: int = 16,
    n_head: int = 4,
    print_fn: Callable[[str], Any] = print,
) -> list[str]:
    """Run the whole original script on an already-read doc list and return its output lines.

    Seeds ``random.Random(42)``, shuffles a copy of ``docs``, builds the character vocabulary
    (BOS = ``len(uchars)``), initialises the parameters, trains for ``max_steps`` (default
    ``num_steps``) steps, one doc per step (the LR decay always uses ``num_steps``), and then
    samples ``num_samples`` names at temperature 0.5. Each output line is passed to ``print_fn``
    and collected, without the ``'\\r'`` the original ends its step lines with and without the
    blank line it prints before the inference header.
    """
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        print_fn(line)

    rng = random.Random(42)
    docs = list(docs)
    rng.shuffle(docs)
    emit(f"num docs: {len(docs)}")
    uchars = sorted(set("".join(docs)))
    char_to_id = {ch: i for i, ch in enumerate(uchars)}
    bos = len(uchars)
    vocab_size = len(uchars) + 1
    emit(f"vocab size: {vocab_size}")
    state_dict = init_state_dict(vocab_size, n_layer, n_embd, block_size, rng=rng)
    emit(f"num params: {sum(len(row) for mat in state_dict.values() for row in mat)}")

    m = zeros_like(state_dict)
    v = zeros_like(state_dict)
    for step in range(num_steps if max_steps is None else max_steps):
        doc = docs[step % len(docs)]
        tokens = [bos, *(char_to_id[ch] for ch in doc), bos]
        loss, grads = loss_and_grads(state_dict, tokens, n_head=n_head)
        adam_step(state_dict, grads, m, v, step, num_steps=num_steps)
        emit(f"step {step + 1:4d} / {num_steps:4d} | loss {loss:.4f}")

    emit("--- inference (new, hallucinated names) ---")
    for i in range(num_samples):
        ids = sample_one(state_dict, rng, bos, temperature=0.5, n_head=n_head)
        emit(f"sample {i + 1:2d}: {''.join(uchars[t] for t in ids)}")
    return lines

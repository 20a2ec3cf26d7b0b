"""A pure-Python float64 oracle of Karpathy's ``microgpt.py`` (``shared/docs/microgpt-spec.md``),
operation by operation as the original (sums from 0, divisions as ``** -1``, the same autograd
graph and ``random.Random(42)`` stream), so that it agrees with it bit for bit."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

SPEC_KEYS_GLOBAL = ("wte", "wpe", "lm_head")
SPEC_KEYS_LAYER = ("attn_wq", "attn_wk", "attn_wv", "attn_wo", "mlp_fc1", "mlp_fc2")

Matrix = list[list[float]]
StateDict = dict[str, Matrix]


class Value:
    """A scalar node of a reverse-mode autograd graph, as microgpt's (``grad`` starts as 0)."""

    __slots__ = ("_children", "_local_grads", "data", "grad")

    def __init__(self, data: float, children: tuple = (), local_grads: tuple = ()) -> None:
        self.data = data
        self.grad: float = 0
        self._children = children
        self._local_grads = local_grads

    def __add__(self, other: Value | float) -> Value:
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data + other.data, (self, other), (1, 1))

    def __mul__(self, other: Value | float) -> Value:
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data * other.data, (self, other), (other.data, self.data))

    def __pow__(self, other: float) -> Value:
        return Value(self.data**other, (self,), (other * self.data ** (other - 1),))

    def log(self) -> Value:
        return Value(math.log(self.data), (self,), (1 / self.data,))

    def exp(self) -> Value:
        return Value(math.exp(self.data), (self,), (math.exp(self.data),))

    def relu(self) -> Value:
        return Value(max(0, self.data), (self,), (float(self.data > 0),))

    def __neg__(self) -> Value:
        return self * -1

    def __radd__(self, other: float) -> Value:
        return self + other

    def __sub__(self, other: Value | float) -> Value:
        return self + (-other)

    def __rsub__(self, other: float) -> Value:
        return other + (-self)

    def __rmul__(self, other: float) -> Value:
        return self * other

    def __truediv__(self, other: Value | float) -> Value:
        return self * other**-1

    def __rtruediv__(self, other: float) -> Value:
        return other * self**-1

    def backward(self) -> None:
        """Backpropagate from this node in the original's ``build_topo`` order (iteratively)."""
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


def state_dict_keys(n_layer: int) -> list[str]:
    """The state-dict keys in the spec's (insertion = Gaussian draw) order."""
    keys = list(SPEC_KEYS_GLOBAL)
    for i in range(n_layer):
        keys.extend(f"layer{i}.{name}" for name in SPEC_KEYS_LAYER)
    return keys


def init_state_dict(
    vocab_size: int,
    n_layer: int = 1,
    n_embd: int = 16,
    block_size: int = 16,
    rng: random.Random | None = None,
    std: float = 0.08,
) -> StateDict:
    """The initial ``[n_out][n_in]`` matrices, ``rng.gauss(0, std)`` in the spec's §4 order
    (``rng``: a fresh ``random.Random(42)`` by default)."""
    rng = random.Random(42) if rng is None else rng
    c = n_embd
    layer = [(c, c)] * 4 + [(4 * c, c), (c, 4 * c)]
    shapes = [(vocab_size, c), (block_size, c), (vocab_size, c), *layer * n_layer]
    return {
        key: [[rng.gauss(0, std) for _ in range(n_in)] for _ in range(n_out)]
        for key, (n_out, n_in) in zip(state_dict_keys(n_layer), shapes, strict=True)
    }


def zeros_like(state_dict: StateDict) -> StateDict:
    """A state dict of the same layout filled with ``0.0``."""
    return {key: [[0.0 for _ in row] for row in mat] for key, mat in state_dict.items()}


def _dims(state_dict: dict[str, Any], n_head: int) -> tuple[int, int, int, int]:
    """``(vocab_size, n_layer, n_embd, block_size)`` inferred from the shapes."""
    n_layer = 0
    while f"layer{n_layer}.attn_wq" in state_dict:
        n_layer += 1
    n_embd = len(state_dict["wte"][0])
    if n_head <= 0 or n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
    return len(state_dict["wte"]), n_layer, n_embd, len(state_dict["wpe"])


def _linear(x: Sequence[Scalar], w: Sequence[Sequence[Scalar]]) -> list[Scalar]:
    return [sum(wi * xi for wi, xi in zip(wo, x, strict=True)) for wo in w]


def _softmax(logits: Sequence[Scalar]) -> list[Scalar]:
    max_val = max(val.data if isinstance(val, Value) else val for val in logits)
    exps = [
        (val - max_val).exp() if isinstance(val, Value) else math.exp(val - max_val)
        for val in logits
    ]
    total = sum(exps)
    return [e * total**-1 for e in exps]


def _rmsnorm(x: Sequence[Scalar]) -> list[Scalar]:
    ms = sum(xi * xi for xi in x) * len(x) ** -1
    scale = (ms + 1e-5) ** -0.5
    return [xi * scale for xi in x]


def _gpt(
    state_dict: dict[str, Any],
    token_id: int,
    pos_id: int,
    keys: list[list[list[Scalar]]],
    values: list[list[list[Scalar]]],
    n_head: int,
) -> list[Scalar]:
    """One-token forward pass with KV cache (spec §5); appends to ``keys``/``values``."""
    x = [t + p for t, p in zip(state_dict["wte"][token_id], state_dict["wpe"][pos_id], strict=True)]
    x = _rmsnorm(x)
    head_dim = len(x) // n_head
    inv_scale = (head_dim**0.5) ** -1
    for li in range(len(keys)):
        x_residual = x
        x = _rmsnorm(x)
        q = _linear(x, state_dict[f"layer{li}.attn_wq"])
        keys[li].append(_linear(x, state_dict[f"layer{li}.attn_wk"]))
        values[li].append(_linear(x, state_dict[f"layer{li}.attn_wv"]))
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
            x_attn.extend(
                sum(attn_weights[t] * v_h[t][j] for t in range(len(v_h))) for j in range(head_dim)
            )
        x = _linear(x_attn, state_dict[f"layer{li}.attn_wo"])
        x = [a + b for a, b in zip(x, x_residual, strict=True)]
        x_residual = x
        x = _linear(_rmsnorm(x), state_dict[f"layer{li}.mlp_fc1"])
        x = [xi.relu() if isinstance(xi, Value) else max(0, xi) for xi in x]
        x = _linear(x, state_dict[f"layer{li}.mlp_fc2"])
        x = [a + b for a, b in zip(x, x_residual, strict=True)]
    return _linear(x, state_dict["lm_head"])


def _check_tokens(tokens: Sequence[int], vocab_size: int, limit: int) -> None:
    if len(tokens) > limit:
        raise ValueError(f"{len(tokens)} tokens exceed block_size={limit}")
    for tok in tokens:
        if not 0 <= tok < vocab_size:
            raise ValueError(f"token id {tok} out of range for vocab_size={vocab_size}")


def gpt_logits(state_dict: StateDict, tokens: list[int], n_head: int = 4) -> list[list[float]]:
    """The logits ``(len(tokens), vocab_size)`` of ``tokens`` fed one by one with a KV cache."""
    vocab_size, n_layer, _, block_size = _dims(state_dict, n_head)
    _check_tokens(tokens, vocab_size, block_size)
    keys, values = [[] for _ in range(n_layer)], [[] for _ in range(n_layer)]
    return [
        [float(z) for z in _gpt(state_dict, tok, pos, keys, values, n_head)]
        for pos, tok in enumerate(tokens)
    ]


def loss_and_grads(
    state_dict: StateDict, tokens: list[int], n_head: int = 4
) -> tuple[float, StateDict]:
    """The loss of ``[BOS] + ids + [BOS]`` over ``min(block_size, len(tokens) - 1)`` positions
    and its gradients in ``state_dict``'s layout, by the scalar autograd (spec §6-§7)."""
    vocab_size, n_layer, _, block_size = _dims(state_dict, n_head)
    if len(tokens) < 2:
        raise ValueError("need at least two tokens (one input and one target)")
    n = min(block_size, len(tokens) - 1)
    _check_tokens(tokens[: n + 1], vocab_size, block_size + 1)
    params = {key: [[Value(p) for p in row] for row in mat] for key, mat in state_dict.items()}
    keys, values = [[] for _ in range(n_layer)], [[] for _ in range(n_layer)]
    losses: list[Value] = []
    for pos_id in range(n):
        probs = _softmax(_gpt(params, tokens[pos_id], pos_id, keys, values, n_head))
        losses.append(-probs[tokens[pos_id + 1]].log())  # type: ignore[union-attr]
    loss = sum(losses) * (1 / n)  # the original's ``(1 / n) * sum(losses)`` (via __rmul__)
    loss.backward()  # type: ignore[union-attr]
    grads = {key: [[float(p.grad) for p in row] for row in mat] for key, mat in params.items()}
    return loss.data, grads  # type: ignore[union-attr]


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
    """One Adam update (spec §8, ``step`` 0-based) in place on ``state_dict``, ``m``, ``v``."""
    lr_t = lr * (1 - step / num_steps)
    bc1 = 1 - beta1 ** (step + 1)
    bc2 = 1 - beta2 ** (step + 1)
    for key, mat in state_dict.items():
        for row, g_row, m_row, v_row in zip(mat, grads[key], m[key], v[key], strict=True):
            for c, g in enumerate(g_row):
                m_row[c] = beta1 * m_row[c] + (1 - beta1) * g
                v_row[c] = beta2 * v_row[c] + (1 - beta2) * g**2
                row[c] -= lr_t * (m_row[c] / bc1) / ((v_row[c] / bc2) ** 0.5 + eps)


def sample_one(
    state_dict: StateDict, rng: random.Random, bos: int, temperature: float = 0.5, n_head: int = 4
) -> list[int]:
    """One sampled sequence of ids without its final BOS (spec §10), by ``rng.choices``."""
    vocab_size, n_layer, _, block_size = _dims(state_dict, n_head)
    keys, values = [[] for _ in range(n_layer)], [[] for _ in range(n_layer)]
    token_id, sample = bos, []
    for pos_id in range(block_size):
        logits = _gpt(state_dict, token_id, pos_id, keys, values, n_head)
        probs = _softmax([z * temperature**-1 for z in logits])
        token_id = rng.choices(range(vocab_size), weights=probs)[0]
        if token_id == bos:
            break
        sample.append(token_id)
    return sample


def read_docs(path: str) -> list[str]:
    """One doc per line, whitespace stripped, empty lines dropped (spec §1)."""
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
    """The original script's output lines on ``docs`` (each passed to ``print_fn``; no ``'\\r'``
    or blank line); ``max_steps`` steps (default ``num_steps``), decaying over ``num_steps``."""
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
    emit(f"vocab size: {bos + 1}")
    state_dict = init_state_dict(bos + 1, n_layer, n_embd, block_size, rng=rng)
    emit(f"num params: {sum(len(row) for mat in state_dict.values() for row in mat)}")
    m, v = zeros_like(state_dict), zeros_like(state_dict)
    for step in range(num_steps if max_steps is None else max_steps):
        tokens = [bos, *(char_to_id[ch] for ch in docs[step % len(docs)]), bos]
        loss, grads = loss_and_grads(state_dict, tokens, n_head=n_head)
        adam_step(state_dict, grads, m, v, step, num_steps=num_steps)
        emit(f"step {step + 1:4d} / {num_steps:4d} | loss {loss:.4f}")
    emit("--- inference (new, hallucinated names) ---")
    for i in range(num_samples):
        ids = sample_one(state_dict, rng, bos, temperature=0.5, n_head=n_head)
        emit(f"sample {i + 1:2d}: {''.join(uchars[t] for t in ids)}")
    return lines

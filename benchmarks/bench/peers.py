"""The benchmark's peers: the same work as ours, done another way, each one function of
:data:`PEERS` that takes a :class:`~benchmarks.bench.workloads.Case` and returns the
``Timed`` of its side (or raises :class:`PeerSkipped` where it does not apply).

* ``scalar``: ``tests/reference.py``, the tests' independent pure-Python oracle (scalar
  reverse-mode autograd on ``Value`` nodes, as the original microgpt), one document a call:
  the original's speed class. There is one scalar GPT in the repository, and it is that one.
* ``torch``, ``torch_sdpa``: the same model in PyTorch eager (:mod:`.torch_peer`), autograd
  and ``torch.optim.Adam``, on the torch device next to our arrays.
* ``matmul``: the step's matrix products alone: the machine's yardstick.
* ``jax``: the same model in ``jax.numpy`` with ``jax.value_and_grad`` and Adam under one
  ``jax.jit`` (:mod:`.jax_peer`): the peer of ours on JAX.

A new peer (e.g. ours against a namespace's own autodiff) is one more function in
:data:`PEERS`.
"""

from __future__ import annotations

import copy
import importlib
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from microgpt_xp import _xp
from microgpt_xp.params import FIELDS, init_params

from .timing import Timed
from .workloads import RESET_EVERY, TEMPERATURE, Case, every, sync

#: ``tests/`` of this checkout, where the scalar oracle lives.
TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"

#: Adam's schedule length for the timed steps: long enough that the linear decay of the
#: learning rate does not matter (ours uses the same).
NUM_STEPS = 2**62


def reference_module() -> ModuleType:
    """``tests/reference.py`` (imported as ``reference``, with ``tests/`` on ``sys.path``)."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    return importlib.import_module("reference")


class _NeverDraws(random.Random):
    """A ``random.Random`` whose ``choices`` never draws ``stop`` (its weight is set to
    zero), so that ``reference.sample_one`` samples all ``block_size`` tokens, the work of
    our decode workload (which runs without early stop)."""

    def __init__(self, seed: int, stop: int) -> None:
        super().__init__(seed)
        self.stop = stop

    def choices(  # type: ignore[override]
        self, population: Sequence[Any], weights: Sequence[float], *, k: int = 1
    ) -> list[Any]:
        """``random.Random.choices`` with the weight of ``stop`` set to zero."""
        kept = [0.0 if i == self.stop else w for i, w in enumerate(weights)]
        return super().choices(population, kept, k=k)


class ScalarReference:
    """The scalar peer on one document: :mod:`reference`'s ``loss_and_grads`` and
    ``adam_step`` for a training step, ``gpt_logits`` and the mean NLL for scoring,
    ``sample_one`` for decoding, all on Python floats (float64).

    ``state_dict`` is the original's layout (``Params.to_state_dict()``, nested lists or
    host arrays); ``doc`` the ``T + 1`` token ids of the document; ``bos`` the id that
    starts a sample.
    """

    def __init__(
        self,
        state_dict: dict[str, Any],
        doc: Sequence[int],
        *,
        n_head: int,
        bos: int,
        temperature: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.ref = reference_module()
        self.initial = {k: [[float(x) for x in row] for row in m] for k, m in state_dict.items()}
        self.state = copy.deepcopy(self.initial)
        self.m = self.ref.zeros_like(self.state)
        self.v = self.ref.zeros_like(self.state)
        self.step = 0
        self.doc = [int(t) for t in doc]
        self.n_head, self.bos, self.temperature = n_head, bos, temperature
        self.rng = _NeverDraws(seed, bos)

    def reset(self) -> None:
        """Back to the initial weights (the optimizer state is kept)."""
        self.state = copy.deepcopy(self.initial)

    def train_step(self) -> float:
        """Loss and gradients by scalar autograd, then one Adam update; returns the loss
        before the update."""
        loss, grads = self.ref.loss_and_grads(self.state, self.doc, n_head=self.n_head)
        self.ref.adam_step(self.state, grads, self.m, self.v, self.step, num_steps=NUM_STEPS)
        self.step += 1
        return float(loss)

    def score(self) -> float:
        """The document's mean NLL, forward only (``reference.gpt_logits`` on floats)."""
        logits = self.ref.gpt_logits(self.state, self.doc[:-1], n_head=self.n_head)
        nll = 0.0
        for z, target in zip(logits, self.doc[1:], strict=True):
            top = max(z)
            nll += math.log(sum(math.exp(zi - top) for zi in z)) + top - z[target]
        return nll / len(logits)

    def decode(self) -> list[int]:
        """``block_size`` tokens sampled from BOS through the KV cache at the temperature."""
        return list(
            self.ref.sample_one(
                self.state, self.rng, self.bos, temperature=self.temperature, n_head=self.n_head
            )
        )


class PeerSkipped(Exception):
    """A peer does not apply to a case; the message says why."""


#: The scalar peer is run only where a step builds fewer graph nodes than this
#: (about ``num_params * block_size``); the medium model would take minutes a step.
SCALAR_MAX_WORK = 300_000


def scalar(case: Case) -> Timed:
    """``tests/reference.py`` on the first document of the case's batch: ``T`` tokens a
    call, in Python floats (float64) whatever the case's dtype."""
    cfg = case.config
    work = cfg.num_params * case.seq_len
    if work > SCALAR_MAX_WORK:
        raise PeerSkipped(f"scalar reference skipped: ~{work:,} graph nodes a document (too slow)")
    host = init_params(cfg, seed=case.seed, backend="numpy", dtype="float64")
    peer = ScalarReference(
        host.to_state_dict(),
        case.host_tokens()[0],
        n_head=cfg.n_head,
        bos=cfg.vocab_size - 1,
        temperature=TEMPERATURE,
        seed=case.seed,
    )
    if case.workload == "train":
        return Timed("scalar", every(RESET_EVERY, peer.train_step, peer.reset), case.seq_len)
    if case.workload == "score":
        return Timed("scalar", peer.score, case.seq_len)
    return Timed("scalar", peer.decode, case.seq_len)


def host_weights(case: Case, dtype: str) -> dict[str, np.ndarray]:
    """The case's initial weights as layer-stacked host arrays of ``dtype``."""
    p = init_params(case.config, seed=case.seed, backend="numpy", dtype=dtype)
    return {name: np.asarray(getattr(p, name)) for name in FIELDS}


def _torch(case: Case, name: str, attention: str) -> Timed:
    """PyTorch eager on :meth:`Case.torch_device`, the whole batch in the case's dtype."""
    try:
        import torch
    except ImportError:
        raise PeerSkipped("PyTorch is not installed (pip install 'microgpt-xp[bench]')") from None
    from .torch_peer import TorchGPT

    cfg = case.config
    model = TorchGPT(
        host_weights(case, case.dtype),
        cfg,
        case.dtype,
        attention=attention,
        device=case.torch_device(),
    )
    tok = torch.from_numpy(case.host_tokens()).to(model.device)
    if case.workload == "train":
        return Timed(name, every(RESET_EVERY, lambda: model.train_step(tok), model.reset), case.tokens)
    if case.workload == "score":
        return Timed(name, lambda: float(model.score(tok)[0]), case.tokens)
    u = torch.from_numpy(case.host_uniforms().astype(case.dtype)).to(model.device)
    bos = cfg.vocab_size - 1
    return Timed(name, lambda: int(model.decode(u, bos, TEMPERATURE)[0, -1]), case.tokens)


def torch_eager(case: Case) -> Timed:
    """``torch``: PyTorch eager with masked matmul attention (the same work as ours)."""
    return _torch(case, "torch", "manual")


def torch_sdpa(case: Case) -> Timed:
    """``torch_sdpa``: PyTorch eager with ``scaled_dot_product_attention`` (train, score)."""
    if case.workload == "decode":
        raise PeerSkipped("torch_sdpa: decode uses the KV-cache loop of the torch peer")
    return _torch(case, "torch_sdpa", "sdpa")


def jax_autodiff(case: Case) -> Timed:
    """``jax``: the same model in ``jax.numpy`` with ``jax.value_and_grad`` and Adam in one
    ``jax.jit`` (:mod:`.jax_peer`), on the JAX device of our arrays: the peer of ours on
    JAX (train, score)."""
    if case.backend != "jax":
        raise PeerSkipped("jax peer: against ours on JAX only (--backend jax)")
    if case.workload == "decode":
        raise PeerSkipped("jax peer: train and score only")
    import jax

    from .jax_peer import JaxGPT

    model = JaxGPT(host_weights(case, case.dtype), case.config, case.dtype, device=case.params().device)
    tok = jax.device_put(case.host_tokens(), case.params().device)
    if case.workload == "train":
        return Timed("jax", every(RESET_EVERY, lambda: model.train_step(tok), model.reset), case.tokens)
    return Timed("jax", lambda: float(model.score(tok)[0]), case.tokens)


def matmul(case: Case) -> Timed:
    """``matmul``: the step's matrix products alone (:func:`matmul_shapes`), on our backend
    and device (NumPy for Dask, whose chunks compute there); train and score only."""
    if case.workload == "decode":
        raise PeerSkipped("matmul yardstick: train and score only")
    host_pairs = matmul_operands(case)
    if _xp.is_lazy(case.params().wte):
        pairs, product = host_pairs, np.matmul
    else:
        pairs = [(case.asarray(a), case.asarray(b)) for a, b in host_pairs]
        product = _xp.array_namespace(pairs[0][0]).matmul

    def products() -> float:
        out = None
        for a, b in pairs:
            out = product(a, b)
        return sync(out)  # on an asynchronous device: all of them are done

    return Timed("matmul", products, case.tokens)


#: The peers by name: each makes the ``Timed`` of its side of a case.
PEERS: dict[str, Callable[[Case], Timed]] = {
    "scalar": scalar,
    "torch": torch_eager,
    "torch_sdpa": torch_sdpa,
    "matmul": matmul,
    "jax": jax_autodiff,
}


def make_peer(peer: str, case: Case) -> Timed:
    """The ``Timed`` of the peer named ``peer`` on ``case``; raises :class:`PeerSkipped`
    where it does not apply and ``ValueError`` for an unknown name."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    return PEERS[peer](case)


def matmul_shapes(case: Case) -> list[tuple[tuple[int, ...], int, int, int]]:
    """The model's matrix products of one step as ``(batch_dims, m, k, n)``: ``(…, m, k) @
    (…, k, n)``. Forward: per layer q|k|v, attention scores and mix (full ``T x T``, as ours
    and PyTorch compute them), proj, fc1, fc2; then ``lm_head``. Training adds the two
    products of each one's backward (``dx`` and ``dW``; ``dq, dk, datt, dv``). The one-hot
    embedding products of our implementation are not model work and are left out."""
    cfg = case.config
    b, t, c, h, v = case.batch, case.seq_len, cfg.n_embd, cfg.n_head, cfg.vocab_size
    n, d = b * t, cfg.head_dim
    linears = [(n, c, 3 * c), (n, c, c), (n, c, 4 * c), (n, 4 * c, c)] * cfg.n_layer
    linears.append((n, c, v))
    attn = [((b, h), t, d, t), ((b, h), t, t, d)] * cfg.n_layer
    out: list[tuple[tuple[int, ...], int, int, int]] = [((), m, k, nn) for m, k, nn in linears]
    out += attn
    if case.workload == "train":
        for m, k, nn in linears:
            out += [((), m, nn, k), ((), nn, m, k)]  # dx = dy @ W, dW = dy.T @ x
        for _ in range(cfg.n_layer):
            out += [((b, h), t, t, d)] * 3 + [((b, h), t, d, t)]  # dq, dk, dv; datt
    return out


def matmul_flops(case: Case) -> int:
    """Floating-point operations (2 per multiply-add) of :func:`matmul_shapes`."""
    return sum(2 * math.prod(bd) * m * k * n for bd, m, k, n in matmul_shapes(case))


def matmul_operands(case: Case) -> list[tuple[np.ndarray, np.ndarray]]:
    """Contiguous random NumPy operands of :func:`matmul_shapes` in the case's dtype."""
    rng = np.random.default_rng(case.seed)
    return [
        (
            rng.standard_normal((*bd, m, k)).astype(case.dtype),
            rng.standard_normal((*bd, k, n)).astype(case.dtype),
        )
        for bd, m, k, n in matmul_shapes(case)
    ]


def square_matmul_gflops(size: int = 1024, dtype: str = "float32", repeat: int = 5) -> float:
    """The machine's plain matmul speed on one ``size x size`` product (best of
    ``repeat``), in GFLOP/s: the peak that large shapes reach."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(dtype)
    b = rng.standard_normal((size, size)).astype(dtype)
    a @ b
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9



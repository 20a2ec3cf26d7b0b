"""The peers, one function of :data:`PEERS` each: the ``Timed`` of the same work as ours,
done by ``tests/reference.py`` (``scalar``: the tests' pure-Python oracle, training on
one document a call), PyTorch eager (``torch``: :mod:`.torch_peer`), JAX's autodiff
(``jax``: :mod:`.jax_peer`) or the step's matrix products alone (``matmul``)."""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from microgpt_xp import _xp, init_params

from .timing import Timed
from .workloads import NUM_STEPS, RESET_EVERY, TEMPERATURE, Case, every, sync

#: The scalar oracle of the package's tests.
REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "reference.py"
#: The scalar peer runs where a document builds fewer graph nodes than this (about
#: ``num_params * T``): the medium model would take minutes a step.
SCALAR_MAX_WORK = 300_000


class PeerSkipped(Exception):
    """A peer does not apply to a case; the message says why."""


def reference_module() -> ModuleType:
    """``tests/reference.py`` as the module ``reference`` (the one already imported, if any)."""
    if "reference" not in sys.modules:
        spec = importlib.util.spec_from_file_location("reference", REFERENCE)
        assert spec is not None and spec.loader is not None
        sys.modules["reference"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["reference"]


class ScalarReference:
    """The scalar peer: ``reference.loss_and_grads`` (scalar autograd) and ``adam_step`` on
    one document ``doc`` (``T + 1`` ids), from ``state_dict`` (the original's layout)."""

    def __init__(self, state_dict: dict[str, Any], doc: Sequence[int], *, n_head: int) -> None:
        self.ref = reference_module()
        self.initial = {k: [[float(x) for x in row] for row in m] for k, m in state_dict.items()}
        self.state = copy.deepcopy(self.initial)
        self.m, self.v = self.ref.zeros_like(self.state), self.ref.zeros_like(self.state)
        self.step, self.doc, self.n_head = 0, [int(t) for t in doc], n_head

    def reset(self) -> None:
        """Back to the initial weights (Adam's state is kept)."""
        self.state = copy.deepcopy(self.initial)

    def train_step(self) -> float:
        """Loss and gradients by scalar autograd, one Adam update; the loss before it."""
        loss, grads = self.ref.loss_and_grads(self.state, self.doc, n_head=self.n_head)
        self.ref.adam_step(self.state, grads, self.m, self.v, self.step, num_steps=NUM_STEPS)
        self.step += 1
        return float(loss)


def scalar(case: Case) -> Timed:
    """``scalar``: a training step of the reference on the batch's first document (``T``
    tokens a call, in Python floats): the original microgpt's speed class."""
    if not case.trains:
        raise PeerSkipped("scalar reference: train and text only")
    work = case.config.num_params * case.seq_len
    if work > SCALAR_MAX_WORK:
        raise PeerSkipped(f"scalar reference skipped: ~{work:,} graph nodes a document (too slow)")
    sd = init_params(case.config, seed=case.seed, dtype="float64").to_state_dict()
    peer = ScalarReference(sd, case.host_tokens()[0], n_head=case.config.n_head)
    return Timed("scalar", every(RESET_EVERY, peer.train_step, peer.reset), case.seq_len)


def host_weights(case: Case) -> dict[str, np.ndarray]:
    """The case's initial weights as layer-stacked host arrays of its dtype."""
    params = init_params(case.config, seed=case.seed, dtype=case.dtype)
    return {k: np.asarray(v) for k, v in params.arrays().items()}


def _model(
    name: str, case: Case, model: Any, tok: Any, decode: Callable[[], Any] | None = None
) -> Timed:
    """The ``Timed`` of a peer model's ``train_step``/``reset``, ``score`` or ``decode``."""
    train = every(RESET_EVERY, lambda: model.train_step(tok), model.reset)
    fns = {
        "train": train,
        "text": train,
        "score": lambda: float(model.score(tok)[0]),
        "decode": decode,
    }
    return Timed(name, fns[case.workload], case.tokens)


def torch_eager(case: Case) -> Timed:
    """``torch``: PyTorch eager on :meth:`Case.torch_device`, the whole batch in the case's
    dtype, with masked matmul attention (the same work as ours)."""
    if importlib.util.find_spec("torch") is None:
        raise PeerSkipped("PyTorch is not installed (pip install -e '.[bench]')")
    import torch

    from .torch_peer import TorchGPT

    model = TorchGPT(host_weights(case), case.config, case.dtype, device=case.torch_device())
    u = torch.from_numpy(case.host_uniforms().astype(case.dtype)).to(model.device)
    decode = lambda: int(model.decode(u, case.config.vocab_size - 1, TEMPERATURE)[0, -1])  # noqa: E731
    return _model(
        "torch", case, model, torch.from_numpy(case.host_tokens()).to(model.device), decode
    )


def jax_autodiff(case: Case) -> Timed:
    """``jax``: against ours on JAX, on its device (train and score)."""
    if case.backend != "jax":
        raise PeerSkipped("jax peer: against ours on JAX only (--backend jax)")
    if case.workload == "decode":
        raise PeerSkipped("jax peer: train and score only")
    import jax

    from .jax_peer import JaxGPT

    device = case.params().device
    model = JaxGPT(host_weights(case), case.config, case.dtype, device=device)
    return _model("jax", case, model, jax.device_put(case.host_tokens(), device))


def matmul(case: Case) -> Timed:
    """``matmul``: :func:`matmul_shapes` on our backend and device (NumPy for Dask, whose
    chunks compute there); train and score."""
    if case.workload == "decode":
        raise PeerSkipped("matmul yardstick: train and score only")
    rng = np.random.default_rng(case.seed)
    pairs = [
        tuple(rng.standard_normal(s).astype(case.dtype) for s in ((*bd, m, k), (*bd, k, n)))
        for bd, m, k, n in matmul_shapes(case)
    ]
    product: Callable[[Any, Any], Any] = np.matmul
    if not _xp.is_lazy(case.params().wte):
        pairs = [(case.asarray(a), case.asarray(b)) for a, b in pairs]
        product = _xp.array_namespace(pairs[0][0]).matmul

    def products() -> float:
        for a, b in pairs:
            out = product(a, b)
        return sync(out)  # the last one done: all of them are

    return Timed("matmul", products, case.tokens)


#: The peers by name.
PEERS: dict[str, Callable[[Case], Timed]] = {
    "scalar": scalar,
    "torch": torch_eager,
    "matmul": matmul,
    "jax": jax_autodiff,
}


def matmul_shapes(case: Case) -> list[tuple[tuple[int, ...], int, int, int]]:
    """The model's matrix products of one step as ``(batch_dims, m, k, n)``: per layer
    q|k|v, scores and mix (full ``T x T``), proj, fc1, fc2, then ``lm_head``; training adds
    each one's two backward products. Our one-hot embedding products are not model work."""
    cfg = case.config
    b, t, c, h, n, d = case.batch, case.seq_len, cfg.n_embd, cfg.n_head, case.tokens, cfg.head_dim
    linears = [(n, c, 3 * c), (n, c, c), (n, c, 4 * c), (n, 4 * c, c)] * cfg.n_layer + [
        (n, c, cfg.vocab_size)
    ]
    out: list[tuple[tuple[int, ...], int, int, int]] = [((), *mkn) for mkn in linears]
    out += [((b, h), t, d, t), ((b, h), t, t, d)] * cfg.n_layer
    if case.trains:
        for m, k, nn in linears:
            out += [((), m, nn, k), ((), nn, m, k)]  # dx = dy @ W, dW = dy.T @ x
        out += ([((b, h), t, t, d)] * 3 + [((b, h), t, d, t)]) * cfg.n_layer  # dq, dk, dv; datt
    return out


def matmul_flops(case: Case) -> int:
    """Floating-point operations (2 a multiply-add) of :func:`matmul_shapes`."""
    return sum(2 * math.prod(bd) * m * k * n for bd, m, k, n in matmul_shapes(case))

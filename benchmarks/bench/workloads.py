"""The benchmarks' one table of configs, the cases, our side of each case, and the targets
of ``--check-targets`` (the peers are in :mod:`.peers`)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import re
from collections.abc import Callable
from typing import Any

import numpy as np

import microgpt_xp as mx
from microgpt_xp import _xp
from microgpt_xp.config import GPTConfig

from .timing import Timed

#: Named model shapes: the spec's model, a wider, deeper one (V=27: names' vocabulary) and
#: nanoGPT's CPU run on Tiny Shakespeare (V=65 characters), the ``text`` workload's.
CONFIGS: dict[str, GPTConfig] = {
    "default": GPTConfig(vocab_size=27, n_layer=1, n_embd=16, n_head=4, block_size=16),
    "medium": GPTConfig(vocab_size=27, n_layer=4, n_embd=128, n_head=4, block_size=64),
    "text": GPTConfig(vocab_size=65, n_layer=4, n_embd=128, n_head=4, block_size=64),
}
#: ``text``: the training step on the ``text`` config whatever ``--config`` says (nanoGPT's
#: ``batch_size=12`` windows of ``block_size + 1`` characters, every position predicted).
WORKLOADS = ("train", "score", "decode", "text")
TRAINING = ("train", "text")
TEMPERATURE = 0.5  # of the decode workload (the spec's)
NUM_STEPS = 2**62  # Adam's schedule in timed steps: the learning rate does not decay
#: Training workloads (ours and every peer) go back to their initial weights every this
#: many calls, so that thousands of steps on one batch cannot reach overflow or subnormals.
RESET_EVERY = 100


def every(n: int, step: Callable[[], Any], reset: Callable[[], None]) -> Callable[[], Any]:
    """``step``, with ``reset()`` run before every ``n``-th call."""
    calls = itertools.count(1)

    def call() -> Any:
        if next(calls) % n == 0:
            reset()
        return step()

    return call


def parse_config(text: str) -> tuple[str, GPTConfig]:
    """A config by name or spelled ``L4,C128,H4,T64[,V27]`` (any order, commas optional;
    defaults L1 C16 H4 T16 V27). Returns ``(label, config)``."""
    if text in CONFIGS:
        return text, CONFIGS[text]
    parts = dict(re.findall(r"([LCHTV])(\d+)", text.upper()))
    if not parts or re.sub(r"[LCHTV]\d+|[,\s]", "", text.upper()):
        raise ValueError(
            f"unknown config {text!r}: use {', '.join(CONFIGS)} or a spec like L4,C128,H4,T64"
        )
    n = {k: int(parts.get(k, d)) for k, d in zip("VLCHT", (27, 1, 16, 4, 16), strict=True)}
    cfg = GPTConfig(n["V"], n_layer=n["L"], n_embd=n["C"], n_head=n["H"], block_size=n["T"])
    return config_label(cfg), cfg


def config_label(cfg: GPTConfig) -> str:
    """``L1,C16,H4,T16,V27``-style label of a config."""
    return f"L{cfg.n_layer},C{cfg.n_embd},H{cfg.n_head},T{cfg.block_size},V{cfg.vocab_size}"


@dataclasses.dataclass(frozen=True)
class Case:
    """A workload on a config, batch size (documents, or sequences decoded at once), dtype
    and backend; every document is full length (``T = block_size`` tokens). ``device`` is
    our arrays' device, ``peer_device`` the PyTorch peers' (``None``: next to ours)."""

    workload: str
    config_name: str
    config: GPTConfig
    batch: int
    dtype: str
    backend: str
    seed: int = 0
    device: Any = None
    peer_device: str | None = None

    @property
    def trains(self) -> bool:
        """Whether the workload is a training step (``train``, ``text``)."""
        return self.workload in TRAINING

    @property
    def seq_len(self) -> int:
        """Tokens a sequence (predicted in train/score, sampled in decode)."""
        return self.config.block_size

    @property
    def tokens(self) -> int:
        """Tokens of work in one call of the whole batch."""
        return self.batch * self.seq_len

    def host_tokens(self) -> np.ndarray:
        """``(batch, T+1)`` int64 random documents (fixed by ``seed``)."""
        return np.random.default_rng([self.seed, 1]).integers(
            0, self.config.vocab_size, (self.batch, self.seq_len + 1)
        )

    def host_uniforms(self) -> np.ndarray:
        """``(batch, T)`` uniforms of the decode draws (fixed by ``seed``)."""
        return np.random.default_rng([self.seed, 2]).random((self.batch, self.seq_len))

    def params(self) -> mx.Params:
        """Initial weights of this case on its backend, device and dtype."""
        return mx.init_params(
            self.config, seed=self.seed, backend=self.backend, device=self.device, dtype=self.dtype
        )

    def asarray(self, host: np.ndarray) -> Any:
        """``host`` on this case's backend and device."""
        return _xp.asarray(host, self.backend, device=self.device)

    def torch_device(self) -> str:
        """The torch device of the PyTorch peers."""
        return self.peer_device or torch_device_like(self.backend, self.params().device)


def torch_device_like(backend: str, device: Any) -> str:
    """The torch device of the hardware under our arrays: ``cuda:N`` for CuPy's and JAX's
    GPU ``N``, torch's own device, else ``cpu``."""
    if backend == "cupy" or (backend == "jax" and getattr(device, "platform", None) == "gpu"):
        return f"cuda:{device.id}"
    return str(device) if backend == "torch" else "cpu"


def sync(x: Any) -> float:
    """The first element of ``x`` as a float: reading it waits for an asynchronous device."""
    xp = _xp.array_namespace(x)
    return float(_xp.to_numpy(xp.reshape(x, (-1,))[:1])[0])


def ours(case: Case, pkg: str = "microgpt_xp") -> Timed:
    """Our side of ``case``, in this process: a training step as ``train()`` runs it (the
    pure ``train_step``, compiled where the backend has a compiler, materialized, the loss
    to the host), ``score`` of the batch, or
    ``decode_batch`` for ``T`` positions without early stop. ``pkg`` names the package
    (another checkout's, for ``--ab``)."""
    lib = importlib.import_module(pkg)
    xp, optim, model, params_mod, sample = (
        importlib.import_module(f"{pkg}.{m}") for m in ("_xp", "optim", "model", "params", "sample")
    )
    config = lib.GPTConfig(**dataclasses.asdict(case.config))  # the package's own class
    params = lib.init_params(
        config, seed=case.seed, backend=case.backend, device=case.device, dtype=case.dtype
    )
    tok = xp.asarray(case.host_tokens(), case.backend, device=case.device)
    lens = xp.asarray(np.full(case.batch, case.seq_len + 1), case.backend, device=case.device)
    name = f"ours[{case.backend}]"
    if case.trains:
        # the step train() runs: unchecked (the private twin of a checkout before issue 30)
        pure = getattr(model, "_train_step", None) or functools.partial(
            model.train_step, check=False
        )
        step = functools.partial(
            pure, reduction="mean", optimizer=optim.AdamConfig(num_steps=NUM_STEPS)
        )
        step = (xp.compiler(case.backend, None) or (lambda f: f))(step)
        state = {"params": params, "adam": lib.adam_init(params)}

        def train() -> float:
            new, adam, loss = step(state["params"], state["adam"], tok, lens)
            loss, state["params"], state["adam"] = params_mod.materialize(loss, new, adam)
            return sync(loss)

        return Timed(
            name, every(RESET_EVERY, train, lambda: state.update(params=params)), case.tokens
        )
    if case.workload == "score":
        return Timed(name, lambda: sync(lib.score(params, tok, lens)), case.tokens)
    if case.workload == "decode":
        u, bos = case.host_uniforms(), case.config.vocab_size - 1
        decode = functools.partial(
            sample.decode_batch, params, bos, u, 1 / TEMPERATURE, early_stop=False
        )
        return Timed(name, lambda: float(decode()[0, -1]), case.tokens)
    raise ValueError(f"unknown workload {case.workload!r}; choose from {', '.join(WORKLOADS)}")


_NUMPY = "ours on NumPy (float32, one process) against PyTorch eager on the CPU"
_TORCH = "PyTorch tensors on the CPU through our code against PyTorch autograd eager"
#: ``--check-targets``: (backend, workload, config, batch, dtype, peer) -> (the least median
#: ratio ours/peer of tokens/s, ours and the peer on the CPU; what is compared).
TARGETS: dict[tuple[Any, ...], tuple[float, str]] = {
    ("numpy", "train", "default", 64, "float32", "torch"): (2.0, _NUMPY),
    ("numpy", "train", "medium", 32, "float32", "torch"): (1.05, _NUMPY),
    ("numpy", "text", "text", 12, "float32", "torch"): (1.0, _NUMPY),
    ("torch", "train", "default", 64, "float32", "torch"): (1.0, _TORCH),
    ("torch", "train", "medium", 32, "float32", "torch"): (1.0, _TORCH),
}


def target_for(case: Case, peer: str) -> tuple[float, str] | None:
    """``(minimum, what)``: the target of ``case`` against ``peer``, or ``None``."""
    key = (case.backend, case.workload, case.config_name, case.batch, case.dtype, peer)
    on_cpu = torch_device_like(case.backend, case.params().device) == case.torch_device() == "cpu"
    return TARGETS.get(key) if on_cpu else None

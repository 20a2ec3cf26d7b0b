"""What the benchmark times of ours: a training step, scoring and decoding on any backend
(the cases, and our side of each). The peers are in :mod:`benchmarks.bench.peers`, the
breakdown of our training step in :mod:`benchmarks.bench.profiling`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from microgpt_xp import _xp
from microgpt_xp.config import GPTConfig
from microgpt_xp.model import _train_step, score
from microgpt_xp.optim import Adam, adam_init
from microgpt_xp.params import Params, init_params, materialize
from microgpt_xp.sample import decode_batch

from .timing import Timed

#: Named model shapes (the spec's model and a wider, deeper one).
CONFIGS: dict[str, GPTConfig] = {
    "default": GPTConfig(vocab_size=27, n_layer=1, n_embd=16, n_head=4, block_size=16),
    "medium": GPTConfig(vocab_size=27, n_layer=4, n_embd=128, n_head=4, block_size=64),
}

WORKLOADS: tuple[str, ...] = ("train", "score", "decode")

#: Sampling temperature of the decode workload (the spec's 0.5).
TEMPERATURE = 0.5

#: Training workloads go back to their initial weights every this many steps, so that
#: thousands of timed steps on one fixed batch cannot drive the weights to overflow,
#: underflow or subnormal numbers (which would change the speed); ours and every peer alike.
RESET_EVERY = 100


def every(n: int, step: Callable[[], Any], reset: Callable[[], None]) -> Callable[[], Any]:
    """``step``, with ``reset()`` run before every ``n``-th call."""
    count = [0]

    def call() -> Any:
        count[0] += 1
        if count[0] % n == 0:
            reset()
        return step()

    return call


def parse_config(text: str) -> tuple[str, GPTConfig]:
    """A config by name (``default``, ``medium``) or spelled ``L4,C128,H4,T64[,V27]`` (any
    order, commas optional; V defaults to 27). Returns ``(label, config)``."""
    if text in CONFIGS:
        return text, CONFIGS[text]
    parts = dict(re.findall(r"([LCHTV])(\d+)", text.upper()))
    if not parts or re.sub(r"[LCHTV]\d+|[,\s]", "", text.upper()):
        raise ValueError(
            f"unknown config {text!r}: use {', '.join(CONFIGS)} or a spec like L4,C128,H4,T64"
        )
    cfg = GPTConfig(
        vocab_size=int(parts.get("V", 27)),
        n_layer=int(parts.get("L", 1)),
        n_embd=int(parts.get("C", 16)),
        n_head=int(parts.get("H", 4)),
        block_size=int(parts.get("T", 16)),
    )
    return config_label(cfg), cfg


def config_label(cfg: GPTConfig) -> str:
    """``L1,C16,H4,T16,V27``-style label of a config."""
    return f"L{cfg.n_layer},C{cfg.n_embd},H{cfg.n_head},T{cfg.block_size},V{cfg.vocab_size}"


@dataclass(frozen=True)
class Case:
    """One benchmark setting: a workload on a config, batch size, dtype and backend.

    ``batch`` is documents per training/scoring step, or sequences decoded at once.
    Every document is full length: ``T = block_size`` predicted (or sampled) tokens.
    ``device`` is our arrays' device (``None``: the backend's default) and
    ``peer_device`` the torch device of the PyTorch peers (``None``: the same hardware as
    ours, :func:`torch_device_like`). Ours always runs in this one process.
    """

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
    def seq_len(self) -> int:
        """Tokens per sequence (predicted in train/score, sampled in decode)."""
        return self.config.block_size

    @property
    def tokens(self) -> int:
        """Tokens of work in one call: ``batch * seq_len``."""
        return self.batch * self.seq_len

    def host_tokens(self) -> np.ndarray:
        """``(batch, T+1)`` int64 random full-length documents (fixed by ``seed``)."""
        rng = np.random.default_rng([self.seed, 1])
        return rng.integers(0, self.config.vocab_size, (self.batch, self.seq_len + 1))

    def host_uniforms(self) -> np.ndarray:
        """``(batch, T)`` uniforms of the decode draws (fixed by ``seed``)."""
        return np.random.default_rng([self.seed, 2]).random((self.batch, self.seq_len))

    def params(self) -> Params:
        """Initial weights of this case on its backend, device and dtype."""
        return init_params(
            self.config, seed=self.seed, backend=self.backend, device=self.device, dtype=self.dtype
        )

    def asarray(self, host: np.ndarray) -> Any:
        """``host`` on this case's backend and device."""
        return _xp.asarray(host, self.backend, device=self.device)

    def torch_device(self) -> str:
        """The torch device of the PyTorch peers."""
        if self.peer_device is not None:
            return self.peer_device
        return torch_device_like(self.backend, self.params().device)


def torch_device_like(backend: str, device: Any) -> str:
    """The PyTorch device string of the hardware that our arrays on ``backend`` and
    ``device`` (a device object, e.g. ``Params.device``) compute on: ``"cuda:N"`` for CuPy
    GPU ``N`` and JAX's GPU ``N``, the device itself for torch, ``"cpu"`` for the host
    backends. It puts a PyTorch peer next to our arrays."""
    if backend == "cupy":
        return f"cuda:{device.id}"
    if backend == "torch":
        return str(device)
    if backend == "jax" and getattr(device, "platform", None) == "gpu":
        return f"cuda:{device.id}"
    return "cpu"


def device_name(backend: str, device: Any) -> str:
    """A readable name of the processor behind our arrays on ``backend`` and ``device`` (a
    device object): the GPU's name for CuPy and CUDA devices of torch, the device kind on
    JAX, ``"cpu"`` for NumPy and Dask, else the device's own string."""
    if backend == "cupy":
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
        return str(name.decode() if isinstance(name, bytes) else name)
    if backend == "torch" and device.type == "cuda":
        import torch

        return str(torch.cuda.get_device_name(device))
    if backend == "jax":
        return str(getattr(device, "device_kind", device))
    return "cpu" if backend in ("numpy", "dask") else str(device)


# -- ours -------------------------------------------------------------------------------------
def sync(x: Any) -> float:
    """The first element of ``x`` as a float: copying it to the host waits for the work
    queued before it on an asynchronous device (CuPy, CUDA torch)."""
    xp = _xp.array_namespace(x)
    return float(_xp.to_numpy(xp.reshape(x, (-1,))[:1])[0])


def ours(case: Case) -> Timed:
    """Our code on ``case.backend``, in this one process: a training step as
    :func:`microgpt_xp.train` runs it (the pure ``train_step``, compiled where the namespace
    has a compiler, materialized, the loss to the host),
    ``score`` of the batch, or :func:`microgpt_xp.sample.decode_batch` for ``T`` positions
    (what :func:`microgpt_xp.sample.sample_tokens` runs, without the early stop)."""
    params = case.params()
    backend = case.backend
    host = case.host_tokens()
    tok = case.asarray(host)
    lens = case.asarray(np.full(case.batch, case.seq_len + 1, dtype=np.int64))
    name = f"ours[{backend}]"
    if case.workload == "train":
        # what train() runs each step: the pure step, compiled where the namespace has a
        # compiler (jax.jit), then materialized (Dask) and the loss read to the host
        hyper = Adam(params, num_steps=2**62).hyperparameters
        step = functools.partial(_train_step, reduction="mean", **hyper)
        compile_fn = _xp.compiler(backend, None)
        if compile_fn is not None:
            step = compile_fn(step)
        state: dict[str, Any] = {"params": params, "adam": adam_init(params)}

        def train_step() -> float:
            new, adam_state, loss = step(state["params"], state["adam"], tok, lens)
            loss, new, adam_state = materialize(loss, new, adam_state)
            state["params"], state["adam"] = new, adam_state
            return sync(loss)

        def reset() -> None:
            state["params"] = params

        return Timed(name, every(RESET_EVERY, train_step, reset), case.tokens)
    if case.workload == "score":
        return Timed(name, lambda: sync(score(params, tok, lens)), case.tokens)
    if case.workload == "decode":
        uniforms = case.host_uniforms()
        bos = case.config.vocab_size - 1

        def decode() -> float:
            ids = decode_batch(params, bos, uniforms, 1.0 / TEMPERATURE, early_stop=False)
            return float(ids[0, -1])

        return Timed(name, decode, case.tokens)
    raise ValueError(f"unknown workload {case.workload!r}")

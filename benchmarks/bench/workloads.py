"""What the benchmark times of ours: a training step, scoring and decoding on any backend
(the cases, and our side of each), plus a per-layer breakdown of our training step. The
peers are in :mod:`benchmarks.bench.peers`.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from microgpt_xp import _xp
from microgpt_xp import layers as L
from microgpt_xp.config import GPTConfig
from microgpt_xp.model import loss_and_grads, score
from microgpt_xp.optim import Adam
from microgpt_xp.params import Params, init_params, materialize
from microgpt_xp.sample import decode_batch

from .timing import Timed, cpu_sample, minor_faults, other_cpu_share

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
    """Our code on ``case.backend``, in this one process: a training step
    (``loss_and_grads``, ``Adam.step``, materialize, the loss to the host),
    ``score`` of the batch, or :func:`microgpt_xp.sample.decode_batch` for ``T`` positions
    (what :func:`microgpt_xp.sample.sample_tokens` runs, without the early stop)."""
    params = case.params()
    backend = case.backend
    host = case.host_tokens()
    tok = case.asarray(host)
    lens = case.asarray(np.full(case.batch, case.seq_len + 1, dtype=np.int64))
    name = f"ours[{backend}]"
    if case.workload == "train":
        adam = Adam(params, num_steps=2**62)
        state = {"params": params}

        def train_step() -> float:
            loss, grads = loss_and_grads(state["params"], tok, lens)
            new = adam.step(state["params"], grads)
            loss, new, m, v = materialize(loss, new, *adam.moments)
            adam.moments = (m, v)
            state["params"] = new
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


# -- per-layer breakdown of our training step -------------------------------------------------------
_TIMED_LAYERS = (
    "embedding_forward",
    "embedding_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "linear_forward",
    "linear_backward",
    "linear_t_forward",
    "linear_t_backward",
    "causal_attention_forward",
    "causal_attention_backward",
    "relu_forward",
    "relu_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
)

#: Rows of the breakdown, in the order of the step.
COMPONENTS: tuple[str, ...] = (
    "embedding",
    "rmsnorm",
    "qkv",
    "attention",
    "proj",
    "fc1",
    "relu",
    "fc2",
    "lm_head",
    "loss",
    "adam",
    "other",
)


def _linear_label(w_shape: tuple[int, ...], cfg: GPTConfig) -> str:
    c, v = cfg.n_embd, cfg.vocab_size
    labels: dict[tuple[int, int], list[str]] = defaultdict(list)
    for shape, label in (
        ((3 * c, c), "qkv"),
        ((c, c), "proj"),
        ((4 * c, c), "fc1"),
        ((c, 4 * c), "fc2"),
        ((v, c), "lm_head"),
    ):
        labels[shape].append(label)
    found = labels.get((int(w_shape[0]), int(w_shape[1])), [])
    return found[0] if len(found) == 1 else "linear"


def _first_array(out: Any) -> Any:
    """The first array in a layer's output (an array or nested tuples), else ``None``."""
    if isinstance(out, tuple):
        for o in out:
            found = _first_array(o)
            if found is not None:
                return found
        return None
    return out if hasattr(out, "shape") else None


@contextlib.contextmanager
def timed_layers(
    cfg: GPTConfig, record: Callable[[str, str, float, Any], None], wait: bool = False
) -> Iterator[None]:
    """Wrap the forward/backward functions of :mod:`microgpt_xp.layers` that
    ``model.py`` calls, so that each call reports ``record(component, "forward" |
    "backward", seconds, output)``; restores them on exit. Linear layers are told apart by
    the shape of their weight. With ``wait`` each call waits for its output (an element
    copied to the host), so that an asynchronous device's work is charged to the layer
    that queued it. Measurement only: nothing else changes."""
    saved = {name: getattr(L, name) for name in _TIMED_LAYERS}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        base, _, direction = name.rpartition("_")
        comp = {"causal_attention": "attention", "cross_entropy": "loss"}.get(base, base)
        linear = base in ("linear", "linear_t")

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if wait:
                first = _first_array(out)
                if first is not None:
                    sync(first)
            elapsed = time.perf_counter() - start
            label = comp
            if linear:
                w = args[1] if direction == "forward" else args[1][1]
                label = _linear_label(tuple(w.shape), cfg)
            record(label, direction, elapsed, out)
            return out

        return timed

    try:
        for name, fn in saved.items():
            setattr(L, name, wrap(name, fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(L, name, fn)


def _dtypes(out: Any) -> set[str]:
    if isinstance(out, tuple):
        return set().union(*(_dtypes(o) for o in out)) if out else set()
    dtype = getattr(out, "dtype", None)
    return set() if dtype is None else {str(dtype).split(".")[-1]}


def breakdown(
    case: Case,
    steps: int = 5,
    warmup: int = 2,
    max_other: float = 0.05,
) -> dict[str, Any]:
    """Where the time of our training step goes on ``case`` (a ``train`` case of an eager
    backend): seconds per step of each component's forward and backward (median over the
    clean steps), Adam, and ``other``, the rest of the step's median time (the glue in
    ``model.py``: input checks, residual adds, the q|k|v weight concat, gradient slicing
    and stacking, the loss reduction, and the timers' own cost). Also lists
    every dtype a layer returned (in an untimed first step), to catch silent upcasts."""
    if _xp.is_lazy(case.params().wte):
        return {"skipped": f"breakdown needs an eager backend, not {case.backend}"}
    params = case.params()
    tok = case.asarray(case.host_tokens())
    lens = case.asarray(np.full(case.batch, case.seq_len + 1, dtype=np.int64))
    adam = Adam(params, num_steps=2**62)
    per_step: list[dict[str, float]] = []
    shares: list[float | None] = []
    dtypes: dict[str, set[str]] = defaultdict(set)
    wait = not isinstance(params.wte, np.ndarray)

    def record_dtypes(label: str, direction: str, sec: float, out: Any) -> None:
        dtypes[label] |= _dtypes(out)

    with timed_layers(case.config, record_dtypes, wait=wait):
        loss_and_grads(params, tok, lens)
    for i in range(warmup + steps):
        acc: dict[str, float] = defaultdict(float)

        def record(label: str, direction: str, sec: float, out: Any, acc: dict = acc) -> None:
            acc[f"{label}.{direction}"] += sec

        before = cpu_sample()
        faults = minor_faults()
        start = time.perf_counter()
        with timed_layers(case.config, record, wait=wait):
            loss, grads = loss_and_grads(params, tok, lens)
        t_adam = time.perf_counter()
        params = adam.step(params, grads)
        sync(loss)
        end = time.perf_counter()
        faults = minor_faults() - faults
        share = other_cpu_share(before, cpu_sample())
        if i < warmup:
            continue
        acc["adam.step"] = end - t_adam
        acc["total"] = end - start
        acc["faults"] = faults
        per_step.append(dict(acc))
        shares.append(share)
    kept = [s for s, sh in zip(per_step, shares, strict=True) if sh is None or sh <= max_other]
    use = kept or per_step
    keys = sorted({k for s in use for k in s})
    med = {k: float(np.median([s.get(k, 0.0) for s in use])) for k in keys}
    total = med.pop("total")
    faults_per_step = med.pop("faults")
    # "other" is the rest of the step, so that the rows add up to the step's time
    med["other.glue"] = total - sum(med.values())
    rows = []
    for comp in COMPONENTS:
        fwd = med.get(f"{comp}.forward", 0.0)
        bwd = med.get(f"{comp}.backward", 0.0)
        extra = med.get(f"{comp}.step", 0.0) + med.get(f"{comp}.glue", 0.0)
        if comp == "adam":
            fwd, bwd = 0.0, extra
        elif comp == "other":
            fwd, bwd = extra, 0.0
        rows.append(
            {
                "component": comp,
                "forward_s": fwd,
                "backward_s": bwd,
                "total_s": fwd + bwd,
                "share": (fwd + bwd) / total if total else math.nan,
            }
        )
    return {
        "step_s": total,
        "minor_faults_per_step": faults_per_step,
        "steps_kept": len(kept),
        "steps_dropped": len(per_step) - len(kept),
        "rows": rows,
        "dtypes": {k: sorted(v) for k, v in sorted(dtypes.items())},
        "upcasts": sorted(k for k, v in dtypes.items() if v - {case.dtype, "bool", "int64"}),
    }

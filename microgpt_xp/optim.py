"""Adam with microgpt's linear learning-rate decay: pure :func:`adam_init` and
:func:`adam_update` over an :class:`AdamState` (the step count a 0-d array, so the update
compiles once under ``jax.jit``), and :class:`Adam`, a thin stateful wrapper over them."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from . import _pytree
from . import primitives as P
from ._errors import ArgumentTypeError, ArgumentValueError
from ._xp import check_positive_int
from .params import Params, flatten, unflatten

#: The spec's hyperparameters.
LR, BETA1, BETA2, EPS, NUM_STEPS = 0.01, 0.85, 0.99, 1e-8, 1000


@dataclass(frozen=True)
class AdamState:
    """Adam's moments ``m`` and ``v``, each a flat ``(num_params,)`` vector in
    :func:`~microgpt_xp.params.flatten`'s layout on the weights' namespace, device and
    dtype, and ``step``, a 0-d int64 array counting the updates taken (a JAX pytree)."""

    m: Any
    v: Any
    step: Any


_pytree.register(
    AdamState, lambda s: ((s.m, s.v, s.step), None), lambda _, children: AdamState(*children)
)


def adam_init(params: Params) -> AdamState:
    """The state before the first update: zero moments, ``step = 0``."""
    if not isinstance(params, Params):
        raise ArgumentTypeError("params", f"adam_init needs a Params, got {type(params).__name__}")
    zeros = P.full((params.config.num_params,), 0.0, params.wte)
    return AdamState(zeros, zeros, P.full((), 0, params.wte, dtype=params.xp.int64))


@dataclass(frozen=True)
class AdamConfig:
    """Adam's hyper-parameters, the spec's by default, bound once (as optax binds them):
    the initial learning rate ``lr > 0``, the moments' decays ``0 <= beta1, beta2 < 1``,
    ``eps > 0`` (added outside the square root) and ``num_steps``, a positive int, the
    length of the linear decay ``lr_t = lr * (1 - t / num_steps)``. Immutable and hashable
    (a static argument of a compiled step); ``TypeError``/``ValueError`` for other values."""

    lr: float = LR
    beta1: float = BETA1
    beta2: float = BETA2
    eps: float = EPS
    num_steps: int = NUM_STEPS

    def __post_init__(self) -> None:
        check_positive_int(self.num_steps, "num_steps")
        for name in ("lr", "beta1", "beta2", "eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ArgumentTypeError(name, f"{name} must be a real number, got {value!r}")
            x = float(value)
            if not math.isfinite(x):
                raise ArgumentValueError(name, f"{name} must be finite, got {value!r}")
            beta = name.startswith("beta")
            if not (0.0 <= x < 1.0 if beta else x > 0):
                rule = "lie in [0, 1)" if beta else "be positive"
                raise ArgumentValueError(name, f"{name} must {rule}, got {value!r}")
            object.__setattr__(self, name, x)

    def lr_at(self, t: int) -> float:
        """The learning rate of the ``t``-th step (0-based)."""
        return self.lr * (1 - t / self.num_steps)


def adam_config(config: AdamConfig | None = None, **changes: Any) -> AdamConfig:
    """``config`` (default: the spec's :class:`AdamConfig`) with the fields named in
    ``changes`` replaced (``TypeError`` for a name that is not a field)."""
    if config is not None and not isinstance(config, AdamConfig):
        raise ArgumentTypeError(
            "optimizer", f"the optimizer must be an AdamConfig, got {type(config).__name__}"
        )
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(AdamConfig)})
    if unknown:
        raise ArgumentTypeError(unknown[0], f"unknown Adam hyper-parameters {unknown}")
    config = AdamConfig() if config is None else config
    return dataclasses.replace(config, **changes) if changes else config


def adam_update(
    params: Params,
    grads: Params,
    state: AdamState,
    config: AdamConfig | None = None,
    **changes: Any,
) -> tuple[Params, AdamState]:
    """One Adam update (the spec's, §8) of ``params`` with ``grads`` under ``config`` (the
    spec's by default; ``changes`` replace fields, e.g. ``num_steps=10``); returns the new
    ``(params, state)`` and modifies nothing.

    With ``t = state.step``: ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2)
    g²``, ``p -= lr_t (m / (1 - beta1^(t+1))) / (sqrt(v / (1 - beta2^(t+1))) + eps)``, on
    every weight (zero gradients too). The step's factors are computed in float64, then
    rounded to the weights' dtype, as the original's Python floats; nothing is read to the
    host (it traces under ``jax.jit``).
    """
    hp = adam_config(config, **changes)
    xp, dtype = params.xp, params.dtype
    t = xp.astype(state.step, xp.float64)
    lr_t = xp.astype(hp.lr * (1.0 - t / hp.num_steps), dtype)
    bc1 = xp.astype(1.0 - hp.beta1 ** (t + 1.0), dtype)
    bc2 = xp.astype(1.0 - hp.beta2 ** (t + 1.0), dtype)
    p, g = flatten(params), flatten(grads)
    m = hp.beta1 * state.m + (1 - hp.beta1) * g
    v = hp.beta2 * state.v + (1 - hp.beta2) * (g * g)
    p = p - (lr_t * (m / bc1)) / ((v / bc2) ** 0.5 + hp.eps)
    return unflatten(p, params.config), AdamState(m, v, state.step + 1)


class Adam:
    """The spec's Adam as a stateful object over :func:`adam_init`/:func:`adam_update`:
    ``Adam(params, config)`` with an :class:`AdamConfig`, or ``Adam(params, lr=0.01,
    num_steps=1000)`` changing fields of the spec's. ``config`` is the record, ``state``
    the :class:`AdamState`, ``t`` a host copy of its step count, ``m``/``v`` the moments
    as :class:`Params`.
    """

    def __init__(self, params: Params, config: AdamConfig | None = None, **changes: Any) -> None:
        if not isinstance(params, Params):
            raise ArgumentTypeError("params", f"Adam needs a Params, got {type(params).__name__}")
        self.config = adam_config(config, **changes)
        self.model = params.config
        self.state = adam_init(params)
        self.t = 0  # the step count, a host copy of state.step

    @property
    def num_steps(self) -> int:
        """The length of the linear decay."""
        return self.config.num_steps

    @property
    def m(self) -> Params:
        """The first moments (views of the state's flat vector where the namespace has them)."""
        return unflatten(self.state.m, self.model)

    @property
    def v(self) -> Params:
        """The second moments."""
        return unflatten(self.state.v, self.model)

    def restore(self, m: Params, v: Params, t: int) -> None:
        """Take the moments ``m``, ``v`` (:class:`Params` of the model's config) and step
        count ``t`` (``0 <= t <= num_steps``) that a checkpoint holds."""
        if not all(isinstance(r, Params) and r.config == self.model for r in (m, v)):
            raise ValueError(f"Adam's moments must be Params of {self.model}")
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= self.num_steps:
            raise ArgumentValueError("t", f"t must be an int in [0, {self.num_steps}], got {t!r}")
        step = P.full((), t, m.wte, dtype=m.xp.int64)
        self.state, self.t = AdamState(flatten(m), flatten(v), step), t

    def lr_at(self, t: int) -> float:
        """The learning rate of the ``t``-th step (0-based)."""
        return self.config.lr_at(t)

    def extend(self, num_steps: int) -> None:
        """Lengthen the schedule of a finished run to ``num_steps``."""
        self.config = adam_config(self.config, num_steps=num_steps)

    def step(self, params: Params, grads: Params) -> Params:
        """Apply one update and return the new params (the inputs are not modified).
        ``ValueError`` once ``num_steps`` steps were taken, and for ``grads`` that differ
        from ``params`` in config, namespace, device or dtype."""
        if not isinstance(grads, Params):
            raise ArgumentTypeError("grads", f"grads must be a Params, got {type(grads).__name__}")
        if grads.config != params.config:
            raise ArgumentValueError("grads", "grads and params have different configs")
        if type(grads.wte) is not type(params.wte):
            raise ArgumentTypeError(
                "grads",
                f"grads are {type(grads.wte).__name__} arrays but params {type(params.wte).__name__}",
            )
        if grads.dtype != params.dtype:
            raise ArgumentTypeError(
                "grads", f"grads have dtype {grads.dtype} but params {params.dtype}"
            )
        if str(grads.device) != str(params.device):
            raise ArgumentValueError(
                "grads", f"grads are on device {grads.device} but params on {params.device}"
            )
        params, state = adam_update(params, grads, self.state, self.config)
        self.advance(state)
        return params

    def advance(self, state: AdamState) -> None:
        """Take ``state`` as the state after one more update (what a training loop does
        with the state that :func:`adam_update` or a compiled step returned)."""
        if self.t >= self.num_steps:
            raise ValueError(f"Adam has taken all its num_steps={self.num_steps} steps")
        self.state = state
        self.t += 1

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters and step count (the moments are ``self.m`` / ``self.v``)."""
        return {**dataclasses.asdict(self.config), "t": self.t}

"""Adam with microgpt's linear learning-rate decay: pure functions over a state record,
and a thin stateful wrapper.

:func:`adam_init` and :func:`adam_update` are pure: the step count is a 0-d array in the
:class:`AdamState`, so the update has no Python state and compiles once under
``jax.jit``. :class:`Adam` keeps an :class:`AdamState` and a host copy of the step count
for the training loop and checkpoints; its results are those of :func:`adam_update`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from . import _pytree
from . import primitives as P
from ._xp import array_namespace, check_positive_int
from .params import Params, flatten, unflatten

#: The spec's hyperparameters.
LR, BETA1, BETA2, EPS, NUM_STEPS = 0.01, 0.85, 0.99, 1e-8, 1000


@dataclass(frozen=True)
class AdamState:
    """Adam's state: the first and second moments ``m`` and ``v``, each one flat
    ``(num_params,)`` vector in the layout of :func:`~microgpt_xp.params.flatten` (the
    weights' fields one after another; :func:`~microgpt_xp.params.unflatten` gives them
    back as :class:`Params`), of the weights' namespace, device and dtype; and ``step``,
    a 0-d integer array of that namespace holding the number of updates taken. A JAX
    pytree when JAX is installed."""

    m: Any
    v: Any
    step: Any


_pytree.register(
    AdamState,
    lambda s: ((s.m, s.v, s.step), None),
    lambda _, children: AdamState(*children),
)


def adam_init(params: Params) -> AdamState:
    """The state before the first update: zero moments, ``step = 0``."""
    if not isinstance(params, Params):
        raise TypeError(f"adam_init needs a Params, got {type(params).__name__}")
    zeros = P.full((params.config.num_params,), 0.0, params.wte)
    return AdamState(zeros, zeros, P.full((), 0, params.wte, dtype=params.xp.int64))


@dataclass(frozen=True)
class AdamConfig:
    """Adam's hyper-parameters and schedule as one record, bound once and passed as a
    whole (as optax binds them): the initial learning rate ``lr``, the moments' decays
    ``beta1``/``beta2``, ``eps`` (added outside the square root) and ``num_steps``, the
    length of the linear decay ``lr_t = lr * (1 - t / num_steps)``. The spec's values by
    default. Immutable and hashable (a static argument of a compiled step).

    Raises ``TypeError``/``ValueError`` unless the values are finite real numbers with
    ``lr > 0``, ``0 <= beta < 1``, ``eps > 0`` and ``num_steps`` a positive int.
    """

    lr: float = LR
    beta1: float = BETA1
    beta2: float = BETA2
    eps: float = EPS
    num_steps: int = NUM_STEPS

    def __post_init__(self) -> None:
        check_hyperparameters(self.lr, self.beta1, self.beta2, self.eps, self.num_steps)
        for name in ("lr", "beta1", "beta2", "eps"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def lr_at(self, t: int) -> float:
        """The learning rate of the ``t``-th step (0-based)."""
        return self.lr * (1 - t / self.num_steps)


def adam_config(config: AdamConfig | None = None, **changes: Any) -> AdamConfig:
    """``config`` (default: the spec's :class:`AdamConfig`) with the fields named in
    ``changes`` replaced (``TypeError`` for a name that is not a field)."""
    if config is not None and not isinstance(config, AdamConfig):
        raise TypeError(f"the optimizer must be an AdamConfig, got {type(config).__name__}")
    base = AdamConfig() if config is None else config
    unknown = set(changes) - {f.name for f in dataclasses.fields(AdamConfig)}
    if unknown:
        raise TypeError(f"unknown Adam hyper-parameters {sorted(unknown)}")
    return dataclasses.replace(base, **changes) if changes else base


def adam_update(
    params: Params,
    grads: Params,
    state: AdamState,
    config: AdamConfig | None = None,
    **changes: Any,
) -> tuple[Params, AdamState]:
    """One Adam update of ``params`` with ``grads`` (the spec's, §8) under ``config``
    (:class:`AdamConfig`, the spec's by default; ``changes`` replace some of its fields,
    e.g. ``num_steps=10``): returns the new params and state; nothing is modified.

    With ``t = state.step`` (0-based): ``lr_t = lr * (1 - t / num_steps)``,
    ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g²``,
    ``p -= lr_t (m / (1 - beta1^(t+1))) / (sqrt(v / (1 - beta2^(t+1))) + eps)``.
    Every weight moves, those with a zero gradient too (from momentum), as in the original.
    The step-dependent factors are computed in float64 and then rounded to the weights'
    dtype, as Python floats would be; ``1 - beta`` is the Python float (0.15000000000000002
    for 0.85). No value is read to the host, so the function traces under ``jax.jit``.

    The weights and gradients are updated as one flat vector each, as the moments are
    kept (a dozen array operations per step rather than a dozen per field; every
    element's arithmetic is the same).
    """
    hp = adam_config(config, **changes)
    xp = params.xp
    dtype = params.dtype
    t = xp.astype(state.step, xp.float64)
    lr_t = xp.astype(hp.lr * (1.0 - t / hp.num_steps), dtype)
    t1 = t + 1.0
    bc1 = xp.astype(1.0 - hp.beta1**t1, dtype)
    bc2 = xp.astype(1.0 - hp.beta2**t1, dtype)
    c1, c2 = 1 - hp.beta1, 1 - hp.beta2  # Python floats, evaluated as the original does
    p, g = flatten(params), flatten(grads)
    m = hp.beta1 * state.m + c1 * g
    v = hp.beta2 * state.v + c2 * (g * g)
    p = p - (lr_t * (m / bc1)) / ((v / bc2) ** 0.5 + hp.eps)
    return unflatten(p, params.config), AdamState(m, v, state.step + 1)


def check_hyperparameters(lr: Any, beta1: Any, beta2: Any, eps: Any, num_steps: Any) -> None:
    """Raise ``TypeError``/``ValueError`` unless the hyperparameters are finite real numbers
    with ``lr > 0``, ``0 <= beta < 1``, ``eps > 0`` and ``num_steps`` a positive int."""
    check_positive_int(num_steps, "num_steps")
    for name, value in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps)):
        if isinstance(value, bool) or not _is_real(value):
            raise TypeError(f"{name} must be a real number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{name} must lie in [0, 1), got {beta!r}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")


def _is_real(value: Any) -> bool:
    """A Python or NumPy real scalar (not a string, not an array of several values)."""
    import numbers

    return isinstance(value, numbers.Real)


class Adam:
    """The spec's Adam as a stateful object over :func:`adam_init`/:func:`adam_update`:
    bias-corrected moments, ``eps`` added outside the square root, and the learning rate
    decayed linearly, ``lr_t = lr * (1 - t / num_steps)`` for the ``t``-th call of
    :meth:`step` (0-based). Every parameter is updated every step, also those whose
    gradient is zero, as the original does. No weight decay, no clipping.

    ``Adam(params, config)`` takes an :class:`AdamConfig`; ``Adam(params, lr=0.01,
    num_steps=1000)`` changes fields of the spec's. ``config`` is the record (``lr``,
    ``num_steps``, ... read through it), ``state`` the :class:`AdamState`, ``t`` a host
    copy of its step count (so that the training loop never reads the device for it),
    ``m`` and ``v`` the moments.
    """

    def __init__(self, params: Params, config: AdamConfig | None = None, **changes: Any) -> None:
        if not isinstance(params, Params):
            raise TypeError(f"Adam needs a Params, got {type(params).__name__}")
        self.config = adam_config(config, **changes)
        self.model = params.config
        self.state = adam_init(params)
        self._t = 0

    @property
    def lr(self) -> float:
        """The initial learning rate."""
        return self.config.lr

    @property
    def num_steps(self) -> int:
        """The length of the linear decay."""
        return self.config.num_steps

    @property
    def t(self) -> int:
        """The number of updates taken."""
        return self._t

    @t.setter
    def t(self, value: int) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 <= value <= self.num_steps
        ):
            raise ValueError(f"t must be an int in [0, {self.num_steps}], got {value!r}")
        m = self.state.m
        step = P.full((), value, m, dtype=array_namespace(m).int64)
        self.state = AdamState(m, self.state.v, step)
        self._t = value

    @property
    def m(self) -> Params:
        """The first moments, one array per field (views of the state's flat vector where
        the namespace has views)."""
        return unflatten(self.state.m, self.model)

    @m.setter
    def m(self, value: Params) -> None:
        self.state = AdamState(flatten(self._check(value)), self.state.v, self.state.step)

    @property
    def v(self) -> Params:
        """The second moments, one array per field."""
        return unflatten(self.state.v, self.model)

    @v.setter
    def v(self, value: Params) -> None:
        self.state = AdamState(self.state.m, flatten(self._check(value)), self.state.step)

    def _check(self, record: Params) -> Params:
        if not isinstance(record, Params) or record.config != self.model:
            raise ValueError(f"Adam's moments must be Params of {self.model}")
        return record

    def lr_at(self, t: int) -> float:
        """The learning rate of the ``t``-th step (0-based)."""
        return self.config.lr_at(t)

    def extend(self, num_steps: int) -> None:
        """Lengthen the schedule of a finished run to ``num_steps`` (the learning rate then
        follows a run of the new length from the step reached on)."""
        self.config = adam_config(self.config, num_steps=num_steps)

    def step(self, params: Params, grads: Params) -> Params:
        """Apply one update and return the new params (the inputs are not modified).

        ``grads`` must have the params' config, namespace, device and dtype. Raises
        ``ValueError`` once ``num_steps`` steps have been taken, and for gradients that do
        not match the params.
        """
        if self._t >= self.num_steps:
            raise ValueError(f"Adam has taken all its num_steps={self.num_steps} steps")
        check_like(params, grads, "grads")
        params, self.state = adam_update(params, grads, self.state, self.config)
        self._t += 1
        return params

    def advance(self, state: AdamState) -> None:
        """Take ``state`` as the state after one more update (what a training loop does
        with the state that :func:`adam_update` or a compiled step returned)."""
        if self._t >= self.num_steps:
            raise ValueError(f"Adam has taken all its num_steps={self.num_steps} steps")
        self.state = state
        self._t += 1

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters and step count (the moments are ``self.m`` / ``self.v``)."""
        return {**dataclasses.asdict(self.config), "t": self._t}


def check_like(params: Params, other: Params, what: str) -> None:
    """Raise unless ``other`` is a :class:`Params` with the config, namespace, dtype and
    device of ``params`` (an update must not silently change any of them)."""
    if not isinstance(other, Params):
        raise TypeError(f"{what} must be a Params, got {type(other).__name__}")
    if other.config != params.config:
        raise ValueError(f"{what} and params have different configs")
    if type(other.wte) is not type(params.wte):
        raise TypeError(
            f"{what} are {type(other.wte).__name__} arrays but params {type(params.wte).__name__}"
        )
    if other.dtype != params.dtype:
        raise TypeError(f"{what} have dtype {other.dtype} but params {params.dtype}")
    if str(other.device) != str(params.device):
        raise ValueError(f"{what} are on device {other.device} but params on {params.device}")

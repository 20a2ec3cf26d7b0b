"""Adam with microgpt's linear learning-rate decay (or nanoGPT's warm-up, cosine decay,
decoupled weight decay and gradient clipping, :class:`AdamConfig`): pure :func:`adam_init`
and :func:`adam_update` over an :class:`AdamState` (the step count a 0-d array, so the
update compiles once under ``jax.jit``), and :class:`Adam`, a thin stateful wrapper."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from array_api_compat import device

from . import _pytree
from . import primitives as P
from ._errors import ArgumentTypeError, ArgumentValueError
from ._xp import array_namespace, check_nonnegative_int, check_positive_int
from .params import INIT_STD, Params

#: The spec's hyperparameters.
LR, BETA1, BETA2, EPS, NUM_STEPS = 0.01, 0.85, 0.99, 1e-8, 1000


@dataclass(frozen=True)
class AdamState:
    """Adam's moments ``m`` and ``v``, each a :class:`Params` of the weights' shapes,
    namespace, device and dtype (updated weight by weight, never concatenated), and
    ``step``, a 0-d int64 array counting the updates (a JAX pytree)."""

    m: Params
    v: Params
    step: Any


_pytree.register(
    AdamState, lambda s: ((s.m, s.v, s.step), None), lambda _, children: AdamState(*children)
)


def adam_init(params: Params) -> AdamState:
    """The state before the first update: zero moments, ``step = 0``."""
    if not isinstance(params, Params):
        raise ArgumentTypeError("params", f"adam_init needs a Params, got {type(params).__name__}")
    zeros = params.map(lambda a: P.full(tuple(a.shape), 0.0, a), check=False)
    return AdamState(zeros, zeros, P.full((), 0, params.wte, dtype=params.xp.int64))


#: The learning-rate decays after the warm-up (nanoGPT's ``get_lr`` is the cosine one).
DECAYS = ("linear", "cosine")
_POSITIVE = ("be positive", lambda hp, x: x > 0)
_AT_LEAST_0 = ("be at least 0", lambda hp, x: x >= 0)
_BETA = ("lie in [0, 1)", lambda hp, x: 0 <= x < 1)
#: The real-valued fields (in order: ``min_lr`` is checked against the checked ``lr``) and
#: the rule each keeps, ``(words, test(config, value))``.
_REALS: dict[str, tuple[str, Callable[[Any, float], bool]]] = {
    "lr": _POSITIVE,
    "beta1": _BETA,
    "beta2": _BETA,
    "eps": _POSITIVE,
    "min_lr": ("lie in [0, lr]", lambda hp, x: 0 <= x <= hp.lr),
    "weight_decay": _AT_LEAST_0,
    "grad_clip": _AT_LEAST_0,
    "init_std": _POSITIVE,
}


@dataclass(frozen=True)
class AdamConfig:
    """Adam's hyper-parameters, the spec's by default, bound once (as optax binds them).

    ``lr > 0`` the peak learning rate, ``0 <= beta1, beta2 < 1`` the moments' decays, ``eps
    > 0`` (added outside the square root), ``num_steps`` (a positive int) the schedule's
    length, ``warmup`` (an int in ``[0, num_steps)``), ``decay`` (``"linear"`` or
    ``"cosine"``) and ``0 <= min_lr <= lr`` the schedule of :meth:`lr_at`;
    ``weight_decay >= 0`` decoupled as ``torch.optim.AdamW`` (``p *= 1 - lr_t wd`` before
    the Adam step, every weight is a matrix); ``grad_clip >= 0`` (0: off) the bound of the
    gradients' global L2 norm (``g *= min(1, grad_clip / (norm + 1e-6))``, as
    ``torch.nn.utils.clip_grad_norm_``); ``init_std > 0`` the std of fresh weights (what
    :func:`~microgpt_xp.init_params` takes as ``std``). The defaults are the spec's (a
    linear decay to 0, no warm-up, weight decay or clipping). Immutable and hashable (a
    static argument of a compiled step); ``ArgumentTypeError``/``ArgumentValueError``
    naming the field for other values."""

    lr: float = LR
    beta1: float = BETA1
    beta2: float = BETA2
    eps: float = EPS
    num_steps: int = NUM_STEPS
    warmup: int = 0
    decay: str = "linear"
    min_lr: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 0.0
    init_std: float = INIT_STD

    def __post_init__(self) -> None:
        check_positive_int(self.num_steps, "num_steps")
        if check_nonnegative_int(self.warmup, "warmup") >= self.num_steps:
            raise ArgumentValueError(
                "warmup", f"warmup must be less than num_steps={self.num_steps}, got {self.warmup}"
            )
        if not isinstance(self.decay, str):
            raise ArgumentTypeError("decay", f"decay must be a str, got {self.decay!r}")
        if self.decay not in DECAYS:
            raise ArgumentValueError(
                "decay", f"decay must be one of {', '.join(DECAYS)}, got {self.decay!r}"
            )
        for name, (rule, test) in _REALS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ArgumentTypeError(name, f"{name} must be a real number, got {value!r}")
            x = float(value)
            if not math.isfinite(x):
                raise ArgumentValueError(name, f"{name} must be finite, got {value!r}")
            if not test(self, x):
                raise ArgumentValueError(name, f"{name} must {rule}, got {value!r}")
            object.__setattr__(self, name, x)

    def lr_at(self, t: int) -> float:
        """The learning rate of the ``t``-th step (0-based), nanoGPT's ``get_lr``: ``lr (t +
        1) / (warmup + 1)`` for ``t < warmup``, then with ``r = (t - warmup) / (num_steps -
        warmup)``: ``min_lr + (lr - min_lr) (1 - r)`` (linear; the spec's ``lr (1 - t /
        num_steps)`` by default) or ``min_lr + (1 + cos(pi r)) / 2 (lr - min_lr)``
        (cosine)."""
        return float(_schedule(self, t, math.cos, lambda c, a, b: a if c else b))


def _schedule(hp: AdamConfig, t: Any, cos: Any, where: Any) -> Any:
    """:meth:`AdamConfig.lr_at` of ``t`` (an int, or a float64 array with the namespace's
    ``cos`` and ``where``); the features that are off (static values) are left out of the
    expression, so the spec's schedule keeps its exact rounding."""
    lr, lo, w = hp.lr, hp.min_lr, hp.warmup
    if hp.decay == "linear" and lo == 0.0 and w == 0:
        return lr * (1.0 - t / hp.num_steps)  # the spec's
    r = (t - w) / (hp.num_steps - w)
    if hp.decay == "cosine":
        decayed = lo + 0.5 * (1.0 + cos(math.pi * r)) * (lr - lo)
    else:
        decayed = lo + (lr - lo) * (1.0 - r)
    return decayed if w == 0 else where(t < w, lr * (t + 1.0) / (w + 1.0), decayed)


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
    """One Adam update (spec §8) of ``params`` with ``grads`` under ``config`` (the spec's
    by default; ``changes`` replace fields); returns the new ``(params, state)``.

    With ``t = state.step`` and ``lr_t`` = :meth:`AdamConfig.lr_at` of ``t``: if
    ``grad_clip``, ``g *= min(1, grad_clip / (|g| + 1e-6))`` with ``|g|`` the L2 norm of all
    the gradients; if ``weight_decay``, ``p *= 1 - lr_t weight_decay``; then ``m = b1 m +
    (1 - b1) g``, ``v = b2 v + (1 - b2) g²``, ``p -= lr_t (m / (1 - b1^(t+1))) / (sqrt(v /
    (1 - b2^(t+1))) + eps)`` on every weight. The schedule's factors in float64, rounded
    to the weights' dtype; the norm in that dtype; nothing is read to the host."""
    hp = adam_config(config, **changes)
    p, m, v, step = adam_arrays(
        params.arrays(), grads.arrays(), state.m.arrays(), state.v.arrays(), state.step, hp
    )
    cfg = params.config
    return Params.trusted(cfg, p), AdamState(Params.trusted(cfg, m), Params.trusted(cfg, v), step)


Arrays = dict[str, Any]


def adam_arrays(
    params: Arrays, grads: Arrays, m: Arrays, v: Arrays, step: Any, hp: AdamConfig
) -> tuple[Arrays, Arrays, Arrays, Any]:
    """:func:`adam_update`'s math over any arrays of one namespace, dtype and device, keyed
    alike in the four dicts (the weights one by one, or one flat vector as the exported
    train_step graph has them) -> ``(params, m, v, step + 1)``, new dicts of the same keys."""
    first = next(iter(params.values()))
    xp, dtype = array_namespace(first), first.dtype
    t = xp.astype(step, xp.float64)
    lr64 = _schedule(hp, t, xp.cos, xp.where)
    lr_t = xp.astype(lr64, dtype)
    bc1 = xp.astype(1.0 - hp.beta1 ** (t + 1.0), dtype)
    bc2 = xp.astype(1.0 - hp.beta2 ** (t + 1.0), dtype)
    keep = xp.astype(1.0 - lr64 * hp.weight_decay, dtype) if hp.weight_decay else None
    scale = None
    if hp.grad_clip:  # every weight's sum of squares, in the keys' order
        norm = xp.sqrt(sum(xp.sum(g * g) for g in grads.values()))
        scale = xp.clip(hp.grad_clip / (norm + 1e-6), max=1.0)

    # the Python floats as 0-d arrays of the weights' dtype, the values they are rounded to
    # anyway (NumPy multiplies by a 0-d array in about half the time)
    b1, c1, b2, c2, eps = (
        xp.asarray(x, dtype=dtype, device=device(first))
        for x in (hp.beta1, 1 - hp.beta1, hp.beta2, 1 - hp.beta2, hp.eps)
    )
    new: tuple[Arrays, Arrays, Arrays] = ({}, {}, {})
    # weight by weight: faster than one concatenated vector on NumPy (no copies in and
    # out, arrays that stay in cache) and possible where chunkings differ (Dask)
    for f, p in params.items():
        g, m_f, v_f = grads[f], m[f], v[f]
        if scale is not None:
            g = g * scale
        if keep is not None:
            p = p * keep
        m_f = b1 * m_f + c1 * g
        v_f = b2 * v_f + c2 * (g * g)
        new[0][f], new[1][f], new[2][f] = (
            p - (lr_t * (m_f / bc1)) / (xp.sqrt(v_f / bc2) + eps),
            m_f,
            v_f,
        )
    return new[0], new[1], new[2], step + 1


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
        """The length of the learning-rate schedule."""
        return self.config.num_steps

    @property
    def m(self) -> Params:
        """The first moments."""
        return self.state.m

    @property
    def v(self) -> Params:
        """The second moments."""
        return self.state.v

    def restore(self, m: Params, v: Params, t: int) -> None:
        """Take the moments ``m``, ``v`` (:class:`Params` of the model's config) and step
        count ``t`` (``0 <= t <= num_steps``) that a checkpoint holds."""
        if not all(isinstance(r, Params) and r.config == self.model for r in (m, v)):
            raise ValueError(f"Adam's moments must be Params of {self.model}")
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= self.num_steps:
            raise ArgumentValueError("t", f"t must be an int in [0, {self.num_steps}], got {t!r}")
        step = P.full((), t, m.wte, dtype=m.xp.int64)
        self.state, self.t = AdamState(m, v, step), t

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
        for what, got, want, error in (
            ("configs", grads.config, params.config, ArgumentValueError),
            ("array types", type(grads.wte).__name__, type(params.wte).__name__, ArgumentTypeError),
            ("dtypes", grads.dtype, params.dtype, ArgumentTypeError),
            ("devices", str(grads.device), str(params.device), ArgumentValueError),
        ):
            if got != want:
                raise error(
                    "grads",
                    f"grads and params have different {what}: grads are {got}, params {want}",
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

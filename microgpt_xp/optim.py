"""Adam with microgpt's linear learning-rate decay."""

from __future__ import annotations

import math
from typing import Any

from . import _xp
from .params import FIELDS, Params, field_shapes


class Adam:
    """The spec's Adam: bias-corrected moments, ``eps`` added outside the square root, and
    the learning rate decayed linearly, ``lr_t = lr * (1 - t / num_steps)`` for the
    ``t``-th call of :meth:`step` (0-based). Every parameter is updated every step, also
    those whose gradient is zero (they keep moving from momentum), as the original does.

    The moments ``m`` and ``v`` are :class:`Params` on the params' namespace, device and
    dtype; ``t`` counts the steps taken. No weight decay, no clipping.

    On eager backends all fields are updated as one flat vector, a dozen array
    operations a step instead of a dozen per field (the arithmetic of every element is the
    same, so are the results). Lazy (Dask) records are updated field by field, keeping
    each field's chunks: flattening would merge and re-split them step after step.
    """

    def __init__(
        self,
        params: Params,
        lr: float = 0.01,
        beta1: float = 0.85,
        beta2: float = 0.99,
        eps: float = 1e-8,
        num_steps: int = 1000,
    ) -> None:
        if not isinstance(params, Params):
            raise TypeError(f"Adam needs a Params, got {type(params).__name__}")
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {beta!r}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.lr, self.beta1, self.beta2, self.eps = (
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
        )
        self.num_steps = num_steps
        self.config = params.config
        shapes = field_shapes(params.config)
        self._layout = [(name, shapes[name], math.prod(shapes[name])) for name in FIELDS]
        self._flat = not _xp.is_lazy(params.wte)
        zeros = params.map(params.xp.zeros_like)
        self._m: Any = self._pack(zeros)
        self._v: Any = self._pack(zeros)
        # the flat vector of the last params this optimizer returned, to skip re-flattening
        self._last: tuple[tuple[Any, ...], Any] | None = None
        self.t = 0

    # -- the state's layout --------------------------------------------------------------
    def _pack(self, record: Params) -> Any:
        """A record in the internal layout: one flat vector, or the record itself."""
        if record.config != self.config:
            raise ValueError(f"a record of {record.config} given to Adam for {self.config}")
        if not self._flat:
            return record
        xp = record.xp
        return xp.concat([xp.reshape(getattr(record, name), (-1,)) for name in FIELDS])

    def _unpack(self, packed: Any) -> Params:
        """The inverse of :meth:`_pack` (views of the flat vector)."""
        if not self._flat:
            return packed  # type: ignore[no-any-return]
        xp = _xp.array_namespace(packed)
        fields, offset = {}, 0
        for name, shape, size in self._layout:
            fields[name] = xp.reshape(packed[offset : offset + size], shape)
            offset += size
        return Params.trusted(self.config, fields)

    @property
    def m(self) -> Params:
        """The first moments, one array per field."""
        return self._unpack(self._m)

    @m.setter
    def m(self, value: Params) -> None:
        self._m = self._pack(value)

    @property
    def v(self) -> Params:
        """The second moments, one array per field."""
        return self._unpack(self._v)

    @v.setter
    def v(self, value: Params) -> None:
        self._v = self._pack(value)

    @property
    def moments(self) -> tuple[Any, Any]:
        """``(m, v)`` in the optimizer's own layout (two ``(num_params,)`` vectors in the
        spec's field order on eager backends, two :class:`Params` on lazy ones): what a
        training loop keeps, restores or evaluates (``materialize``) without any copying.
        Assign back only what this property returned (or its materialized form)."""
        return self._m, self._v

    @moments.setter
    def moments(self, value: tuple[Any, Any]) -> None:
        self._m, self._v = value

    def lr_at(self, t: int) -> float:
        """The learning rate of the ``t``-th step (0-based)."""
        return self.lr * (1 - t / self.num_steps)

    def step(self, params: Params, grads: Params) -> Params:
        """Apply one update and return the new params (the inputs are not modified).

        ``grads`` must have the params' config, namespace, device and dtype. Raises
        ``ValueError`` once ``num_steps`` steps have been taken.
        """
        if self.t >= self.num_steps:
            raise ValueError(f"Adam has taken all its num_steps={self.num_steps} steps")
        if grads.config != params.config:
            raise ValueError("grads and params have different configs")
        t = self.t
        lr_t = self.lr_at(t)
        b1, b2, eps = self.beta1, self.beta2, self.eps
        # Python floats, evaluated as the original does: (1 - beta) is 0.15000000000000002.
        c1, c2 = 1 - b1, 1 - b2
        bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)

        def update(p: Any, g: Any, m: Any, v: Any) -> tuple[Any, Any, Any]:
            m = b1 * m + c1 * g
            v = b2 * v + c2 * (g * g)
            return p - (lr_t * (m / bc1)) / ((v / bc2) ** 0.5 + eps), m, v

        self.t = t + 1
        if not self._flat:
            out = {
                name: update(*(getattr(r, name) for r in (params, grads, self._m, self._v)))
                for name in FIELDS
            }
            self._m = Params.trusted(self.config, {k: o[1] for k, o in out.items()})
            self._v = Params.trusted(self.config, {k: o[2] for k, o in out.items()})
            return Params.trusted(self.config, {k: o[0] for k, o in out.items()})
        arrays = tuple(getattr(params, name) for name in FIELDS)
        last = self._last
        if last is not None and all(a is b for a, b in zip(arrays, last[0], strict=True)):
            flat = last[1]
        else:
            flat = self._pack(params)
        new, self._m, self._v = update(flat, self._pack(grads), self._m, self._v)
        result = self._unpack(new)
        self._last = (tuple(getattr(result, name) for name in FIELDS), new)
        return result

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters and step count (the moments are ``self.m`` / ``self.v``)."""
        return {
            "lr": self.lr,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "eps": self.eps,
            "num_steps": self.num_steps,
            "t": self.t,
        }

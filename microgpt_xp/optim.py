"""Adam with microgpt's linear learning-rate decay."""

from __future__ import annotations

from typing import Any

from .params import Params


class Adam:
    """The spec's Adam: bias-corrected moments, ``eps`` added outside the square root, and
    the learning rate decayed linearly, ``lr_t = lr * (1 - t / num_steps)`` for the
    ``t``-th call of :meth:`step` (0-based). Every parameter is updated every step, also
    those whose gradient is zero (they keep moving from momentum), as the original does.

    The moments ``m`` and ``v`` are :class:`Params` on the params' namespace, device and
    dtype; ``t`` counts the steps taken. No weight decay, no clipping.
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
        xp = params.xp
        self.m: Params = params.map(xp.zeros_like)
        self.v: Params = params.map(xp.zeros_like)
        self.t = 0

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
        b1, b2 = self.beta1, self.beta2
        # Python floats, evaluated as the original does: (1 - beta) is 0.15000000000000002.
        c1, c2 = 1 - b1, 1 - b2
        bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
        self.m = self.m.map(lambda m, g: b1 * m + c1 * g, grads, check=False)
        self.v = self.v.map(lambda v, g: b2 * v + c2 * (g * g), grads, check=False)

        def update(p: Any, m: Any, v: Any) -> Any:
            return p - (lr_t * (m / bc1)) / ((v / bc2) ** 0.5 + self.eps)

        self.t = t + 1
        return params.map(update, self.m, self.v, check=False)

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

"""The targets that ``--check-targets`` checks: a small table, each row naming what it
compares. A target is a minimum of the median per-round ratio ours/peer (tokens/s) for one
case, with ours running in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

from .workloads import Case, torch_device_like


@dataclass(frozen=True)
class Target:
    """At least ``minimum`` x the peer's tokens/s for ours on ``backend`` (on the CPU), on
    ``workload`` with the named ``config``, ``batch`` and ``dtype``. ``what`` says in words
    what is compared."""

    what: str
    backend: str
    workload: str
    config: str
    batch: int
    peer: str
    minimum: float
    dtype: str = "float32"

    def applies(self, case: Case, peer: str) -> bool:
        """Whether this target is the one for ``case`` against ``peer``."""
        return (
            (case.backend, case.workload, case.config_name, case.batch, case.dtype, peer)
            == (self.backend, self.workload, self.config, self.batch, self.dtype, self.peer)
            and torch_device_like(case.backend, case.params().device) == "cpu"
            and case.torch_device() == "cpu"
        )


_NUMPY = "ours on NumPy (float32, one process) against PyTorch eager on the CPU"
_TORCH = "PyTorch tensors on the CPU through our code against PyTorch autograd eager"

#: The targets of the current work items.
TARGETS: tuple[Target, ...] = (
    Target(_NUMPY, "numpy", "train", "default", 64, "torch", 2.0),
    Target(_NUMPY, "numpy", "train", "medium", 32, "torch", 1.0),
    Target(_TORCH, "torch", "train", "default", 64, "torch", 1.0),
    Target(_TORCH, "torch", "train", "medium", 32, "torch", 1.0),
)


def target_for(case: Case, peer: str) -> Target | None:
    """The target of ``case`` against ``peer``, or ``None`` where there is none."""
    return next((t for t in TARGETS if t.applies(case, peer)), None)

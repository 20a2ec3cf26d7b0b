"""Model hyperparameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ._errors import ArgumentTypeError, ArgumentValueError


@dataclass(frozen=True)
class GPTConfig:
    """microgpt's hyperparameters, the spec's by default: ``vocab_size`` V (characters +
    BOS, at least 2), ``n_layer`` L blocks, ``n_embd`` C channels (divisible by ``n_head``),
    ``n_head`` H heads and ``block_size`` T positions. ``TypeError`` for non-integers,
    ``ValueError`` for other values out of range."""

    vocab_size: int
    n_layer: int = 1
    n_embd: int = 16
    n_head: int = 4
    block_size: int = 16

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentTypeError(name, f"GPTConfig.{name} must be an int, got {value!r}")
            if value < 1:
                raise ArgumentValueError(name, f"GPTConfig.{name} must be positive, got {value}")
        if self.vocab_size < 2:
            raise ArgumentValueError(
                "vocab_size",
                f"GPTConfig.vocab_size must be at least 2 (BOS and one character), got "
                f"{self.vocab_size}",
            )
        if self.n_embd % self.n_head != 0:
            raise ArgumentValueError(
                "n_head",
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})",
            )

    @property
    def head_dim(self) -> int:
        """Channels per attention head, ``n_embd // n_head``."""
        return self.n_embd // self.n_head

    @property
    def num_params(self) -> int:
        """Total number of weights (4192 for the spec's model)."""
        c, v = self.n_embd, self.vocab_size
        return 2 * v * c + self.block_size * c + self.n_layer * 12 * c * c

    def to_dict(self) -> dict[str, int]:
        """The config as a plain dict (for checkpoints and JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown GPTConfig keys: {sorted(unknown)}")
        return cls(**d)

"""Model hyperparameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GPTConfig:
    """microgpt's hyperparameters (the spec's defaults: one layer, 16 channels, 4 heads,
    16 positions).

    Attributes:
        vocab_size: V, number of token ids (characters + BOS; 27 for names).
        n_layer: L, number of transformer blocks.
        n_embd: C, width of the residual stream; must be divisible by ``n_head``.
        n_head: H, attention heads; each has ``head_dim = n_embd // n_head`` channels.
        block_size: T, the longest sequence (number of positions) the model reads.

    Raises ``ValueError`` for non-positive sizes, ``vocab_size < 2`` or ``n_embd % n_head
    != 0``, and ``TypeError`` for non-integers.
    """

    vocab_size: int
    n_layer: int = 1
    n_embd: int = 16
    n_head: int = 4
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_embd", "n_head", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"GPTConfig.{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"GPTConfig.{name} must be positive, got {value}")
        if self.vocab_size < 2:
            raise ValueError(
                f"GPTConfig.vocab_size must be at least 2 (BOS and one character), got "
                f"{self.vocab_size}"
            )
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
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
        unknown = set(d) - {"vocab_size", "n_layer", "n_embd", "n_head", "block_size"}
        if unknown:
            raise ValueError(f"unknown GPTConfig keys: {sorted(unknown)}")
        return cls(**d)

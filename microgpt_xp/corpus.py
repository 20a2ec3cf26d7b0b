"""Corpora that hand out documents by position (a worker's task makes its own), and the
encoding of a chunk of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .data import DataError, Tokenizer, encode_docs, epoch_positions


@runtime_checkable
class Corpus(Protocol):
    """A corpus that hands out documents by position; cheap to pickle (it travels with
    every task)."""

    def __len__(self) -> int:
        """Number of documents."""
        ...

    def docs(self, start: int, stop: int) -> list[str]:
        """Documents ``start .. stop - 1`` in corpus order."""
        ...


@dataclass(frozen=True)
class ShuffledRepeat:
    """``num_docs`` documents: ``base`` repeated in epochs, each a permutation (the order of
    :func:`~microgpt_xp.data.batch_indices`, :func:`~microgpt_xp.data.epoch_positions`);
    only ``base`` is held, :meth:`docs` builds a slice on demand."""

    base: tuple[str, ...]
    num_docs: int
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", tuple(self.base))
        if not self.base:
            raise DataError("ShuffledRepeat needs at least one base document")
        if isinstance(self.num_docs, bool) or not isinstance(self.num_docs, int):
            raise TypeError(f"num_docs must be an int, got {self.num_docs!r}")
        if self.num_docs < 1:
            raise DataError(f"num_docs must be positive, got {self.num_docs}")

    def __len__(self) -> int:
        return self.num_docs

    def docs(self, start: int, stop: int) -> list[str]:
        """Documents ``start .. stop - 1`` (clipped to ``[0, num_docs)``)."""
        start, stop = max(0, start), min(stop, self.num_docs)
        if start >= stop:
            return []
        positions = epoch_positions(len(self.base), start, stop - start, self.seed)
        return [self.base[j] for j in positions.tolist()]

    def max_doc_len(self) -> int:
        """Characters in the longest document."""
        return max(len(d) for d in self.base)


Source = Corpus | Sequence[str]


def is_corpus(source: Any) -> bool:
    """Whether ``source`` is a :class:`Corpus` (not a plain sequence of strings)."""
    return isinstance(source, Corpus) and not isinstance(source, (str, list, tuple))


def check_source(source: Any) -> int:
    """The number of documents of a :class:`Corpus` or sequence of strings (``TypeError``
    for anything else, :class:`~microgpt_xp.data.DataError` for none)."""
    if isinstance(source, str) or not hasattr(source, "__len__"):
        raise TypeError("source must be a Corpus or a sequence of document strings")
    n = len(source)
    if n < 1:
        raise DataError("the corpus holds no documents")
    return n


def encode(tokenizer: Tokenizer, docs: list[str], block_size: int, start: int) -> Any:
    """:func:`~microgpt_xp.data.encode_docs` of corpus documents ``start..``, a
    :class:`~microgpt_xp.data.DataError` naming those positions if one cannot be encoded."""
    try:
        return encode_docs(tokenizer, docs, block_size)
    except ValueError as exc:
        raise DataError(f"documents {start}..{start + len(docs) - 1}: {exc}") from exc

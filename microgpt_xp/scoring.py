"""Scoring a corpus a chunk of documents at a time on a runner (``eval``, held-out loss)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _xp
from ._errors import ArgumentTypeError
from .corpus import Source, check_source, encode, is_corpus
from .data import DataError, Tokenizer, check_tokenizer, predicted
from .model import score
from .params import Params
from .resources import score_chunk
from .runners import Local, Runner, chunk_bounds, pick


@dataclass(frozen=True)
class ScoreSummary:
    """The mean loss over documents and over predicted tokens, the number of documents, and
    the per-document ``losses (N,)`` (float64) and ``num_predictions (N,)``."""

    mean: float
    token_mean: float
    num_docs: int
    losses: np.ndarray | None = None
    num_predictions: np.ndarray | None = None


def score_texts(
    params: Params,
    positions: np.ndarray,
    docs: np.ndarray,
    tokenizer: Tokenizer,
    chunk_size: int,
    jit: bool | None = None,
) -> np.ndarray:
    """A shard of :func:`score_docs`: ``docs`` (object array) at consecutive ``positions`` ->
    ``(n, 3)`` float64 ``[loss, loss * predictions, predictions]``, in pieces cut at multiples
    of ``chunk_size`` (each document padded, and scored, as in one process)."""
    first = int(positions[0]) if len(positions) else 0
    parts = []
    for a, b in _pieces(first, len(docs), chunk_size):
        tokens, lengths = encode(tokenizer, list(docs[a:b]), params.config.block_size, first + a)
        parts.append(score_rows(params, tokens, lengths, jit))
    return np.concatenate(parts, axis=0)


def _pieces(first: int, n: int, chunk_size: int) -> list[tuple[int, int]]:
    """The ``(a, b)`` pieces of rows ``0..n`` starting at position ``first``, cut at multiples
    of ``chunk_size``."""
    cuts = [0, *range(-first % chunk_size or chunk_size, n, chunk_size), n]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def score_encoded_rows(
    params: Params,
    positions: np.ndarray,
    tokens: np.ndarray,
    lengths: np.ndarray,
    chunk_size: int,
    jit: bool | None = None,
) -> np.ndarray:
    """A shard of :func:`score_encoded`: as :func:`score_texts`, of encoded rows."""
    first = int(positions[0]) if len(positions) else 0
    parts = [
        score_rows(params, tokens[a:b], lengths[a:b], jit)
        for a, b in _pieces(first, len(lengths), chunk_size)
    ]
    return np.concatenate(parts, axis=0)


def score_positions(
    params: Params,
    positions: np.ndarray,
    corpus: Any,
    tokenizer: Tokenizer,
    chunk_size: int,
    jit: bool | None = None,
) -> np.ndarray:
    """:func:`score_texts` of a corpus's documents at ``positions``, made in the task."""
    start, stop = (int(positions[0]), int(positions[-1]) + 1) if len(positions) else (0, 0)
    docs = corpus.docs(start, stop)
    if len(docs) != stop - start:
        raise DataError(
            f"the corpus returned {len(docs)} documents for positions {start}..{stop - 1}"
        )
    texts = np.empty(len(docs), dtype=object)
    texts[:] = docs
    return score_texts(params, positions, texts, tokenizer, chunk_size, jit)


def score_rows(
    params: Params, tokens: np.ndarray, lengths: np.ndarray, jit: bool | None = None
) -> np.ndarray:
    """:func:`score_texts`'s ``(n, 3)`` columns of ``tokens (n, L)``, ``lengths (n,)``."""
    tok, lens = _xp.to_batch(tokens, lengths, params.backend, device=params.device)
    losses = _xp.to_numpy(score(params, tok, lens, jit=jit, check=False))  # encoded here
    n = predicted(lengths, params.config.block_size)
    loss64, n64 = losses.astype(np.float64), n.astype(np.float64)
    return np.stack([loss64, loss64 * n64, n64], axis=1)


def score_docs(
    params: Params,
    tokenizer: Tokenizer,
    source: Source,
    *,
    chunk_size: int | None = None,
    callback: Any = None,
    jit: bool | None = None,
    runner: Runner | None = None,
) -> ScoreSummary:
    """Score every document of ``source`` (strings or a :class:`~microgpt_xp.corpus.Corpus`)
    ``chunk_size`` at a time (default :func:`~microgpt_xp.resources.score_chunk`) on ``runner``
    (default this process, with ``jit``), the same wherever it runs, calling ``callback(done,
    total)`` as it goes -> :class:`ScoreSummary`."""
    if not isinstance(params, Params):
        raise ArgumentTypeError("params", f"params must be a Params, got {type(params).__name__}")
    params, runner, chunk_size = _setup(params, runner, _xp.check_jit(jit), chunk_size)
    check_tokenizer(tokenizer, params.config.vocab_size)
    n = check_source(source)
    parts = []
    for start, stop in chunk_bounds(n, chunk_size if isinstance(runner, Local) else n):
        positions, args = np.arange(start, stop), (tokenizer, chunk_size, runner.jit)
        if is_corpus(source):
            parts += runner.map(score_positions, params, [positions], source, *args)
        else:
            texts = np.empty(stop - start, dtype=object)
            texts[:] = list(source[start:stop])  # type: ignore[index]
            parts += runner.map(score_texts, params, [positions, texts], *args)
        if callback is not None:
            callback(stop, n)
    return _summary(np.concatenate(parts, axis=0))


def score_encoded(
    params: Params,
    tokens: np.ndarray,
    lengths: np.ndarray,
    *,
    chunk_size: int | None = None,
    runner: Runner | None = None,
) -> ScoreSummary:
    """:func:`score_docs` of encoded host rows ``tokens (N, L)``, ``lengths (N,)`` (documents or
    windows of text), ``chunk_size`` at a time on ``runner``."""
    params, runner, chunk_size = _setup(params, runner, None, chunk_size)
    n, parts = len(lengths), []
    for start, stop in chunk_bounds(n, chunk_size if isinstance(runner, Local) else n):
        rows = [np.arange(start, stop), tokens[start:stop], lengths[start:stop]]
        parts += runner.map(score_encoded_rows, params, rows, chunk_size, runner.jit)
    return _summary(np.concatenate(parts, axis=0))


def _setup(
    params: Params, runner: Runner | None, jit: bool | None, chunk_size: int | None
) -> tuple[Params, Runner, int]:
    """The runner, the params placed there and the chunk size, defaults filled and checked."""
    if runner is None:
        runner = pick(None, params.backend, jit=jit)
    elif not isinstance(runner, Runner):
        raise ArgumentTypeError("runner", f"runner must be a Runner, got {type(runner).__name__}")
    params = runner.place(params)
    if chunk_size is None:
        chunk_size = score_chunk(params.config, dtype=_xp.dtype_name(params.wte))
    _xp.check_positive_int(chunk_size, "chunk_size", most=_xp.NATIVE_INT_MAX)
    return params, runner, chunk_size


def _summary(cols: np.ndarray) -> ScoreSummary:
    """The :class:`ScoreSummary` of the ``(N, 3)`` columns of :func:`score_texts`."""
    return ScoreSummary(
        mean=float(np.mean(cols[:, 0])),
        token_mean=float(cols[:, 1].sum() / cols[:, 2].sum()),
        num_docs=len(cols),
        losses=cols[:, 0],
        num_predictions=cols[:, 2].astype(np.int64),
    )

"""Scoring a corpus eagerly, a chunk of documents at a time, on a runner: the mean loss
that ``eval`` and the held-out loss of training report."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _xp
from .corpus import Source, check_source, docs_of, encode
from .data import Tokenizer
from .model import score
from .params import Params
from .resources import score_chunk
from .runners import Local, Runner, chunk_bounds


@dataclass(frozen=True)
class ScoreSummary:
    """Computed results of :class:`CorpusScore`: the mean over documents of their losses,
    the mean over all predicted tokens, the number of documents and, when asked for,
    the per-document ``losses (N,)`` and ``num_predictions (N,)``."""

    mean: float
    token_mean: float
    num_docs: int
    losses: np.ndarray | None = None
    num_predictions: np.ndarray | None = None


def _score_docs(
    params: Params, tokenizer: Tokenizer, docs: list[str], start: int, jit: bool | None = None
) -> np.ndarray:
    """``(len(docs), 3)`` float64 ``[loss, loss * predictions, predictions]`` per document
    (the columns whose sums give both means), scored on the params' backend and device;
    ``start`` is the position of ``docs[0]`` in the corpus (for error messages); ``jit`` as
    in :func:`microgpt_xp.score`."""
    tokens, lengths = encode(tokenizer, docs, params.config.block_size, start)
    return score_rows(params, tokens, lengths, jit)


def score_texts(
    params: Params, docs: np.ndarray, positions: np.ndarray, tokenizer: Tokenizer, chunk_size: int
) -> np.ndarray:
    """A runner's shard of :func:`score_docs`: the documents ``docs`` (an object array;
    ``positions`` theirs in the corpus, consecutive) scored in the chunks :func:`score_docs`
    makes in one process — cut where the corpus position is a multiple of ``chunk_size``
    — so that each document is padded, and scored, exactly as there."""
    first = int(positions[0]) if len(positions) else 0
    cuts = [0, *range(-first % chunk_size or chunk_size, len(docs), chunk_size), len(docs)]
    parts = [
        _score_docs(params, tokenizer, list(docs[a:b]), first + a)
        for a, b in itertools.pairwise(cuts)
        if b > a
    ]
    return np.concatenate(parts, axis=0)


def score_rows(
    params: Params, tokens: np.ndarray, lengths: np.ndarray, jit: bool | None = None
) -> np.ndarray:
    """:func:`_score_docs` of encoded documents ``tokens (n, L)``, ``lengths (n,)``."""
    tok, lens = _xp.to_batch(tokens, lengths, params.backend, device=params.device)
    losses = _xp.to_numpy(score(params, tok, lens, jit=jit))
    n = np.minimum(lengths - 1, params.config.block_size)
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
    """Score every document of a corpus, ``chunk_size`` documents at a time (default:
    :func:`~microgpt_xp.resources.score_chunk`, the fastest size whose activations stay
    within a budget), on the
    params' own backend and device (the eager twin of
    :func:`microgpt_xp.scale.score_corpus`, which builds one lazy Dask graph).

    ``source`` is a sequence of strings or a :class:`~microgpt_xp.corpus.Corpus`.
    ``callback(done, total)``, if given, is called after each chunk with the number of
    documents scored so far. ``runner`` spreads each chunk's rows over workers
    (:mod:`microgpt_xp.runners`; default: this process, where ``jit`` is
    :func:`microgpt_xp.score`'s: ``None`` compiles where the backend has a compiler, JAX
    once per chunk shape). Returns a :class:`ScoreSummary` with the per-document
    ``losses (N,)`` (float64) and ``num_predictions (N,)``.
    """
    _xp.check_jit(jit)
    runner = Local(jit) if runner is None else runner
    if not isinstance(runner, Runner):
        raise TypeError(f"runner must be a Runner, got {type(runner).__name__}")
    if not isinstance(params, Params):
        raise TypeError(f"params must be a Params, got {type(params).__name__}")
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}")
    if tokenizer.vocab_size != params.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model {params.config.vocab_size}"
        )
    if chunk_size is None:
        chunk_size = score_chunk(params.config, dtype=_xp.dtype_name(params.wte))
    _xp.check_positive_int(chunk_size, "chunk size")
    n = check_source(source)
    if runner.shards:  # the runner spreads the documents; each shard scores its own chunks
        rows = [np.asarray(docs_of(source, 0, n), dtype=object), np.arange(n)]
        parts = runner.map(score_texts, params, rows, tokenizer, chunk_size)
        if callback is not None:
            callback(n, n)
    else:
        parts = []
        for start, stop in chunk_bounds(n, chunk_size):
            docs = docs_of(source, start, stop)
            parts.append(_score_docs(params, tokenizer, docs, start, runner.jit))
            if callback is not None:
                callback(stop, n)
    cols = np.concatenate(parts, axis=0)
    return ScoreSummary(
        mean=float(np.mean(cols[:, 0])),
        token_mean=float(cols[:, 1].sum() / cols[:, 2].sum()),
        num_docs=n,
        losses=cols[:, 0],
        num_predictions=cols[:, 2].astype(np.int64),
    )

"""Corpus-scale scoring and generation, each one Dask computation chunked along the batch.

:func:`score_corpus` gives the per-document loss (:func:`microgpt_xp.score`) of a corpus
of any size and its mean; :func:`generate` draws any number of samples through the KV
cache. Both build one Dask graph with one task per chunk of documents:

- the documents of a chunk are produced and encoded *inside* its task, from a
  :class:`Corpus` (which returns the documents ``start..stop`` on demand, e.g.
  :class:`ShuffledRepeat`) or from a per-chunk slice of a list, so no ``(N, L)`` token
  array is ever built on the host and the peak memory is set by the chunk size;
- the weights (and the corpus object) enter the graph once, as one key every chunk
  depends on, or as a ``client.scatter(..., broadcast=True)`` future, so they reach
  each worker once per computation, not once per chunk;
- the mean loss is a Dask tree reduction (``split_every`` chunks combined per node).

The model runs inside each task on ``chunk_backend`` (NumPy by default; any backend of
:mod:`microgpt_xp._xp` that the workers have, e.g. CuPy on GPU workers). With
``method="graph"`` the scoring instead runs :func:`microgpt_xp.score` on Dask arrays, so
every layer of the model becomes tasks of the graph (about 60 per chunk): the same
numbers, kept to measure what the per-chunk task saves.

The computations run on whatever Dask scheduler is active: threads by default, or a
``dask.distributed`` cluster after :func:`microgpt_xp.cluster.connect`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from . import _xp
from ._files import atomic_write
from .cluster import ClusterError, computing
from .corpus import Corpus, ShuffledRepeat, Source, chunk_docs, encode, is_corpus
from .data import DataError, Tokenizer
from .model import score
from .params import Params
from .resources import score_chunk
from .runners import chunk_bounds, host_params, run_on
from .runners.dask import (
    Weights,
    check_chunk_backend,
    check_chunk_size,
    dask_modules,
    imports_settled,
    spec_array,
    weights_node,
)
from .sample import check_temperature, decode_batch, row_uniforms
from .scoring import ScoreSummary, score_docs, score_texts

__all__ = [
    "Corpus",
    "CorpusScore",
    "GraphStats",
    "ScoreSummary",
    "ShuffledRepeat",
    "generate",
    "generate_names",
    "graph_stats",
    "row_uniforms",
    "score_corpus",
    "score_docs",
    "write_names",
    "write_scores",
]

Method = Literal["task", "graph"]

#: Default documents per chunk: large enough that the per-task overhead is small,
#: small enough that a chunk's activations stay in the tens of MB.
DEFAULT_CHUNK_SIZE = 8192


def _chunks_of(source: Source, chunk_size: int) -> tuple[Any, Any, list[int]]:
    """``(specs, corpus, sizes)``: the per-chunk specs ``(start, stop, docs | None)``, the
    corpus as one graph key (``None`` for a list, whose slices sit in the specs) and the
    chunk sizes."""
    dask, _ = dask_modules()
    n = len(source)
    if n < 1:
        raise DataError("the corpus holds no documents")
    bounds = chunk_bounds(n, chunk_size)
    if is_corpus(source):
        # Named, not tokenized: hashing an arbitrary corpus object may pickle it whole.
        tag = uuid.uuid4().hex
        corpus = dask.delayed(source, name=f"microgpt-corpus-{tag}", traverse=False)
        payload: list[tuple[int, int, Any]] = [(s, e, None) for s, e in bounds]
        name = f"microgpt-chunks-{tag}"
    else:
        # A list: each chunk's slice lives in that chunk's key (the graph holds every
        # document once); tokenizing a million strings for a key name is not worth it.
        corpus = None
        seq: Sequence[str] = source  # type: ignore[assignment]
        payload = [(s, e, list(seq[s:e])) for s, e in bounds]
        name = f"microgpt-chunks-{uuid.uuid4().hex}"
    return spec_array(payload, name), corpus, [e - s for s, e in bounds]


# -- scoring -------------------------------------------------------------------------------
def _score_block(
    spec: Any,
    corpus: Any,
    host: Params,
    tokenizer: Tokenizer,
    backend: str,
    device: Any,
) -> np.ndarray:
    """One chunk's task: its documents scored on ``backend``/``device``, in pieces of
    :func:`~microgpt_xp.resources.score_chunk` documents (the fastest, and a task's memory
    then does not grow with its chunk)."""
    imports_settled()
    start, stop, docs = chunk_docs(spec, corpus)
    piece = score_chunk(host.config, dtype=_xp.dtype_name(host.wte))
    texts, positions = np.asarray(docs, dtype=object), np.arange(start, stop)
    return np.asarray(
        run_on(score_texts, backend, device, host, texts, positions, tokenizer, piece)
    )


def _encode_block(
    spec: Any, corpus: Any, tokenizer: Tokenizer, block_size: int, width: int
) -> np.ndarray:
    """One chunk's documents as ``(size, width + 1)`` int64: tokens padded with BOS to
    ``width`` columns, then the length."""
    start, _, docs = chunk_docs(spec, corpus)
    tokens, lengths = encode(tokenizer, docs, block_size, start)
    out = np.full((len(docs), width + 1), tokenizer.bos, dtype=np.int64)
    out[:, : tokens.shape[1]] = tokens
    out[:, width] = lengths
    return out


@dataclass(frozen=True)
class CorpusScore:
    """Lazy results of :func:`score_corpus` (Dask arrays sharing one graph).

    Attributes:
        losses: ``(N,)`` each document's mean negative log-likelihood per predicted token,
            in the params' dtype, chunked ``chunk_size`` documents a chunk.
        num_predictions: ``(N,)`` int64, the predictions per document,
            ``min(len(doc) + 1, block_size)``.
        mean: 0-d float64, the mean of ``losses`` (microgpt's ``"mean"`` batch loss).
        token_mean: 0-d float64, the mean over all predicted tokens.
        num_docs, chunk_size, num_chunks: the corpus and its chunking.
        scattered: with ``weights="scatter"``, the future of the weights on the cluster
            (the result can only be computed while its client is open); else ``None``.

    With ``weights="graph"`` (the default) the graph holds everything it needs, so it can
    be computed after the client that built it has closed (on Dask's threads then).
    """

    losses: Any
    num_predictions: Any
    mean: Any
    token_mean: Any
    num_docs: int
    chunk_size: int
    num_chunks: int
    scattered: Any = None

    def compute(self, *, losses: bool = False, **compute_kwargs: Any) -> ScoreSummary:
        """Run the computation once (on the active scheduler, or ``scheduler=`` in
        ``compute_kwargs``) and return a :class:`ScoreSummary`; ``losses=True`` also
        brings the per-document arrays back (O(N) memory on the client).

        Raises :class:`~microgpt_xp.cluster.ClusterError` if a distributed scheduler is
        lost during the computation, or if the weights were scattered to a cluster whose
        client has closed since."""
        dask, _ = dask_modules()
        if self.scattered is not None and self.scattered.client.status != "running":
            raise ClusterError(
                "these scores were built with weights='scatter', which live on a cluster "
                "whose client has closed: compute them before closing it, or build them "
                "with weights='graph'"
            )
        wanted = [self.mean, self.token_mean]
        if losses:
            wanted += [self.losses, self.num_predictions]
        with computing():
            values = dask.compute(*wanted, **compute_kwargs)
        return ScoreSummary(
            mean=float(values[0]),
            token_mean=float(values[1]),
            num_docs=self.num_docs,
            losses=np.asarray(values[2]) if losses else None,
            num_predictions=np.asarray(values[3]) if losses else None,
        )

    def collections(self) -> tuple[Any, ...]:
        """``(mean, token_mean, losses, num_predictions)``, e.g. for :func:`graph_stats`."""
        return (self.mean, self.token_mean, self.losses, self.num_predictions)


def score_corpus(
    params: Params,
    tokenizer: Tokenizer,
    source: Source,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    method: Method = "task",
    weights: Weights = "graph",
    client: Any = None,
    split_every: int | None = None,
    chunk_backend: str = "numpy",
    chunk_device: Any = None,
) -> CorpusScore:
    """Score every document of a corpus in one Dask computation (lazy until computed).

    Args:
        params: the weights (any backend; they are copied to the host once).
        tokenizer: encodes the documents; must match ``params.config.vocab_size``.
        source: a :class:`Corpus` (documents produced inside each chunk's task; the
            corpus object is one key of the graph) or a sequence of strings (each chunk's
            slice is one key of the graph).
        chunk_size: documents per chunk; sets the peak memory of a task.
        method: ``"task"`` (default): one task per chunk encodes its documents and runs
            :func:`microgpt_xp.score` on ``chunk_backend``. ``"graph"``: each chunk's
            encoding is a task, then :func:`microgpt_xp.score` runs on the Dask arrays,
            every layer a task per chunk (tokens padded to the corpus' longest document,
            when the source tells it through ``max_doc_len()``, else to ``block_size + 1``).
        weights: ``"graph"`` (default): the weights are one key of the graph, computed on
            one worker and fetched once by each other worker that needs them (and
            recomputed if a worker is lost). ``"scatter"``: sent to every worker before the
            computation with ``client.scatter(..., broadcast=True)`` (``method="task"``).
        client: the distributed client for ``weights="scatter"`` (default: the active one).
        split_every: chunks combined per node of the mean's reduction tree (Dask's
            default when ``None``).
        chunk_backend, chunk_device: where each task runs the model (``method="task"``);
            an eager backend installed on the workers.

    Returns:
        A :class:`CorpusScore` of lazy Dask arrays; ``.compute()`` runs it.

    Raises ``ValueError``/``TypeError`` for bad arguments and :class:`DataError` for an
    empty corpus; a document with a character outside the tokenizer raises
    :class:`DataError` (naming the chunk's positions) when computed.
    """
    _, da = dask_modules()
    host = host_params(params)
    cfg = host.config
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}")
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model {cfg.vocab_size}")
    check_chunk_size(chunk_size)
    if method not in ("task", "graph"):
        raise ValueError(f"method must be 'task' or 'graph', got {method!r}")
    if isinstance(source, str) or not hasattr(source, "__len__"):
        raise TypeError("source must be a Corpus or a sequence of document strings")
    check_chunk_backend(chunk_backend)
    specs, corpus, sizes = _chunks_of(source, chunk_size)
    dtype = np.dtype(str(host.dtype).split(".")[-1])
    node = None
    if method == "task":
        node = weights_node(host, weights, client)
        out = da.blockwise(
            _score_block,
            "ij",
            specs,
            "i",
            corpus,
            None,
            node,
            None,
            tokenizer,
            None,
            chunk_backend,
            None,
            chunk_device,
            None,
            new_axes={"j": 3},
            adjust_chunks={"i": tuple(sizes)},
            dtype=np.float64,
            meta=np.empty((0, 0), dtype=np.float64),
        )
        losses, num_pred = out[:, 0].astype(dtype), out[:, 2].astype(np.int64)
    else:
        if weights != "graph":
            raise ValueError("method='graph' keeps the weights in the graph (weights='graph')")
        max_len = getattr(source, "max_doc_len", None)
        width = cfg.block_size + 1
        if callable(max_len):
            width = min(width, int(max_len()) + 2)
        enc = da.blockwise(
            _encode_block,
            "ij",
            specs,
            "i",
            corpus,
            None,
            tokenizer,
            None,
            cfg.block_size,
            None,
            width,
            None,
            new_axes={"j": width + 1},
            adjust_chunks={"i": tuple(sizes)},
            dtype=np.int64,
            meta=np.empty((0, 0), dtype=np.int64),
        )
        tokens, lengths = enc[:, :width], enc[:, width]
        losses = score(host.to("dask"), tokens, lengths)
        num_pred = da.minimum(lengths - 1, cfg.block_size)
        loss64, n64 = losses.astype(np.float64), num_pred.astype(np.float64)
        out = da.stack([loss64, loss64 * n64, n64], axis=1)
    # One tree reduction (split_every chunks per node) gives both means; on its own it
    # fuses with each chunk's scoring task.
    totals = da.sum(out, axis=0, split_every=split_every)
    mean = totals[0] * (1.0 / len(source))
    token_mean = totals[1] / totals[2]
    return CorpusScore(
        losses=losses,
        num_predictions=num_pred,
        mean=mean,
        token_mean=token_mean,
        num_docs=len(source),
        chunk_size=chunk_size,
        num_chunks=len(sizes),
        scattered=node if method == "task" and weights == "scatter" else None,
    )


# -- generation ----------------------------------------------------------------------------
def _generate_block(
    spec: Any,
    host: Params,
    bos: int,
    inv_t: float,
    seed: int,
    backend: str,
    device: Any,
) -> np.ndarray:
    """One chunk's samples ``(size, block_size)`` int64, as ``sample_tokens`` makes them."""
    imports_settled()
    start, stop, _ = spec[0]
    uniforms = row_uniforms(seed, start, stop, host.config.block_size)
    return np.asarray(run_on(decode_batch, backend, device, host, bos, uniforms, inv_t))


def generate(
    params: Params,
    num_samples: int,
    *,
    bos: int,
    chunk_size: int = 8192,
    temperature: float = 0.5,
    seed: int = 0,
    weights: Weights = "graph",
    client: Any = None,
    chunk_backend: str = "numpy",
    chunk_device: Any = None,
) -> Any:
    """``num_samples`` sequences from BOS through the KV cache, as one lazy Dask array
    ``(N, block_size)`` int64 chunked ``chunk_size`` rows a chunk; rows are cut at their
    first BOS (which stays, followed by more BOS) as in
    :func:`microgpt_xp.sample.sample_tokens`.

    Row ``i`` uses row ``i`` of ``default_rng(seed).random((N, block_size))``, drawn
    inside its chunk's task (:func:`row_uniforms`), so the samples of a seed are those of
    ``sample_tokens(params, bos, N, seed=seed)`` whatever the chunking, and no O(N) array
    of draws is built. ``weights``, ``client``, ``chunk_backend`` and ``chunk_device`` are
    as in :func:`microgpt_xp.scale.score_corpus`: with ``weights="graph"`` (the default)
    the array can be computed after the client that built it has closed; with
    ``"scatter"`` the weights live on that client's cluster, so compute it first.
    """
    dask, da = dask_modules()
    host = host_params(params)
    cfg = host.config
    _xp.check_positive_int(num_samples, "the number of samples")
    temperature = check_temperature(temperature)
    if not 0 <= bos < cfg.vocab_size:
        raise ValueError(f"bos id {bos} is outside [0, {cfg.vocab_size})")
    _xp.check_nonnegative_int(seed, "seed")
    check_chunk_size(chunk_size)
    check_chunk_backend(chunk_backend)
    bounds = chunk_bounds(num_samples, chunk_size)
    name = f"microgpt-rows-{dask.base.tokenize(num_samples, chunk_size)}"
    specs = spec_array([(s, e, None) for s, e in bounds], name)
    return da.blockwise(
        _generate_block,
        "ij",
        specs,
        "i",
        weights_node(host, weights, client),
        None,
        bos,
        None,
        1.0 / temperature,
        None,
        seed,
        None,
        chunk_backend,
        None,
        chunk_device,
        None,
        new_axes={"j": cfg.block_size},
        adjust_chunks={"i": tuple(e - s for s, e in bounds)},
        dtype=np.int64,
        meta=np.empty((0, 0), dtype=np.int64),
    )


def _decode_block(ids: np.ndarray, tokenizer: Tokenizer) -> np.ndarray:
    out = np.empty(ids.shape[0], dtype=object)
    out[:] = [tokenizer.decode(row) for row in ids]
    return out


def generate_names(params: Params, tokenizer: Tokenizer, num_samples: int, **kwargs: Any) -> Any:
    """:func:`generate` decoded to text inside each chunk's task: a lazy ``(N,)`` object
    Dask array of strings. ``kwargs`` go to :func:`generate`."""
    _, da = dask_modules()
    if tokenizer.vocab_size != host_params(params).config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model {params.config.vocab_size}"
        )
    ids = generate(params, num_samples, bos=tokenizer.bos, **kwargs)
    return da.map_blocks(
        _decode_block, ids, tokenizer, drop_axis=1, dtype=object, meta=np.empty((0,), object)
    )


# -- the graph ----------------------------------------------------------------------------
@dataclass(frozen=True)
class GraphStats:
    """Size of a computation's graph as the scheduler receives it (after
    ``dask.optimize``): ``tasks`` keys in all, ``weight_copies`` of them carrying the
    weights' bytes (1 when they enter the graph once; 0 when scattered), and ``bytes``,
    the pickled size of the graph."""

    tasks: int
    weight_copies: int
    bytes: int


def graph_stats(params: Params, *collections: Any) -> GraphStats:
    """:class:`GraphStats` of the graph that computes ``collections`` with ``params``."""
    import cloudpickle  # type: ignore[import-untyped,unused-ignore]  # a dependency of Dask

    dask, _ = dask_modules()
    marker = np.ascontiguousarray(_xp.to_numpy(params.wte)).tobytes()
    optimized = dask.optimize(*collections)
    graph: dict[Any, Any] = {}
    for c in optimized:
        graph.update(dict(c.__dask_graph__()))
    blobs = [cloudpickle.dumps(task, protocol=5) for task in graph.values()]
    return GraphStats(
        tasks=len(graph),
        weight_copies=sum(marker in blob for blob in blobs),
        bytes=sum(len(b) for b in blobs),
    )


# -- outputs ----------------------------------------------------------------------------
def write_scores(path: str | Path, result: CorpusScore, **compute_kwargs: Any) -> ScoreSummary:
    """Compute ``result`` (per-document losses included) and only then write the losses to
    ``path`` atomically: a ``.npy`` file (``numpy.save``), otherwise text, one loss per
    line in corpus order. A failed computation (e.g. a lost scheduler) writes nothing."""
    summary = result.compute(losses=True, **compute_kwargs)
    assert summary.losses is not None
    path = Path(path)
    if path.suffix == ".npy":
        import io

        buf = io.BytesIO()
        np.save(buf, summary.losses)
        atomic_write(path, buf.getvalue())
    else:
        atomic_write(path, "".join(f"{x:.9g}\n" for x in summary.losses.tolist()))
    return summary


def write_names(path: str | Path, names: Any, **compute_kwargs: Any) -> list[str]:
    """Compute a lazy array of names (:func:`generate_names`) and only then write them to
    ``path`` atomically, one per line. Returns the names."""
    dask, _ = dask_modules()
    with computing():
        (values,) = dask.compute(names, **compute_kwargs)
    out = [str(v) for v in values]
    atomic_write(path, "".join(f"{n}\n" for n in out))
    return out

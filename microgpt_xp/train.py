"""The training loop: shuffled batches of documents, the hand-written backward pass,
Adam with linear decay, per-step callbacks and atomic checkpoints that a run resumes
from exactly.

Where a step runs is decided here, once, from the arguments: on the weights' own
namespace (compiled where it has a compiler, see ``jit``), over opt-in worker processes
(``workers=N``, :mod:`microgpt_xp.parallel`), or as one Dask task per chunk of the batch
(``backend="dask"``, :mod:`microgpt_xp.dask_steps`).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _xp
from . import checkpoint as ckpt
from .config import GPTConfig
from .data import DataError, Tokenizer, batch_indices, default_docs, encode_docs, take_batch
from .model import Reduction, _check_reduction, _loss_and_grads, _train_step
from .optim import Adam, AdamState, adam_update
from .parallel import WorkerPool, check_workers
from .params import Params, init_params, materialize


class TrainingError(RuntimeError):
    """Training could not go on (a non-finite loss, or non-finite weights)."""


class ResumeError(ValueError):
    """A resumed run would not be the run its checkpoint holds: ``option`` (a
    :func:`train` argument) is ``given`` here but was ``saved`` in the checkpoint."""

    def __init__(self, option: str, saved: Any, given: Any, checkpoint: str) -> None:
        self.option, self.saved, self.given = option, saved, given
        super().__init__(
            f"cannot resume {checkpoint!r} with {option}={given!r}: the checkpoint's run "
            f"has {option}={saved!r} (a resumed run must be the run it continues)"
        )


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained ``params``, the optimizer (its moments and
    step count), the ``tokenizer``, the loss of every step run (``losses[i]`` is the batch
    loss before update ``start_step + i``) and ``step``, the number of steps taken."""

    params: Params
    adam: Adam
    tokenizer: Tokenizer
    losses: list[float] = field(default_factory=list)
    step: int = 0
    start_step: int = 0


def to_batch(
    tokens: Any, lengths: Any, backend: str, *, device: Any = None, chunk_size: int | None = None
) -> tuple[Any, Any]:
    """Move a host batch ``(tokens (B, L), lengths (B,))`` to a backend; on Dask, chunk it
    along the batch axis (``chunk_size`` rows per chunk; default one chunk)."""
    chunks_t = None if chunk_size is None else (chunk_size, -1)
    chunks_l = None if chunk_size is None else (chunk_size,)
    return (
        _xp.asarray(tokens, backend, device=device, chunks=chunks_t),
        _xp.asarray(lengths, backend, device=device, chunks=chunks_l),
    )


def corpus_digest(docs: Sequence[str]) -> str:
    """A SHA-256 of the documents in order (what a checkpoint records of its corpus)."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def train(
    docs: Sequence[str] | None = None,
    *,
    steps: int = 1000,
    batch_size: int = 32,
    lr: float = 0.01,
    backend: str = "numpy",
    device: Any = None,
    dtype: str = "float32",
    seed: int = 0,
    config: GPTConfig | None = None,
    tokenizer: Tokenizer | None = None,
    params: Params | None = None,
    reduction: Reduction = "mean",
    chunk_size: int | None = None,
    workers: int | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    callback: Callable[[int, float], None] | None = None,
    jit: bool | None = None,
) -> TrainResult:
    """Train microgpt on a list of documents, ``batch_size`` documents a step.

    Args:
        docs: the corpus, a sequence of strings (default:
            :func:`~microgpt_xp.data.default_docs`).
        steps: number of Adam steps; also the length of the linear learning-rate decay.
        batch_size: documents per step (batch ``b`` of step ``s`` is fixed by ``seed``).
        lr: the initial learning rate (the spec's 0.01).
        backend, device, dtype: where the weights live and train (``"numpy"``, ``"dask"``, …).
        seed: seeds the initial weights and the batch order; a seed gives the same run on
            a backend.
        config: model shape (default: the spec's, with the tokenizer's vocabulary).
        tokenizer: default: built from ``docs``.
        params: start from these weights instead of fresh ones.
        reduction: the batch loss, see :func:`~microgpt_xp.loss_and_grads`.
        chunk_size: on Dask, documents per chunk of the batch axis (default: one chunk).
            Each step is one task per chunk, see :mod:`microgpt_xp.dask_steps`.
        workers: on NumPy, the number of processes that share each step's batch by rows
            (this one and ``workers - 1`` spawned worker processes, see
            :mod:`microgpt_xp.parallel`); ``None`` (default) or ``1``: the calling process
            alone. The run is the same for the same number of processes, and equal to a
            one-process run up to rounding. The workers end with the call.
        checkpoint: a path; saved every ``checkpoint_every`` steps (if > 0) and at the end.
            An existing file is refused unless ``resume`` or ``overwrite`` is given.
        resume: continue the run that ``checkpoint`` holds, when that file exists. The
            losses are then those of an uninterrupted run; every argument that would
            change them (``seed``, ``batch_size``, ``lr``, ``dtype``, ``reduction``, the
            corpus and its tokenizer, the config) must be the checkpoint's, or
            :class:`ResumeError` names it.
            ``steps`` must be the run's, except that a *finished* run (all its steps
            taken) is extended by asking for more: the learning rate then follows the
            schedule of a run of the new length from the step reached on,
            ``lr * (1 - t / steps)``.
        overwrite: replace an existing ``checkpoint`` file with a new run.
        callback: called as ``callback(step, loss)`` after every step (``step`` 1-based).
        jit: ``None`` (default) compiles the training step where the namespace has a
            compiler (JAX: ``jax.jit``; every batch is then padded to the corpus's longest
            document, so the run compiles once), ``False`` runs eagerly, ``True`` insists
            (``ValueError`` on a namespace without a compiler). The losses are the eager
            ones up to rounding.

    Raises ``ValueError``/``TypeError`` for bad arguments (:class:`ResumeError` for a
    resume that would change the run, ``FileExistsError`` for a checkpoint in the way)
    and :class:`TrainingError` when a loss or a weight is not finite (the last good
    checkpoint is kept).
    """
    _check_arguments(steps, batch_size, chunk_size, workers, reduction, backend, dtype)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    if checkpoint is not None and Path(checkpoint).exists() and not (resume or overwrite):
        raise FileExistsError(
            f"checkpoint {str(checkpoint)!r} exists; resume it (resume=True) or replace it "
            "(overwrite=True)"
        )
    docs = _check_docs(docs)
    tokenizer = Tokenizer.from_docs(docs) if tokenizer is None else tokenizer
    if config is None:
        config = params.config if params is not None else GPTConfig(tokenizer.vocab_size)
    if config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"config.vocab_size {config.vocab_size} does not match the tokenizer's {tokenizer.vocab_size}"
        )
    tokens, lengths = encode_docs(tokenizer, docs, config.block_size)
    batch_indices(len(docs), batch_size, 0, seed)  # raises early if the corpus is too small
    run = {
        "seed": seed,
        "batch_size": batch_size,
        "lr": float(lr),
        "dtype": dtype,
        "reduction": reduction,
        "corpus": corpus_digest(docs),
    }
    # On Dask the weights and Adam live in the chunks' namespace here, in this process;
    # each step's gradients come from one task per chunk (dask_steps).
    home = "numpy" if backend == "dask" else backend
    home_device = None if backend == "dask" else device

    start = 0
    if resume and checkpoint is not None and Path(checkpoint).exists():
        if params is not None:
            raise ValueError("params= cannot be given when resuming from an existing checkpoint")
        params, adam, start = _resume(
            checkpoint, run, steps, config, tokenizer, home, home_device, dtype
        )
    else:
        if params is None:
            params = init_params(config, seed=seed, backend=home, device=home_device, dtype=dtype)
        elif params.config != config:
            raise ValueError(f"params have {params.config}, not {config}")
        elif not _finite(params):
            raise ValueError("params= holds weights that are not finite (NaN or inf)")
        elif backend == "dask":
            params = params.to(home, dtype=dtype)
        adam = Adam(params, lr=lr, num_steps=steps)

    result = TrainResult(params, adam, tokenizer, step=start, start_step=start)
    loop = _Loop(backend, device, chunk_size, workers, reduction, jit, adam)
    try:
        for step in range(start, steps):
            idx = batch_indices(len(docs), batch_size, step, seed)
            batch = take_batch(tokens, lengths, idx) if loop.trim else (tokens[idx], lengths[idx])
            new_params, new_state, loss = loop.step(params, adam.state, *batch)
            loss, new_params, new_state = materialize(loss, new_params, new_state)
            loss_value = float(_xp.to_numpy(loss))
            if not math.isfinite(loss_value):
                kept = f"; the last good checkpoint {str(checkpoint)!r} is kept" if checkpoint else ""
                raise TrainingError(
                    f"the loss is {loss_value} at step {step + 1}; training stopped{kept}"
                )
            params = new_params
            adam.advance(new_state)
            result.losses.append(loss_value)
            result.params, result.step = params, step + 1
            if callback is not None:
                callback(step + 1, loss_value)
            if checkpoint is not None and checkpoint_every > 0 and (step + 1) % checkpoint_every == 0:
                _save(checkpoint, params, adam, step + 1, tokenizer, run)
    finally:
        loop.close()
    if checkpoint is not None:
        _save(checkpoint, result.params, adam, result.step, tokenizer, run)
    if backend == "dask":  # in memory on the caller's side: usable after any cluster closes
        result.params = result.params.to("dask")
    return result


def _check_arguments(
    steps: Any,
    batch_size: Any,
    chunk_size: Any,
    workers: Any,
    reduction: Any,
    backend: str,
    dtype: str,
) -> None:
    _xp.check_backend(backend)
    _xp.check_dtype(dtype)
    _xp.check_positive_int(steps, "steps")
    _xp.check_positive_int(batch_size, "batch size")
    if chunk_size is not None:
        _xp.check_positive_int(chunk_size, "chunk size")
    check_workers(workers, backend)
    _check_reduction(reduction)


def _check_docs(docs: Sequence[str] | None) -> list[str]:
    """The corpus as a list of non-empty strings (``DataError``/``TypeError`` otherwise)."""
    if docs is None:
        return default_docs()
    if isinstance(docs, (str, bytes)):
        raise TypeError(
            "docs must be a sequence of documents, not one string (a string would be read "
            "as one-character documents): pass [text] or text.splitlines()"
        )
    docs = list(docs)
    if not docs:
        raise DataError("the corpus holds no documents")
    bad = next((d for d in docs if not isinstance(d, str)), None)
    if bad is not None:
        raise TypeError(f"documents must be strings, got {type(bad).__name__}: {bad!r}")
    return docs


def _resume(
    checkpoint: str | Path,
    run: dict[str, Any],
    steps: int,
    config: GPTConfig,
    tokenizer: Tokenizer,
    backend: str,
    device: Any,
    dtype: str,
) -> tuple[Params, Adam, int]:
    """The params, optimizer and step of the run in ``checkpoint``, after checking that
    the arguments continue that run (:class:`ResumeError` otherwise)."""
    name = str(checkpoint)
    saved = ckpt.load(checkpoint, backend=backend, device=device)
    if saved.config != config:
        raise ResumeError("config", saved.config, config, name)
    if saved.tokenizer is not None and saved.tokenizer != tokenizer:
        chars = "".join(saved.tokenizer.chars), "".join(tokenizer.chars)
        raise ResumeError("tokenizer", f"chars {chars[0]!r}", f"chars {chars[1]!r}", name)
    if saved.adam is None:
        raise ValueError(f"checkpoint {name!r} holds no optimizer state to resume")
    saved_run = saved.meta.get("run") if isinstance(saved.meta, dict) else None
    saved_dtype = str(saved.params.dtype).split(".")[-1]
    if saved_dtype != dtype:
        raise ResumeError("dtype", saved_dtype, dtype, name)
    if isinstance(saved_run, dict):
        for option in ("seed", "batch_size", "lr", "reduction"):
            if option in saved_run and saved_run[option] != run[option]:
                raise ResumeError(option, saved_run[option], run[option], name)
        if saved_run.get("corpus", run["corpus"]) != run["corpus"]:
            # the corpus is shown by its digest (corpus_digest)
            raise ResumeError(
                "docs", f"sha256:{saved_run['corpus'][:12]}", f"sha256:{run['corpus'][:12]}", name
            )
    adam, start = saved.adam, saved.step
    if adam.lr != run["lr"]:
        raise ResumeError("lr", adam.lr, run["lr"], name)
    if steps != adam.num_steps:
        if start < adam.num_steps or steps < adam.num_steps:
            raise ResumeError("steps", adam.num_steps, steps, name)
        adam.num_steps = steps  # extend a finished run (see train's docstring)
    return saved.params, adam, start


class _Loop:
    """How a step of this run computes: ``step(params, state, tokens, lengths) ->
    (new_params, new_state, loss)`` from a host batch, and whether batches are trimmed to
    their longest document (``trim``; a compiled step keeps one shape instead)."""

    def __init__(
        self,
        backend: str,
        device: Any,
        chunk_size: int | None,
        workers: int | None,
        reduction: Reduction,
        jit: bool | None,
        adam: Adam,
    ) -> None:
        self.backend, self.device, self.chunk_size = backend, device, chunk_size
        self.reduction, self.adam = reduction, adam
        self.pool = WorkerPool(workers) if workers not in (None, 1) else None
        self.dask: Any = None
        if backend == "dask":
            from .dask_steps import BlockwiseSteps

            self.dask = BlockwiseSteps(reduction, chunk_size)
        eager_only = self.pool is not None or self.dask is not None
        compile_fn = _xp.compiler(backend, False if eager_only and jit is None else jit)
        self.trim = compile_fn is None
        fn: Callable[..., Any] = functools.partial(
            _train_step, reduction=reduction, **adam.hyperparameters
        )
        self._compiled = fn if compile_fn is None else compile_fn(fn)

    def step(
        self, params: Params, state: AdamState, tokens: np.ndarray, lengths: np.ndarray
    ) -> tuple[Params, AdamState, Any]:
        if self.pool is not None or self.dask is not None:
            if self.pool is not None:
                loss, grads = _pooled_loss_and_grads(
                    self.pool, params, tokens, lengths, self.reduction
                )
            else:
                loss, grads = self.dask.loss_and_grads(params, tokens, lengths)
            new_params, new_state = adam_update(
                params, grads, state, **self.adam.hyperparameters
            )
            return new_params, new_state, loss
        tok, lens = to_batch(tokens, lengths, self.backend, device=self.device)
        return self._compiled(params, state, tok, lens)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _save(
    path: str | Path,
    params: Params,
    adam: Adam,
    step: int,
    tokenizer: Tokenizer,
    run: dict[str, Any],
) -> None:
    """Checkpoint the run after ``step`` steps, unless an update has made a weight
    non-finite (then :class:`TrainingError`, and the last good checkpoint stays)."""
    if not _finite(params):
        raise TrainingError(
            f"the weights are not finite after step {step}; training stopped; "
            f"the last good checkpoint {str(path)!r} is kept"
        )
    ckpt.save(path, params, adam=adam, step=step, tokenizer=tokenizer, meta={"run": run})


def _finite(params: Params) -> bool:
    """Whether every weight is finite (read on the host)."""
    return all(np.isfinite(_xp.to_numpy(a)).all() for a in params.arrays().values())


def _pooled_loss_and_grads(
    pool: WorkerPool, params: Params, tokens: np.ndarray, lengths: np.ndarray, reduction: Reduction
) -> tuple[Any, Params]:
    """The loss and gradients of a NumPy batch whose rows ``pool`` shares out: each
    shard's loss and gradients weighted by its share of the rows (``"mean"``) or of the
    predicted tokens (``"token_mean"``), summed in shard order."""
    parts = pool.map(_loss_and_grads, params, [tokens, lengths], reduction)
    n = np.minimum(lengths - 1, params.config.block_size)
    weights = [
        (b - a) / len(lengths) if reduction == "mean" else float(n[a:b].sum() / n.sum())
        for (a, b), _ in parts
    ]
    loss = weights[0] * parts[0][1][0]
    for w, (_, (shard_loss, _)) in zip(weights[1:], parts[1:], strict=True):
        loss = loss + w * shard_loss
    grads = parts[0][1][1].map(lambda g: weights[0] * g, check=False)
    for w, (_, (_, shard_grads)) in zip(weights[1:], parts[1:], strict=True):
        grads = grads.map(lambda total, g, w=w: total + w * g, shard_grads, check=False)
    return loss, grads

"""The training loop: shuffled batches of documents, the hand-written backward pass,
Adam with linear decay, per-step callbacks and atomic checkpoints."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _xp
from . import checkpoint as ckpt
from .config import GPTConfig
from .data import Tokenizer, batch_indices, default_docs, encode_docs, take_batch
from .model import Reduction, _check_reduction, _loss_and_grads, _train_step
from .optim import Adam, adam_update
from .parallel import WorkerPool, check_workers
from .params import Params, init_params, materialize


class TrainingError(RuntimeError):
    """Training could not go on (a non-finite loss)."""


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


def _save(path: str | Path, params: Params, adam: Adam, step: int, tokenizer: Tokenizer) -> None:
    """Checkpoint the run after ``step`` steps, unless an update has made a weight
    non-finite (then :class:`TrainingError`, and the last good checkpoint stays)."""
    if not all(np.isfinite(_xp.to_numpy(a)).all() for a in params.arrays().values()):
        raise TrainingError(
            f"the weights are not finite after step {step}; training stopped; "
            f"the last good checkpoint {str(path)!r} is kept"
        )
    ckpt.save(path, params, adam=adam, step=step, tokenizer=tokenizer)


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
    callback: Callable[[int, float], None] | None = None,
    jit: bool | None = None,
) -> TrainResult:
    """Train microgpt on a list of documents, ``batch_size`` documents a step.

    Args:
        docs: the corpus (default: :func:`~microgpt_xp.data.default_docs`).
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
        chunk_size: on Dask, documents per chunk of the batch axis.
        workers: on NumPy, the number of processes that share each step's batch by rows
            (this one and ``workers - 1`` spawned worker processes, see
            :mod:`microgpt_xp.parallel`); ``None`` (default) or ``1``: the calling process
            alone. The run is the same for the same number of processes, and equal to a
            one-process run up to rounding. The workers end with the call.
        checkpoint: a path; saved every ``checkpoint_every`` steps (if > 0) and at the end.
        resume: continue from ``checkpoint`` when that file exists; the losses then equal
            those of an uninterrupted run.
        callback: called as ``callback(step, loss)`` after every step (``step`` 1-based).
        jit: ``None`` (default) compiles the training step where the namespace has a
            compiler (JAX: ``jax.jit``; every batch is then padded to the corpus's longest
            document, so the run compiles once), ``False`` runs eagerly, ``True`` insists
            (``ValueError`` on a namespace without a compiler). The losses are the eager
            ones up to rounding.

    Raises ``ValueError`` for bad arguments and :class:`TrainingError` when a loss is not
    finite (the last good checkpoint is kept).
    """
    _xp.check_backend(backend)
    _xp.check_dtype(dtype)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch size must be a positive int, got {batch_size!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk size must be positive, got {chunk_size!r}")
    check_workers(workers)
    _check_reduction(reduction)
    compile_fn = _xp.compiler(backend, None if jit is None and workers not in (None, 1) else jit)
    if workers not in (None, 1) and backend != "numpy":
        raise ValueError(
            f"workers={workers} shares NumPy batches over processes; backend {backend!r} "
            "brings its own parallelism (use workers=None)"
        )
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    docs = default_docs() if docs is None else list(docs)
    tokenizer = Tokenizer.from_docs(docs) if tokenizer is None else tokenizer
    if config is None:
        config = params.config if params is not None else GPTConfig(tokenizer.vocab_size)
    if config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"config.vocab_size {config.vocab_size} does not match the tokenizer's {tokenizer.vocab_size}"
        )
    tokens, lengths = encode_docs(tokenizer, docs, config.block_size)
    batch_indices(len(docs), batch_size, 0, seed)  # raises early if the corpus is too small

    start = 0
    if resume and checkpoint is not None and Path(checkpoint).exists():
        saved = ckpt.load(checkpoint, backend=backend, device=device, dtype=dtype, config=config)
        if saved.tokenizer is not None and saved.tokenizer != tokenizer:
            raise ValueError(f"checkpoint {str(checkpoint)!r} was trained with another tokenizer")
        if saved.adam is None:
            raise ValueError(f"checkpoint {str(checkpoint)!r} holds no optimizer state to resume")
        params, adam, start = saved.params, saved.adam, saved.step
        if adam.num_steps != steps:
            raise ValueError(f"checkpoint was trained for {adam.num_steps} steps, not {steps}")
    else:
        if params is None:
            params = init_params(config, seed=seed, backend=backend, device=device, dtype=dtype)
        elif params.config != config:
            raise ValueError(f"params have {params.config}, not {config}")
        adam = Adam(params, lr=lr, num_steps=steps)

    result = TrainResult(params, adam, tokenizer, step=start, start_step=start)
    pool = WorkerPool(workers) if workers not in (None, 1) else None
    step_fn: Callable[..., Any] = functools.partial(
        _train_step, reduction=reduction, **adam.hyperparameters
    )
    if compile_fn is not None and pool is None:
        step_fn = compile_fn(step_fn)
    try:
        for step in range(start, steps):
            idx = batch_indices(len(docs), batch_size, step, seed)
            if compile_fn is None:
                host_tok, host_lens = take_batch(tokens, lengths, idx)
            else:  # one shape for the whole run: one compilation
                host_tok, host_lens = tokens[idx], lengths[idx]
            if pool is not None:
                loss, grads = _pooled_loss_and_grads(pool, params, host_tok, host_lens, reduction)
                new_params, new_state = adam_update(params, grads, adam.state, **adam.hyperparameters)
            else:
                tok, lens = to_batch(
                    host_tok, host_lens, backend, device=device, chunk_size=chunk_size
                )
                new_params, new_state, loss = step_fn(params, adam.state, tok, lens)
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
                _save(checkpoint, params, adam, step + 1, tokenizer)
    finally:
        if pool is not None:
            pool.close()
    if checkpoint is not None:
        _save(checkpoint, result.params, adam, result.step, tokenizer)
    return result

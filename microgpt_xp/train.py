"""The training loop: shuffled batches of documents, the hand-written backward pass,
Adam with linear decay, per-step callbacks and atomic checkpoints."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _threads, _xp
from . import checkpoint as ckpt
from .config import GPTConfig
from .data import Tokenizer, batch_indices, default_docs, encode_docs, take_batch
from .model import Reduction, loss_and_grads
from .optim import Adam
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
        workers: on NumPy, threads that share a step's batch (``None``: chosen by the
            batch's size and the CPU cores; ``1``: none). See
            :func:`~microgpt_xp.loss_and_grads`; the run is the same for the same number of
            threads, and equal to a single-threaded one up to rounding.
        checkpoint: a path; saved every ``checkpoint_every`` steps (if > 0) and at the end.
        resume: continue from ``checkpoint`` when that file exists; the losses then equal
            those of an uninterrupted run.
        callback: called as ``callback(step, loss)`` after every step (``step`` 1-based).

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
    _threads.check_workers(workers)
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
    for step in range(start, steps):
        idx = batch_indices(len(docs), batch_size, step, seed)
        tok, lens = to_batch(
            *take_batch(tokens, lengths, idx), backend, device=device, chunk_size=chunk_size
        )
        loss, grads = loss_and_grads(params, tok, lens, reduction=reduction, workers=workers)
        prev_moments, prev_t = adam.moments, adam.t
        new_params = adam.step(params, grads)
        loss, new_params, new_m, new_v = materialize(loss, new_params, *adam.moments)
        loss_value = float(_xp.to_numpy(loss))
        if not math.isfinite(loss_value):
            adam.moments, adam.t = prev_moments, prev_t
            kept = f"; the last good checkpoint {str(checkpoint)!r} is kept" if checkpoint else ""
            raise TrainingError(
                f"the loss is {loss_value} at step {step + 1}; training stopped{kept}"
            )
        params, adam.moments = new_params, (new_m, new_v)
        result.losses.append(loss_value)
        result.params, result.step = params, step + 1
        if callback is not None:
            callback(step + 1, loss_value)
        if checkpoint is not None and checkpoint_every > 0 and (step + 1) % checkpoint_every == 0:
            ckpt.save(checkpoint, params, adam=adam, step=step + 1, tokenizer=tokenizer)
    if checkpoint is not None:
        ckpt.save(checkpoint, result.params, adam=adam, step=result.step, tokenizer=tokenizer)
    return result

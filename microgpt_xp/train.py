"""The training loop: shuffled batches, the hand-written backward pass on a runner, Adam
with linear decay, held-out loss, callbacks and atomic checkpoints a run resumes from
exactly. Where the arrays live (``backend``) and how a batch is spread over workers
(``runner``) are two choices; this module never asks a backend's name."""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _xp, runners
from ._errors import ArgumentTypeError, ArgumentValueError
from ._files import claim
from ._xp import to_batch
from .checkpoint import save
from .config import GPTConfig
from .data import Tokenizer, batch_indices, check_docs, default_block_size, encode_docs, take_batch
from .model import Reduction, _check_reduction, loss_and_grads
from .optim import Adam, AdamConfig, AdamState, adam_config, adam_update
from .params import Params, flatten, init_params, materialize, unflatten
from .resources import check_threads, use_threads
from .resume import ResumeError, corpus_digest, run_record
from .resume import resume as resume_run
from .scoring import score_docs

__all__ = ["ResumeError", "TrainResult", "TrainingError", "corpus_digest", "to_batch", "train"]

#: A batch loss above this many times the loss of a uniform guess (``ln V``) means the run
#: has diverged (a learning rate far too large), even while it is still finite.
DIVERGED = 100.0


class TrainingError(RuntimeError):
    """Training could not go on (a non-finite or diverged loss, or non-finite weights)."""


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained ``params``, the optimizer (its moments and
    step count), the ``tokenizer``, the loss of every step run (``losses[i]`` is the batch
    loss before update ``start_step + i``), ``step`` (the steps taken), and the held-out
    mean losses ``val_losses`` as ``(step, loss)`` pairs."""

    params: Params
    adam: Adam
    tokenizer: Tokenizer
    losses: list[float] = field(default_factory=list)
    step: int = 0
    start_step: int = 0
    val_losses: list[tuple[int, float]] = field(default_factory=list)


def train(
    docs: Sequence[str] | None = None,
    *,
    steps: int = 1000,
    batch_size: int = 32,
    seed: int = 0,
    config: GPTConfig | None = None,
    params: Params | None = None,
    backend: Any = "numpy",
    device: Any = None,
    dtype: str = "float32",
    runner: runners.Runner | None = None,
    workers: int | None = None,
    chunk_size: int | None = None,
    jit: bool | None = None,
    threads: int | str | None = None,
    optimizer: AdamConfig | None = None,
    lr: float | None = None,
    reduction: Reduction = "mean",
    tokenizer: Tokenizer | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    val_docs: Sequence[str] | None = None,
    eval_every: int | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    callback: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train microgpt on a list of documents, ``batch_size`` documents a step.

    Args:
        docs: the corpus, a sequence of strings (default:
            :func:`~microgpt_xp.data.default_docs`).
        steps: number of Adam steps; also the length of the linear learning-rate decay.
        batch_size: documents per step (batch ``b`` of step ``s`` is fixed by ``seed``).
        seed: seeds the initial weights and the batch order.
        config: model shape (default: the spec's, with the tokenizer's vocabulary and the
            block size of :func:`~microgpt_xp.data.default_block_size`, as the CLI).
        params: start from these weights instead of fresh ones.
        backend, device, dtype: where the weights live and train (a table name such as
            ``"numpy"``, ``"torch"``, or an Array API namespace). ``backend="dask"``:
            Dask tasks over NumPy chunks (``runner=DaskTasks(chunk_size)``), the result's
            weights Dask arrays.
        runner: how each batch is spread over workers (:mod:`microgpt_xp.runners`;
            default ``Local(jit)``); ``workers=N`` is ``Processes(N)``, ``chunk_size``
            the rows of a Dask task. ``jit``: ``None`` compiles the step where the
            namespace has a compiler (JAX; batches then padded to one shape), ``False``
            never, ``True`` insists.
        threads: BLAS (and PyTorch) threads during the run: a count (capped at this
            process's cores), ``"auto"`` (:func:`microgpt_xp.resources.auto_threads`), or
            ``None`` (default): the process's thread pools are left as they are.
        optimizer, lr: Adam's :class:`~microgpt_xp.AdamConfig` (its ``num_steps`` set to
            ``steps``); ``lr`` replaces its learning rate (the spec's 0.01 by default).
        reduction: the batch loss, ``"mean"`` or ``"token_mean"``.
        tokenizer: default: built from ``docs`` and ``val_docs``.
        checkpoint: a path, claimed for the run (a second run on it stops with
            ``FileExistsError``), saved every ``checkpoint_every`` steps (if > 0) and at
            the end. An existing file is refused unless ``resume`` (continue it: the
            losses of an uninterrupted run; every argument that would change them must be
            the checkpoint's, or :class:`ResumeError` names it; a *finished* run is
            extended by asking for more ``steps``) or ``overwrite``.
        val_docs: held-out documents, scored (their mean loss, as ``eval`` gives it)
            every ``eval_every`` steps (default: a tenth of the run) and at the end:
            ``TrainResult.val_losses``; ``on_eval(step, val_loss)`` after each.
        callback: called as ``callback(step, loss)`` after every step (``step`` 1-based).

    Raises ``ValueError``/``TypeError`` for bad arguments, ``FileExistsError`` for a
    checkpoint in the way, and :class:`TrainingError` when a loss or a weight is not
    finite or the loss has diverged (the last good checkpoint, if any, is kept).
    """
    _xp.check_dtype(dtype)
    _xp.check_positive_int(steps, "steps")
    _xp.check_positive_int(batch_size, "batch_size", most=_xp.NATIVE_INT_MAX)
    _check_reduction(reduction)
    _xp.check_nonnegative_int(seed, "seed")
    for name, value in (
        ("eval_every", eval_every),
        ("chunk_size", chunk_size),
    ):
        if value is not None:
            _xp.check_positive_int(value, name)
    threads = check_threads(threads)
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int):
        raise ArgumentValueError(
            "checkpoint_every", f"checkpoint_every must be an int, got {checkpoint_every!r}"
        )
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise ArgumentTypeError(
            "tokenizer", f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}"
        )
    backend = _xp.check_backend(backend)
    runner = runners.pick(runner, backend, workers=workers, chunk_size=chunk_size, jit=jit)
    optimizer = adam_config(optimizer, **({} if lr is None else {"lr": lr}))
    optimizer = adam_config(optimizer, num_steps=steps)
    for name, idle in (
        ("resume", resume and checkpoint is None),
        ("overwrite", overwrite and checkpoint is None),
        ("checkpoint_every", checkpoint_every > 0 and checkpoint is None),
        ("eval_every", eval_every is not None and val_docs is None),
    ):
        if idle:  # an option that would do nothing
            needs = "val_docs (held-out documents)" if name == "eval_every" else "a checkpoint path"
            raise ArgumentValueError(name, f"{name}= needs {needs}")
    if checkpoint is not None and Path(checkpoint).exists() and not (resume or overwrite):
        raise FileExistsError(
            f"checkpoint {str(checkpoint)!r} exists; resume it (resume=True) or replace it "
            "(overwrite=True)"
        )
    docs = check_docs(docs, "docs")
    held_out = None if val_docs is None else check_docs(val_docs, "val_docs")
    every_doc = docs if held_out is None else [*docs, *held_out]
    tokenizer = tokenizer or Tokenizer.from_docs(every_doc)
    if config is None:
        config = (
            params.config
            if params is not None
            else GPTConfig(tokenizer.vocab_size, block_size=default_block_size(every_doc))
        )
    if config.vocab_size != tokenizer.vocab_size:
        raise ArgumentValueError(
            "config" if params is None or config is not params.config else "params",
            f"config.vocab_size {config.vocab_size} does not match the tokenizer's "
            f"{tokenizer.vocab_size}",
        )
    tokens, lengths = encode_docs(tokenizer, docs, config.block_size)
    batch_indices(len(docs), batch_size, 0, seed)  # raises early if the corpus is too small
    run = run_record(seed, batch_size, optimizer.lr, dtype, reduction, docs, held_out)
    # the claim checks again, under its lock, that no other run made the file meanwhile
    with (
        claim(checkpoint, exist_ok=resume or overwrite) if checkpoint else contextlib.nullcontext()
    ):
        if resume and checkpoint is not None and Path(checkpoint).exists():
            params, adam, history = resume_run(
                checkpoint, run, steps, config, tokenizer, backend, device, params
            )
            placed = runner.place(params)
            if placed is not params:  # Dask: Adam and its moments go where the weights went
                moved = Adam(placed, adam.config)
                moved.restore(adam.m.to(placed.backend), adam.v.to(placed.backend), adam.t)
                adam = moved
            params = placed
        else:
            params = runner.place(_start(params, config, seed, backend, device, dtype))
            adam, history = Adam(params, optimizer), {"losses": [], "val_losses": []}
        result = TrainResult(params, adam, tokenizer, step=adam.t, start_step=adam.t)
        every = eval_every or max(1, steps // 10)
        loop = _Loop(
            runner,
            reduction,
            adam,
            tokenizer,
            checkpoint,
            checkpoint_every,
            resume,
            run,
            history,
            held_out,
            every,
            on_eval,
        )
        with use_threads(threads, config=config, batch_size=batch_size):
            try:
                loop.run(result, tokens, lengths, steps, batch_size, seed, callback)
            finally:  # inside: the workers' pool restores the threads it found when it started
                runner.close()
        if checkpoint is not None:
            loop.save(result.params, result.step)
    if _xp.entry(backend).chunked:  # in memory on the caller's side: outlives any cluster
        result.params = result.params.to(backend)
    return result


def _start(
    params: Params | None, config: GPTConfig, seed: int, backend: str, device: Any, dtype: str
) -> Params:
    """Fresh weights, or ``params`` checked and placed on the run's backend and dtype."""
    if params is None:
        return init_params(config, seed=seed, backend=backend, device=device, dtype=dtype)
    if params.config != config:
        raise ArgumentValueError("params", f"params have {params.config}, not {config}")
    if not finite(params):
        raise ArgumentValueError("params", "params= holds weights that are not finite (NaN or inf)")
    if params.backend != backend or _xp.dtype_name(params.wte) != dtype:
        return params.to(backend, dtype=dtype)
    return params


def finite(params: Params) -> bool:
    """Whether every weight is finite (one reduction in the weights' namespace, read as a
    bool; ``True`` where it cannot be read)."""
    xp = params.xp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _xp.read_scalar(xp.all(xp.isfinite(flatten(params))), bool) is not False


@dataclass
class _Loop:
    """The steps of a run on its runner, held-out scoring and checkpoints."""

    runner: runners.Runner
    reduction: Reduction
    adam: Adam
    tokenizer: Tokenizer
    checkpoint: str | Path | None
    checkpoint_every: int
    resumed: bool
    run_info: dict[str, Any]
    history: dict[str, list[Any]]
    held_out: list[str] | None
    eval_every: int
    on_eval: Callable[[int, float], None] | None
    saved: bool = False  # whether this run has written a checkpoint yet
    _update: Callable[..., Any] | None = None

    def step(
        self, params: Params, state: AdamState, tokens: np.ndarray, lengths: np.ndarray
    ) -> tuple[Params, AdamState, Any]:
        """One Adam step on a host batch: the runner's shards' loss and gradient, added."""
        total = (len(lengths), int(np.minimum(lengths - 1, params.config.block_size).sum()))
        loss, flat = self.runner.map(
            weighted_loss_and_grads,
            params,
            [tokens, lengths],
            self.reduction,
            *total,
            self.runner.jit,
            combine=add_pair,
        )
        if self._update is None:
            compile_fn = _xp.compiler(params.backend, self.runner.jit)
            fn = functools.partial(_update, optimizer=self.adam.config)
            self._update = fn if compile_fn is None else compile_fn(fn)
        new_params, new_state = self._update(params, _on(params, flat), state)
        return new_params, new_state, _on(params, loss)

    def run(
        self,
        result: TrainResult,
        tokens: np.ndarray,
        lengths: np.ndarray,
        steps: int,
        batch_size: int,
        seed: int,
        callback: Callable[[int, float], None] | None,
    ) -> None:
        """Take the steps ``result.step .. steps - 1``, updating ``result`` after each."""
        params, adam, n = result.params, self.adam, len(lengths)
        trim = _xp.compiler(params.backend, self.runner.jit) is None  # else one shape
        bound = DIVERGED * math.log(params.config.vocab_size)
        with warnings.catch_warnings():  # overflow in a diverging step: reported below
            warnings.simplefilter("ignore", RuntimeWarning)
            for step in range(result.step, steps):
                idx = batch_indices(n, batch_size, step, seed)
                batch = take_batch(tokens, lengths, idx) if trim else (tokens[idx], lengths[idx])
                new_params, new_state, loss = self.step(params, adam.state, *batch)
                loss, new_params, new_state = materialize(loss, new_params, new_state)
                value = float(_xp.read_scalar(loss))
                if not (math.isfinite(value) and value <= bound):
                    why = (
                        f" (over {bound:.0f}, {DIVERGED:g} times a uniform guess's: the run "
                        "diverged; a smaller learning rate may not)"
                        if math.isfinite(value)
                        else ""
                    )
                    raise TrainingError(
                        f"the loss is {value} at step {step + 1}{why}; training stopped{self._kept()}"
                    )
                params, done = new_params, step + 1
                adam.advance(new_state)
                result.losses.append(value)
                self.history["losses"].append(value)
                result.params, result.step = params, done
                if callback is not None:
                    callback(done, value)
                if self.held_out is not None and (done % self.eval_every == 0 or done == steps):
                    self.evaluate(result)
                cp_every = self.checkpoint_every
                if self.checkpoint is not None and cp_every > 0 and done % cp_every == 0:
                    self.save(params, done)

    def evaluate(self, result: TrainResult) -> None:
        """Score the held-out documents with the current weights (as ``eval`` does)."""
        assert self.held_out is not None
        summary = score_docs(result.params, self.tokenizer, self.held_out, runner=self.runner)
        result.val_losses.append((result.step, summary.mean))
        self.history["val_losses"].append([result.step, summary.mean])
        if self.on_eval is not None:
            self.on_eval(result.step, summary.mean)

    def _kept(self) -> str:
        """What a stopped run leaves: ``"; ..."`` naming its checkpoint, if it has one."""
        if self.checkpoint is None:
            return ""
        if self.saved:
            return f"; the last good checkpoint {str(self.checkpoint)!r} is kept"
        if self.resumed and Path(self.checkpoint).exists():
            return f"; the checkpoint {str(self.checkpoint)!r} it resumed from is kept"
        return f"; no checkpoint of this run was written to {str(self.checkpoint)!r}"

    def save(self, params: Params, step: int) -> None:
        """Checkpoint the run after ``step`` steps, unless an update has made a weight
        non-finite (then :class:`TrainingError`, and the last good checkpoint stays)."""
        assert self.checkpoint is not None
        if not finite(params):
            raise TrainingError(
                f"the weights are not finite after step {step}; training stopped{self._kept()}"
            )
        meta = {"run": self.run_info, "history": self.history}
        save(
            self.checkpoint, params, adam=self.adam, step=step, tokenizer=self.tokenizer, meta=meta
        )
        self.saved = True


def weighted_loss_and_grads(
    params: Params,
    tokens: np.ndarray,
    lengths: np.ndarray,
    reduction: Reduction,
    total_rows: int,
    total_tokens: int,
    jit: bool | None = False,
) -> tuple[Any, Any]:
    """One shard's task: its loss and flat gradient, each times the shard's share of the
    batch (of its rows for ``"mean"``, of its predicted tokens for ``"token_mean"``), so
    that the shards' results add up to the batch's; compiled as ``jit`` says."""
    if reduction == "mean":
        weight = len(lengths) / total_rows
    else:
        weight = float(np.minimum(lengths - 1, params.config.block_size).sum() / total_tokens)
    tok, lens = to_batch(tokens, lengths, params.backend, device=params.device)
    fn: Callable[..., Any] = _LOSS_AND_GRADS[reduction]
    if _xp.compiler(params.backend, jit) is not None:
        fn = _xp.compiled(fn, params.backend)
    loss, flat = fn(params, tok, lens)
    return (loss, flat) if weight == 1.0 else (weight * loss, weight * flat)


def _flat_loss_and_grads(
    params: Params, tokens: Any, lengths: Any, reduction: Reduction
) -> tuple[Any, Any]:
    # the batches come from the corpus encoded and checked once, at the start
    loss, grads = loss_and_grads(params, tokens, lengths, reduction=reduction, check=False)
    return loss, flatten(grads)


# one function per reduction, so that a compiler sees only arrays
_LOSS_AND_GRADS = {
    r: functools.partial(_flat_loss_and_grads, reduction=r) for r in ("mean", "token_mean")
}


def _update(
    params: Params, flat: Any, state: AdamState, *, optimizer: AdamConfig
) -> tuple[Params, AdamState]:
    return adam_update(params, unflatten(flat, params.config), state, optimizer)


def add_pair(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    """``(loss, flat gradient)`` pairs added (the combine of the shards' results)."""
    return a[0] + b[0], a[1] + b[1]


def _on(params: Params, x: Any) -> Any:
    """A shard result on the weights' namespace and device (a runner's workers return
    their own arrays: NumPy from worker processes and Dask tasks)."""
    if _xp.backend_of(x) == params.backend:
        return x
    return _xp.asarray(_xp.to_numpy(x), params.backend, device=params.device)

"""The training loop: shuffled batches of documents, the hand-written backward pass, Adam
with linear decay, held-out loss, per-step callbacks and atomic checkpoints that a run
resumes from exactly.

Where the arrays live (``backend``, ``device``) and how a batch is spread over workers
(``runner``: :mod:`microgpt_xp.runners`) are two separate choices; this module asks the
runner, and never a backend's name, how a step runs.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from . import _xp, runners
from ._files import claim
from ._xp import to_batch
from .checkpoint import save
from .config import GPTConfig
from .data import (
    Tokenizer,
    batch_indices,
    check_docs,
    default_block_size,
    encode_docs,
    take_batch,
)
from .model import Reduction, _check_reduction, _loss_and_grads, _train_step
from .optim import Adam, AdamConfig, AdamState, adam_config, adam_update
from .params import Params, flatten, init_params, materialize, unflatten
from .resources import use_threads
from .resume import ResumeError, corpus_digest, resume, run_record
from .scale import score_docs

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "ResumeError",
    "TrainOptions",
    "TrainResult",
    "TrainingError",
    "corpus_digest",
    "to_batch",
    "train",
]

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


class TrainOptions(TypedDict, total=False):
    """The keyword options of :func:`train` that have defaults most runs keep.

    Attributes:
        tokenizer: default: built from ``docs`` and ``val_docs``.
        reduction: the batch loss, ``"mean"`` (default) or ``"token_mean"`` (see
            :func:`~microgpt_xp.loss_and_grads`).
        eval_every: with ``val_docs``, score them every this many steps (default: a
            tenth of the run, at least 1) and after the last step.
        on_eval: called as ``on_eval(step, val_loss)`` after each held-out scoring.
        threads: BLAS (and PyTorch) threads of this process during the run (default: the
            choice of :func:`microgpt_xp.resources.blas_threads` for the model, the batch
            and the machine's load).
        jit: ``runner=Local(jit=...)`` in a word: ``None`` compiles the step where the
            namespace has a compiler (JAX; every batch is then padded to the corpus's
            longest document, so the run compiles once), ``False`` runs eagerly, ``True``
            insists (``ValueError`` on a namespace without a compiler).
        lr: ``optimizer=AdamConfig(lr=...)`` in a word (the spec's 0.01 by default).
        workers: ``runner=Processes(workers)`` in a word.
        chunk_size: with ``backend="dask"``, documents per Dask task.
        checkpoint_every: also save every this many steps (0: only at the end).
        resume: continue the run that ``checkpoint`` holds, when that file exists.
        overwrite: replace an existing ``checkpoint`` with a new run.
    """

    tokenizer: Tokenizer
    reduction: Reduction
    eval_every: int
    on_eval: Callable[[int, float], None]
    threads: int | None
    jit: bool | None
    lr: float
    workers: int | None
    chunk_size: int | None
    checkpoint_every: int
    resume: bool
    overwrite: bool


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
    optimizer: AdamConfig | None = None,
    checkpoint: str | Path | None = None,
    val_docs: Sequence[str] | None = None,
    callback: Callable[[int, float], None] | None = None,
    **options: Unpack[TrainOptions],
) -> TrainResult:
    """Train microgpt on a list of documents, ``batch_size`` documents a step.

    Args:
        docs: the corpus, a sequence of strings (default:
            :func:`~microgpt_xp.data.default_docs`).
        steps: number of Adam steps; also the length of the linear learning-rate decay.
        batch_size: documents per step (batch ``b`` of step ``s`` is fixed by ``seed``).
        seed: seeds the initial weights and the batch order; a seed gives the same run on
            a backend.
        config: model shape (default: the spec's, with the tokenizer's vocabulary and a
            block size of 16, or the longest document + 1 where that is more, so that no
            document is cut: :func:`~microgpt_xp.data.default_block_size`, as the CLI).
        params: start from these weights instead of fresh ones.
        backend, device, dtype: where the weights live and train (a table name such as
            ``"numpy"``, ``"torch"``, or an Array API namespace). ``backend="dask"`` is
            Dask tasks over NumPy chunks (``runner=DaskTasks(chunk_size)``), the result's
            weights Dask arrays.
        runner: how each batch is spread over workers (:mod:`microgpt_xp.runners`):
            ``Local()`` (default: this process), ``Processes(n)`` (row shards over ``n``
            processes; equal to one process up to rounding), ``DaskTasks(chunk_size)``.
        optimizer: Adam's :class:`~microgpt_xp.AdamConfig` (its ``num_steps`` is set to
            ``steps``).
        checkpoint: a path; saved every ``checkpoint_every`` steps (if > 0) and at the
            end. It is claimed for the run at the start (a second run on it stops with
            ``FileExistsError``) and checked for writability before the first step. An
            existing file is refused unless ``resume`` or ``overwrite`` is given. With
            ``resume`` the losses are those of an uninterrupted run; every argument that
            would change them (``seed``, ``batch_size``, ``lr``, ``dtype``, ``reduction``,
            the corpus, the held-out documents, the tokenizer, the config) must be the
            checkpoint's, or :class:`ResumeError` names it; ``steps`` must be the run's,
            except that a *finished* run is extended by asking for more (the learning rate
            then follows the schedule of a run of the new length from the step reached).
        val_docs: held-out documents, scored (their mean loss, as ``eval`` gives it)
            every ``eval_every`` steps and at the end: ``TrainResult.val_losses``, the
            checkpoint's history.
        callback: called as ``callback(step, loss)`` after every step (``step`` 1-based).
        options: see :class:`TrainOptions` (``reduction``, ``eval_every``, ``jit``, the
            one-word spellings ``lr``, ``workers``, ``chunk_size`` and the checkpoint's
            ``checkpoint_every``, ``resume``, ``overwrite``).

    Raises ``ValueError``/``TypeError`` for bad arguments (:class:`ResumeError` for a
    resume that would change the run, ``FileExistsError`` for a checkpoint in the way)
    and :class:`TrainingError` when a loss or a weight is not finite, or the loss has
    diverged (the last good checkpoint, if one was saved, is kept).
    """
    opts = _Options.of(options, steps=steps, batch_size=batch_size, seed=seed, dtype=dtype)
    backend = _xp.check_backend(backend)
    runner, home = runners.resolve(
        runner, backend, workers=opts.workers, chunk_size=opts.chunk_size, jit=opts.jit
    )
    optimizer = adam_config(optimizer, **({} if opts.lr is None else {"lr": opts.lr}))
    optimizer = adam_config(optimizer, num_steps=steps)
    if opts.resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    if checkpoint is not None and Path(checkpoint).exists() and not (opts.resume or opts.overwrite):
        raise FileExistsError(
            f"checkpoint {str(checkpoint)!r} exists; resume it (resume=True) or replace it "
            "(overwrite=True)"
        )
    docs = check_docs(docs, "docs")
    held_out = None if val_docs is None else check_docs(val_docs, "val_docs")
    every_doc = docs if held_out is None else [*docs, *held_out]
    tokenizer = opts.tokenizer or Tokenizer.from_docs(every_doc)
    if config is None:
        config = (
            params.config
            if params is not None
            else GPTConfig(tokenizer.vocab_size, block_size=default_block_size(every_doc))
        )
    if config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"config.vocab_size {config.vocab_size} does not match the tokenizer's {tokenizer.vocab_size}"
        )
    tokens, lengths = encode_docs(tokenizer, docs, config.block_size)
    batch_indices(len(docs), batch_size, 0, seed)  # raises early if the corpus is too small
    run = run_record(seed, batch_size, optimizer.lr, dtype, opts.reduction, docs, held_out)
    home_device = device if home == backend else None
    # the claim checks again, under its lock, that no other run made the file meanwhile
    exist_ok = opts.resume or opts.overwrite
    with claim(checkpoint, exist_ok=exist_ok) if checkpoint is not None else _no_claim():
        resumed = (
            resume(checkpoint, run, steps, config, tokenizer, home, home_device, params)
            if opts.resume and checkpoint is not None and Path(checkpoint).exists()
            else None
        )
        if resumed is not None:
            params, adam, history = resumed
        else:
            params = _start(params, config, seed, home, home_device, dtype)
            adam, history = Adam(params, optimizer), {"losses": [], "val_losses": []}
        result = TrainResult(params, adam, tokenizer, step=adam.t, start_step=adam.t)
        loop = _Loop(runner, opts, adam, tokenizer, held_out, checkpoint, run, history)
        try:
            with use_threads(opts.threads, config=config, batch_size=batch_size):
                loop.run(result, tokens, lengths, steps, batch_size, seed, callback)
        finally:
            runner.close()
        if checkpoint is not None:
            loop.save(result.params, result.step)
    if _xp.entry(backend).chunked:  # in memory on the caller's side: outlives any cluster
        result.params = result.params.to(backend)
    return result


@dataclass(frozen=True)
class _Options:
    """The checked :class:`TrainOptions` of a call, with their defaults."""

    tokenizer: Tokenizer | None = None
    reduction: Reduction = "mean"
    eval_every: int | None = None
    on_eval: Callable[[int, float], None] | None = None
    threads: int | None = None
    jit: bool | None = None
    lr: float | None = None
    workers: int | None = None
    chunk_size: int | None = None
    checkpoint_every: int = 0
    resume: bool = False
    overwrite: bool = False

    @classmethod
    def of(cls, options: Any, *, steps: Any, batch_size: Any, seed: Any, dtype: str) -> _Options:
        unknown = set(options) - set(TrainOptions.__annotations__)
        if unknown:
            raise TypeError(f"train() got unexpected keyword arguments {sorted(unknown)}")
        opts = cls(**options)
        _xp.check_dtype(dtype)
        _xp.check_positive_int(steps, "steps")
        _xp.check_positive_int(batch_size, "batch size")
        _check_reduction(opts.reduction)
        _xp.check_nonnegative_int(seed, "seed")
        for name in ("eval_every", "chunk_size", "workers", "threads"):
            value = getattr(opts, name)
            if value is not None:
                _xp.check_positive_int(value, name.replace("_", " "))
        if isinstance(opts.checkpoint_every, bool) or not isinstance(opts.checkpoint_every, int):
            raise ValueError(f"checkpoint_every must be an int, got {opts.checkpoint_every!r}")
        if opts.tokenizer is not None and not isinstance(opts.tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be a Tokenizer, got {type(opts.tokenizer).__name__}")
        return opts


class _no_claim:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _start(
    params: Params | None, config: GPTConfig, seed: int, backend: str, device: Any, dtype: str
) -> Params:
    """Fresh weights, or ``params`` checked and placed on the run's backend and dtype."""
    if params is None:
        return init_params(config, seed=seed, backend=backend, device=device, dtype=dtype)
    if params.config != config:
        raise ValueError(f"params have {params.config}, not {config}")
    if not finite(params):
        raise ValueError("params= holds weights that are not finite (NaN or inf)")
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


class _Loop:
    """The steps of a run: ``step(params, state, tokens, lengths) -> (new_params,
    new_state, loss)`` from a host batch on the runner, held-out scoring, checkpoints."""

    def __init__(
        self,
        runner: runners.Runner,
        opts: _Options,
        adam: Adam,
        tokenizer: Tokenizer,
        held_out: list[str] | None,
        checkpoint: str | Path | None,
        run: dict[str, Any],
        history: dict[str, list[Any]],
    ) -> None:
        self.runner, self.opts, self.adam, self.tokenizer = runner, opts, adam, tokenizer
        self.held_out, self.checkpoint, self.run_info, self.history = (
            held_out,
            checkpoint,
            run,
            history,
        )
        self.saved = False  # whether this run has written a checkpoint yet
        self._compiled: Callable[..., Any] | None = None

    def step(
        self, params: Params, state: AdamState, tokens: np.ndarray, lengths: np.ndarray
    ) -> tuple[Params, AdamState, Any]:
        hp, reduction = self.adam.config, self.opts.reduction
        if self.runner.shards:
            total = (len(lengths), int(np.minimum(lengths - 1, params.config.block_size).sum()))
            loss, flat = self.runner.map(
                weighted_loss_and_grads,
                params,
                [tokens, lengths],
                reduction,
                *total,
                combine=add_pair,
            )
            loss, flat = _on(params, loss), _on(params, flat)
            new_params, new_state = adam_update(params, unflatten(flat, params.config), state, hp)
            return new_params, new_state, loss
        if self._compiled is None:
            compile_fn = _xp.compiler(params.backend, self.runner.jit)
            fn = functools.partial(_train_step, reduction=reduction, optimizer=hp)
            self._compiled = fn if compile_fn is None else compile_fn(fn)
        tok, lens = to_batch(tokens, lengths, params.backend, device=params.device)
        return self._compiled(params, state, tok, lens)  # type: ignore[no-any-return]

    def trims(self, params: Params) -> bool:
        """Whether batches are trimmed to their longest document (a compiled step keeps
        one shape instead)."""
        return self.runner.shards or _xp.compiler(params.backend, self.runner.jit) is None

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
        trim = self.trims(params)
        every = self.opts.eval_every or max(1, steps // 10)
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
                params = new_params
                adam.advance(new_state)
                result.losses.append(value)
                self.history["losses"].append(value)
                result.params, result.step = params, step + 1
                if callback is not None:
                    callback(step + 1, value)
                if self.held_out is not None and ((step + 1) % every == 0 or step + 1 == steps):
                    self.evaluate(result)
                cp_every = self.opts.checkpoint_every
                if self.checkpoint is not None and cp_every > 0 and (step + 1) % cp_every == 0:
                    self.save(params, step + 1)

    def evaluate(self, result: TrainResult) -> None:
        """Score the held-out documents with the current weights (as ``eval`` does)."""
        assert self.held_out is not None
        summary = score_docs(result.params, self.tokenizer, self.held_out, runner=self.runner)
        result.val_losses.append((result.step, summary.mean))
        self.history["val_losses"].append([result.step, summary.mean])
        if self.opts.on_eval is not None:
            self.opts.on_eval(result.step, summary.mean)

    def _kept(self) -> str:
        """What a stopped run leaves: ``"; ..."`` naming its checkpoint, if it has one."""
        if self.checkpoint is None:
            return ""
        if self.saved:
            return f"; the last good checkpoint {str(self.checkpoint)!r} is kept"
        if self.opts.resume and Path(self.checkpoint).exists():
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
) -> tuple[Any, Any]:
    """One shard's task: its loss and flat gradient, each times the shard's share of the
    batch — of its rows (``"mean"``) or of its predicted tokens (``"token_mean"``) — so
    that the shards' results add up to the batch's (up to rounding)."""
    if reduction == "mean":
        weight = len(lengths) / total_rows
    else:
        weight = float(np.minimum(lengths - 1, params.config.block_size).sum() / total_tokens)
    tok, lens = to_batch(tokens, lengths, params.backend, device=params.device)
    loss, grads = _loss_and_grads(params, tok, lens, reduction)
    return weight * loss, weight * flatten(grads)


def add_pair(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    """``(loss, flat gradient)`` pairs added (the combine of the shards' results)."""
    return a[0] + b[0], a[1] + b[1]


def _on(params: Params, x: Any) -> Any:
    """A shard result on the weights' namespace and device (a runner's workers return
    their own arrays: NumPy from worker processes and Dask tasks)."""
    if _xp.backend_of(x) == params.backend:
        return x
    return _xp.asarray(_xp.to_numpy(x), params.backend, device=params.device)

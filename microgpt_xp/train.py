"""The training loop: batches of documents or windows of text, the loss and gradient on a
runner, Adam, held-out loss, callbacks and atomic checkpoints that a run resumes from
exactly (also an interrupted one). It never asks a backend's name."""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _xp, runners
from ._checks import check_reduction
from ._errors import ArgumentTypeError, ArgumentValueError
from ._files import claim
from ._xp import to_batch
from .checkpoint import save
from .config import GPTConfig
from .data import (
    TEXT_BLOCK_SIZE,
    Tokenizer,
    batch_indices,
    check_docs,
    check_text,
    default_block_size,
    encode_docs,
    encode_text,
    held_out_rows,
    length_groups,
    pack_batch,
    predicted,
    split_docs,
    split_text,
    take_batch,
    take_windows,
    text_windows,
)
from .model import Reduction, loss_and_grads
from .optim import Adam, AdamConfig, AdamState, adam_config, adam_update
from .params import Params, flatten, init_params, materialize, unflatten
from .resources import check_threads, use_threads
from .resume import HISTORY, OPTIMIZER_FIELDS, ResumeError, corpus_digest, run_record
from .resume import resume as resume_run
from .scoring import score_docs, score_encoded

__all__ = [
    "ResumeError",
    "StepStats",
    "TrainResult",
    "TrainingError",
    "corpus_digest",
    "to_batch",
    "train",
]

#: What one more call of the loss and gradient costs, in positions times ``n_embd²``: 128
#: positions of a 128-channel model, set so that names.txt's batches run whole and
#: Shakespeare's lines in groups (docs/training.md); the spec's model never groups.
CALL_COST = 128 * 128**2

#: A batch loss over this many times a uniform guess's (``ln V``): the run has diverged.
DIVERGED = 100.0
#: Held-out scoring's default share of the tokens trained between two evaluations (a
#: forward costs about a third of a step: about a tenth of the run), and its floor.
EVAL_SHARE = 0.3
EVAL_MIN_TOKENS = 512

#: train()'s keywords that replace a field of its optimizer's AdamConfig.
_ADAM_KEYWORDS = ("lr", "warmup", "decay", "min_lr", "weight_decay", "grad_clip", "init_std")

#: ``(tokens (B, L), lengths (B,))`` of a step (0-based) on the host, rows trimmed to the
#: longest if the second argument says so (else one shape).
Batches = Callable[[int, bool], tuple[np.ndarray, np.ndarray]]


class TrainingError(RuntimeError):
    """Training could not go on (a non-finite or diverged loss, or non-finite weights)."""


@dataclass
class TrainResult:
    """What :func:`train` returns: the weights, the optimizer, the tokenizer, the batch loss
    of each step run (``losses[i]`` before update ``start_step + i``), the steps taken, and
    held-out losses as ``(step, loss)`` pairs: ``val_losses`` the mean over documents of
    their mean loss, ``val_token_losses`` the mean over tokens (text: both per token)."""

    params: Params
    adam: Adam
    tokenizer: Tokenizer
    losses: list[float] = field(default_factory=list)
    step: int = 0
    start_step: int = 0
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    val_token_losses: list[tuple[int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class StepStats:
    """What ``on_step`` gets after each step: ``step`` (1-based), ``loss`` (before the
    update), ``tokens`` (predicted, padding not counted) and ``seconds`` (wall time)."""

    step: int
    loss: float
    tokens: int
    seconds: float


def train(
    docs: Sequence[str] | None = None,
    *,
    text: str | None = None,
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
    val_text: str | None = None,
    val_fraction: float | None = None,
    eval_every: int | None = None,
    eval_tokens: int | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    callback: Callable[[int, float], None] | None = None,
    on_step: Callable[[StepStats], None] | None = None,
    warmup: int | None = None,
    decay: str | None = None,
    min_lr: float | None = None,
    weight_decay: float | None = None,
    grad_clip: float | None = None,
    init_std: float | None = None,
    pack: bool = False,
) -> TrainResult:
    """Train microgpt on documents or a stream of text, ``batch_size`` rows a step, and
    return a :class:`TrainResult` (docs/training.md tells the whole story).

    Args:
        docs: the corpus (default :func:`~microgpt_xp.data.default_docs`), read in epochs
            (:func:`~microgpt_xp.data.batch_indices`); or ``text``: one stream, each row a
            window of ``block_size + 1`` characters drawn by ``default_rng([seed, step])``.
        steps, batch_size, seed: Adam steps (the decay's length), rows a step, and the seed
            of the initial weights and the batch order.
        config, params: the model's shape (default: the spec's with the tokenizer's
            vocabulary and :func:`~microgpt_xp.data.default_block_size`, 16 for text), or
            weights to start from.
        backend, device, dtype: where the weights live (a table name or an Array API
            namespace; ``"dask"``: tasks over NumPy chunks).
        runner, workers, chunk_size, jit: how a batch is spread (default ``Local(jit)``;
            ``workers=N``: ``Processes(N)``; ``chunk_size``: a Dask task's rows; ``jit=None``
            compiles where the namespace can, ``False`` never).
        threads: BLAS threads during the run: a count, ``"auto"`` or ``None`` (untouched).
        optimizer, lr, warmup, decay, min_lr, weight_decay, grad_clip, init_std: Adam's
            :class:`~microgpt_xp.AdamConfig` (``num_steps=steps``), fields replaced where given.
        reduction: the batch loss, ``"mean"`` or ``"token_mean"``.
        tokenizer: default: built from the training and held-out corpora.
        checkpoint, checkpoint_every, resume, overwrite: a path claimed for the run, saved
            every ``checkpoint_every`` steps and at the end; an existing one is refused
            unless ``resume`` (the uninterrupted run's losses; :class:`ResumeError` names an
            argument that differs; more ``steps`` extend a finished run) or ``overwrite``.
        val_docs, val_text, val_fraction: held-out data (or this fraction: the text's end,
            :func:`~microgpt_xp.data.split_docs` by ``seed``), scored every ``eval_every``
            steps (default a tenth of the run) and at the end on at most ``eval_tokens``
            (default 0.3 times the tokens trained in between, at least 512); then
            ``on_eval(step, val_loss)``.
        callback, on_step: after each step, ``callback(step, loss)`` (1-based), then
            ``on_step(StepStats(...))``.
        pack: documents only: each step's documents packed into fewer rows
            (:func:`~microgpt_xp.data.pack_batch`), the same loss and gradient to rounding
            with little padding (a stream's windows have none: ``text=`` refuses it).

    A ``KeyboardInterrupt`` with a ``checkpoint`` first saves the last step completed, so
    resuming gives the uninterrupted run. ``ValueError``/``TypeError`` for bad arguments,
    ``FileExistsError`` for a checkpoint in the way, :class:`TrainingError` for a loss or
    weight that is not finite or a diverged loss (the last good checkpoint is kept).
    """
    _xp.check_dtype(dtype)
    _xp.check_positive_int(steps, "steps")
    _xp.check_positive_int(batch_size, "batch_size", most=_xp.NATIVE_INT_MAX)
    check_reduction(reduction)
    _xp.check_nonnegative_int(seed, "seed")
    for name, value in (
        ("eval_every", eval_every),
        ("eval_tokens", eval_tokens),
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
    held = [v is not None for v in (val_docs, val_text, val_fraction)]
    no_path, no_held_out = checkpoint is None, not any(held)
    path, data = "needs a checkpoint path", "needs held-out data (val_docs, val_text, val_fraction)"
    for name, clash, why in (  # corpora that do not go together; options that would do nothing
        ("text", text is not None and docs is not None, "and docs= are exclusive"),
        ("val_docs", text is not None and held[0], "goes with docs=, not text="),
        ("val_text", text is None and held[1], "goes with text=, not docs="),
        ("val_fraction", held[2] and (held[0] or held[1]), "excludes val_docs= and val_text="),
        ("resume", resume and no_path, path),
        ("overwrite", overwrite and no_path, path),
        ("checkpoint_every", checkpoint_every > 0 and no_path, path),
        ("eval_every", eval_every is not None and no_held_out, data),
        ("eval_tokens", eval_tokens is not None and no_held_out, data),
        ("pack", pack is True and text is not None, "packs documents; a stream has no padding"),
    ):
        if clash:
            raise ArgumentValueError(name, f"{name}= {why}")
    if not isinstance(pack, bool):
        raise ArgumentTypeError("pack", f"pack must be True or False, got {pack!r}")
    if held[2] and (isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real)):
        raise ArgumentTypeError(
            "val_fraction", f"val_fraction must be a real number: {val_fraction!r}"
        )
    values = (lr, warmup, decay, min_lr, weight_decay, grad_clip, init_std)
    given = {k: v for k, v in zip(_ADAM_KEYWORDS, values, strict=True) if v is not None}
    optimizer = adam_config(optimizer, **given, num_steps=steps)  # one call: warmup < steps
    if checkpoint is not None and Path(checkpoint).exists() and not (resume or overwrite):
        raise FileExistsError(
            f"checkpoint {str(checkpoint)!r} exists; resume it (resume=True) or replace it "
            "(overwrite=True)"
        )
    corpus, held_out, tokenizer = _corpora(
        docs, text, val_docs, val_text, val_fraction, seed, tokenizer
    )
    if config is None and params is not None:
        config = params.config
    elif config is None:
        every_doc = [*corpus, *(held_out or [])]
        block = TEXT_BLOCK_SIZE if text is not None else default_block_size(every_doc)
        config = GPTConfig(tokenizer.vocab_size, block_size=block)
    if config.vocab_size != tokenizer.vocab_size:
        raise ArgumentValueError(
            "config" if params is None or config is not params.config else "params",
            f"config.vocab_size {config.vocab_size} does not match the tokenizer's "
            f"{tokenizer.vocab_size}",
        )
    block = config.block_size
    if text is not None:
        ids = encode_text(tokenizer, corpus[0])
        text_windows(len(ids), block, batch_size, 0, seed)  # raises early if the text is short
        batches: Batches = functools.partial(_windows, ids, block, batch_size, seed)
        step_tokens = float(batch_size * block)
    else:
        tokens, lengths = encode_docs(tokenizer, corpus, block)
        batch_indices(len(corpus), batch_size, 0, seed)  # raises early if the corpus is too small
        batches = functools.partial(_doc_batch, tokens, lengths, batch_size, seed)
        step_tokens = batch_size * float(predicted(lengths, block).mean())
    every = eval_every or max(1, steps // 10)
    if eval_tokens is None:
        eval_tokens = max(EVAL_MIN_TOKENS, math.ceil(EVAL_SHARE * every * step_tokens))
    scorer = None
    if held_out:
        scorer = _held_out(tokenizer, held_out, text is not None, block, eval_tokens)
    run = run_record(
        seed,
        batch_size,
        optimizer.lr,
        dtype,
        reduction,
        corpus,
        held_out,
        mode="docs" if text is None else "text",
        optimizer={k: getattr(optimizer, k) for k in OPTIMIZER_FIELDS},
        eval_tokens=eval_tokens,
        pack=pack,
    )
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
            start = _start(params, config, seed, backend, device, dtype, optimizer.init_std)
            params = runner.place(start)
            adam = Adam(params, optimizer)
            history = {k: [] for k in HISTORY}
        result = TrainResult(params, adam, tokenizer, step=adam.t, start_step=adam.t)
        loop = _Loop(
            runner, reduction, adam, checkpoint, checkpoint_every, resume, run, history, scorer,
            every, on_eval, pack,
        )  # fmt: skip
        with use_threads(threads, config=config, batch_size=batch_size):
            try:
                loop.run(result, batches, steps, callback, on_step)
            finally:  # inside: the workers' pool restores the threads it found when it started
                runner.close()
        if checkpoint is not None:
            loop.save(result, result.step, result.params)
    if _xp.entry(backend).chunked:  # in memory on the caller's side: outlives any cluster
        result.params = result.params.to(backend)
    return result


def _corpora(
    docs: Sequence[str] | None,
    text: Any,
    val_docs: Sequence[str] | None,
    val_text: Any,
    val_fraction: float | None,
    seed: int,
    tokenizer: Tokenizer | None,
) -> tuple[list[str], list[str] | None, Tokenizer]:
    """``(training corpus, held-out corpus or None, tokenizer)``: documents, or a text run's
    one stream in a list."""
    if text is not None:
        text = check_text(text, "text")
        if val_fraction is not None:
            text, val_text = split_text(text, float(val_fraction))
        held_text = None if val_text is None else check_text(val_text, "val_text")
        tokenizer = tokenizer or Tokenizer(set(text).union(held_text or ""))
        return [text], None if held_text is None else [held_text], tokenizer
    corpus = check_docs(docs, "docs")
    held = None if val_docs is None else check_docs(val_docs, "val_docs")
    if val_fraction is not None:
        corpus, held = split_docs(corpus, float(val_fraction), seed, "val_fraction")
    return corpus, held, tokenizer or Tokenizer.from_docs([*corpus, *(held or [])])


def _windows(
    ids: np.ndarray, block: int, batch_size: int, seed: int, step: int, trim: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A text run's batch of step ``step``: windows of ``block + 1`` tokens (one shape)."""
    return take_windows(ids, text_windows(len(ids), block, batch_size, step, seed), block)


def _doc_batch(
    tokens: np.ndarray, lengths: np.ndarray, batch_size: int, seed: int, step: int, trim: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A run on documents' batch of step ``step``."""
    idx = batch_indices(len(lengths), batch_size, step, seed)
    return take_batch(tokens, lengths, idx) if trim else (tokens[idx], lengths[idx])


#: ``(mean over documents, mean over tokens)`` of the held-out data for weights on a runner.
Scorer = Callable[[Params, runners.Runner], tuple[float, float]]


def _held_out(
    tokenizer: Tokenizer, held_out: list[str], text: bool, block: int, max_tokens: int
) -> Scorer:
    """The scorer of a held-out stream's fixed windows (both means per token), or of the first
    held-out documents that predict at most ``max_tokens`` tokens in all (at least one)."""
    if text:
        tokens, lengths = held_out_rows(tokenizer, held_out[0], block, max_tokens)
    else:
        fits = np.cumsum([min(len(d) + 1, block) for d in held_out])
        first = held_out[: max(1, int(np.searchsorted(fits, max_tokens, side="right")))]

    def scorer(params: Params, runner: runners.Runner) -> tuple[float, float]:
        if text:
            mean = score_encoded(params, tokens, lengths, runner=runner).token_mean
            return mean, mean
        summary = score_docs(params, tokenizer, first, runner=runner)
        return summary.mean, summary.token_mean

    return scorer


def _start(
    params: Params | None,
    config: GPTConfig,
    seed: int,
    backend: str,
    device: Any,
    dtype: str,
    std: float,
) -> Params:
    """Fresh weights (of standard deviation ``std``), or ``params`` checked and placed on
    the run's backend and dtype."""
    if params is None:
        return init_params(config, seed=seed, backend=backend, device=device, dtype=dtype, std=std)
    if params.config != config:
        raise ArgumentValueError("params", f"params have {params.config}, not {config}")
    if not finite(params):
        raise ArgumentValueError("params", "params= holds weights that are not finite (NaN or inf)")
    if params.backend != backend or _xp.dtype_name(params.wte) != dtype:
        return params.to(backend, dtype=dtype)
    return params


def finite(params: Params) -> bool:
    """Whether every weight is finite (``True`` where that cannot be read)."""
    xp = params.xp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _xp.read_scalar(xp.all(xp.isfinite(flatten(params))), bool) is not False


@dataclass
class _Loop:
    """A run's steps on its runner, its held-out scoring and its checkpoints."""

    runner: runners.Runner
    reduction: Reduction
    adam: Adam
    checkpoint: str | Path | None
    checkpoint_every: int
    resumed: bool
    run_info: dict[str, Any]
    history: dict[str, list[Any]]  # the history before this run (resumed)
    held_out: Scorer | None
    eval_every: int
    on_eval: Callable[[int, float], None] | None
    pack: bool = False  # documents packed into fewer rows (pack_batch)
    saved: bool = False  # whether this run has written a checkpoint yet
    _update: Callable[..., Any] | None = None

    def step(
        self, params: Params, state: AdamState, tokens: np.ndarray, lengths: np.ndarray
    ) -> tuple[Params, AdamState, Any]:
        """One Adam step on a host batch: the runner's shards' loss and gradient, added
        (packed: the rows of :func:`~microgpt_xp.data.pack_batch`, compiled at one width)."""
        block = params.config.block_size
        task: Callable[..., Any]
        batch: tuple[np.ndarray, ...]
        args: tuple[Any, ...]
        if self.pack:
            compiled = _xp.compiler(params.backend, self.runner.jit) is not None
            batch = pack_batch(
                tokens, lengths, block, self.reduction, width=block if compiled else None
            )
            task, args = packed_loss_and_grads, ()
        else:
            batch = (tokens, lengths)
            total = (len(lengths), int(predicted(lengths, block).sum()))
            task, args = weighted_loss_and_grads, (self.reduction, *total)
        loss, flat = self.runner.map(
            task, params, list(batch), *args, self.runner.jit, combine=add_pair
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
        batches: Batches,
        steps: int,
        callback: Callable[[int, float], None] | None,
        on_step: Callable[[StepStats], None] | None,
    ) -> None:
        """Take the steps ``result.step .. steps - 1``, updating ``result`` after each; at a
        ``KeyboardInterrupt``, checkpoint the last step completed, then re-raise."""
        params, adam = result.params, self.adam
        trim = _xp.compiler(params.backend, self.runner.jit) is None  # else one shape
        bound = DIVERGED * math.log(params.config.vocab_size)
        completed = (result.step, params, adam.state)  # with its evaluation, if one was due
        try:
            with warnings.catch_warnings():  # overflow in a diverging step: reported below
                warnings.simplefilter("ignore", RuntimeWarning)
                for step in range(result.step, steps):
                    began = time.perf_counter()
                    tokens, lengths = batches(step, trim)
                    new_params, new_state, loss = self.step(params, adam.state, tokens, lengths)
                    loss, new_params, new_state = materialize(loss, new_params, new_state)
                    value = float(_xp.read_scalar(loss))
                    if not (math.isfinite(value) and value <= bound):
                        why = (
                            f" (over {bound:.0f}, {DIVERGED:g} times a uniform guess's: the "
                            "run diverged; a smaller learning rate may not)"
                            if math.isfinite(value)
                            else ""
                        )
                        raise TrainingError(
                            f"the loss is {value} at step {step + 1}{why}; training "
                            f"stopped{self._kept()}"
                        )
                    params, done = new_params, step + 1
                    adam.advance(new_state)
                    seconds = time.perf_counter() - began
                    result.losses.append(value)
                    result.params, result.step = params, done
                    due = self.held_out is not None and (
                        done % self.eval_every == 0 or done == steps
                    )
                    if not due:
                        completed = (done, params, adam.state)
                    if callback is not None:
                        callback(done, value)
                    if on_step is not None:
                        tokens_predicted = int(predicted(lengths, params.config.block_size).sum())
                        on_step(StepStats(done, value, tokens_predicted, seconds))
                    if due:
                        self.evaluate(result)
                        completed = (done, params, adam.state)
                    if self.checkpoint_every > 0 and done % self.checkpoint_every == 0:
                        self.save(result, done, params)
        except KeyboardInterrupt:
            done, params, state = completed
            if self.checkpoint is not None and done > result.start_step:
                adam.state, adam.t = state, done
                self.save(result, done, params)
            raise

    def evaluate(self, result: TrainResult) -> None:
        """Score the held-out data with the current weights (documents: as ``eval`` does)."""
        assert self.held_out is not None
        mean, token_mean = self.held_out(result.params, self.runner)
        result.val_losses.append((result.step, mean))
        result.val_token_losses.append((result.step, token_mean))
        if self.on_eval is not None:
            self.on_eval(result.step, mean)

    def _kept(self) -> str:
        """What a stopped run leaves: ``"; ..."`` naming its checkpoint, if it has one."""
        if self.checkpoint is None:
            return ""
        if self.saved:
            return f"; the last good checkpoint {str(self.checkpoint)!r} is kept"
        if self.resumed and Path(self.checkpoint).exists():
            return f"; the checkpoint {str(self.checkpoint)!r} it resumed from is kept"
        return f"; no checkpoint of this run was written to {str(self.checkpoint)!r}"

    def save(self, result: TrainResult, step: int, params: Params) -> None:
        """Checkpoint the run after ``step`` steps: ``params``, Adam as it is and the history
        up to ``step``; :class:`TrainingError` instead for a weight that is not finite."""
        assert self.checkpoint is not None
        if not finite(params):
            raise TrainingError(
                f"the weights are not finite after step {step}; training stopped{self._kept()}"
            )
        new: dict[str, list[Any]] = {
            "losses": result.losses[: step - result.start_step],
            "val_losses": [list(p) for p in result.val_losses if p[0] <= step],
            "val_token_losses": [list(p) for p in result.val_token_losses if p[0] <= step],
        }
        history = {key: self.history[key] + new[key] for key in HISTORY}
        meta = {"run": self.run_info, "history": history}
        save(
            self.checkpoint,
            params,
            adam=self.adam,
            step=step,
            tokenizer=result.tokenizer,
            meta=meta,
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
    that the shards' results add up to the batch's; compiled as ``jit`` says, else in
    :func:`row_groups` (a shard's bits depend on its rows only, wherever it runs)."""
    fn, compiled = _task_fn(params, reduction, jit)
    groups = row_groups(params, lengths, compiled)
    parts = []
    for rows in groups:
        tok, lens = (tokens, lengths) if len(groups) == 1 else take_batch(tokens, lengths, rows)
        if reduction == "mean":
            weight = len(lens) / total_rows
        else:
            weight = float(predicted(lens, params.config.block_size).sum() / total_tokens)
        loss, flat = fn(params, *to_batch(tok, lens, params.backend, device=params.device))
        parts.append((loss, flat) if weight == 1.0 else (weight * loss, weight * flat))
    return parts[0] if len(parts) == 1 else runners.tree_sum(parts, add_pair)


def packed_loss_and_grads(
    params: Params,
    tokens: np.ndarray,
    lengths: np.ndarray,
    positions: np.ndarray,
    weights: np.ndarray,
    jit: bool | None = False,
) -> tuple[Any, Any]:
    """One shard of packed rows (:func:`~microgpt_xp.data.pack_batch`) as a runner's task:
    its loss and flat gradient in one call, the shard's share of the batch already in its
    ``weights``."""
    fn, _ = _task_fn(params, "mean", jit)  # the weights carry the reduction
    place = {"backend": params.backend, "device": params.device}
    packed = (
        _xp.asarray(positions, **place),
        _xp.asarray(weights, **place, dtype=_xp.dtype_name(params.wte)),
    )
    return fn(params, *to_batch(tokens, lengths, **place), *packed)  # type: ignore[no-any-return]


def _task_fn(params: Params, reduction: Reduction, jit: bool | None) -> tuple[Any, bool]:
    """The loss-and-flat-gradient function of ``reduction``, compiled if ``jit`` says so
    on ``params``' namespace, and whether it is."""
    fn: Callable[..., Any] = _LOSS_AND_GRADS[reduction]
    if _xp.compiler(params.backend, jit) is None:
        return fn, False
    return _xp.compiled(fn, params.backend), True


def row_groups(params: Params, lengths: np.ndarray, compiled: bool) -> list[np.ndarray]:
    """A shard's rows ``lengths (B,)`` in the groups computed one call each: eager on a CPU,
    :func:`~microgpt_xp.data.length_groups` at :data:`CALL_COST`; else one group, as it came."""
    cfg = params.config
    if compiled or len(lengths) < 2 or "cpu" not in str(params.device).lower():
        return [np.arange(len(lengths))]
    return length_groups(lengths, cfg.block_size, CALL_COST / cfg.n_embd**2)


def _flat_loss_and_grads(
    params: Params,
    tokens: Any,
    lengths: Any,
    positions: Any = None,
    weights: Any = None,
    *,
    reduction: Reduction,
) -> tuple[Any, Any]:
    # the batches come from the corpus encoded and checked once, at the start
    loss, grads = loss_and_grads(
        params, tokens, lengths, reduction=reduction, check=False, positions=positions,
        weights=weights,
    )  # fmt: skip
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
    """A shard's result on the weights' namespace and device (workers return their own
    arrays: NumPy from worker processes and Dask tasks)."""
    if _xp.backend_of(x) == params.backend:
        return x
    return _xp.asarray(_xp.to_numpy(x), params.backend, device=params.device)

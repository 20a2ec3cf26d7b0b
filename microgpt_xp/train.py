"""The training loop: batches of documents or windows of a stream of text, the
hand-written backward pass on a runner, Adam and its schedule, held-out loss at a bounded
cost, callbacks and atomic checkpoints a run resumes from exactly (also when interrupted).
Where the arrays live (``backend``) and how a batch is spread over workers (``runner``)
are two choices; this module never asks a backend's name."""

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
from ._errors import ArgumentTypeError, ArgumentValueError
from ._files import claim
from ._xp import to_batch
from .checkpoint import save
from .config import GPTConfig
from .data import (
    TEXT_BLOCK_SIZE,
    DataError,
    Tokenizer,
    batch_indices,
    check_docs,
    check_text,
    default_block_size,
    encode_docs,
    encode_text,
    held_out_rows,
    length_groups,
    split_docs,
    split_text,
    take_batch,
    take_windows,
    text_windows,
)
from .model import Reduction, _check_reduction, loss_and_grads
from .optim import Adam, AdamConfig, AdamState, adam_config, adam_update
from .params import Params, flatten, init_params, materialize, unflatten
from .resources import check_threads, use_threads
from .resume import OPTIMIZER_FIELDS, ResumeError, corpus_digest, run_record
from .resume import resume as resume_run
from .scoring import ScoreSummary, score_docs, score_encoded

__all__ = [
    "ResumeError",
    "StepStats",
    "TrainResult",
    "TrainingError",
    "corpus_digest",
    "to_batch",
    "train",
]

#: A batch loss above this many times the loss of a uniform guess (``ln V``) means the run
#: has diverged (a learning rate far too large), even while it is still finite.
DIVERGED = 100.0

#: What one more call of the loss and gradient costs, in positions computed times
#: ``n_embd²`` (measured with NumPy on a CPU: about 32 positions of a 128-channel model,
#: 2,000 of the spec's 16-channel one): where padding costs less, it is computed.
CALL_COST = 32 * 128**2

#: Held-out scoring's default share of the tokens trained between two evaluations: a
#: forward costs about a third of a training step, so about a tenth of the run's time.
EVAL_SHARE = 0.3
#: The fewest predicted tokens a default held-out evaluation scores (fewer would be noise).
EVAL_MIN_TOKENS = 512

#: ``(tokens (B, L), lengths (B,))`` of a step (0-based) on the host; the second argument
#: says whether to trim the rows to the longest (else the corpus's width: one shape).
Batches = Callable[[int, bool], tuple[np.ndarray, np.ndarray]]


class TrainingError(RuntimeError):
    """Training could not go on (a non-finite or diverged loss, or non-finite weights)."""


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained ``params``, the optimizer (its moments and
    step count), the ``tokenizer``, the loss of every step run (``losses[i]`` is the batch
    loss before update ``start_step + i``), ``step`` (the steps taken), the held-out
    losses ``val_losses`` (the mean over documents of their mean loss) and
    ``val_token_losses`` (the mean over predicted tokens), each as ``(step, loss)`` pairs;
    in text mode both are the held-out windows' mean per token."""

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
    """What ``on_step`` gets after each step: ``step`` (1-based), ``loss`` (the batch loss
    before the update), ``tokens`` (the tokens the step predicted, padding not counted)
    and ``seconds`` (the step's wall time: its batch, loss, gradient and update)."""

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
) -> TrainResult:
    """Train microgpt on a list of documents, ``batch_size`` documents a step, or on a
    stream of text, ``batch_size`` windows a step.

    Args:
        docs: the corpus, a sequence of strings (default:
            :func:`~microgpt_xp.data.default_docs`). Each step's documents come from one
            permutation of the corpus an epoch
            (:func:`~microgpt_xp.data.batch_indices`); on a CPU, without a compiler, a
            step computes its documents in groups of near-equal length where the padding
            saved pays for the extra calls (:func:`weighted_loss_and_grads`).
        text: instead of ``docs``, one stream of text (every character a token, newlines
            too): each row of a batch a window of ``block_size + 1`` characters, from an
            offset drawn by ``numpy.random.default_rng([seed, step])``, no BOS. The block
            size is the config's (default: the spec's 16).
        steps: number of Adam steps; also the length of the learning-rate decay.
        batch_size: rows per step (batch ``b`` of step ``s`` is fixed by ``seed``).
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
        warmup, decay, min_lr, weight_decay, grad_clip, init_std: replace the fields of
            the same names of ``optimizer`` (``None``: its own; the spec's by default).
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
            ``TrainResult.val_losses`` and ``val_token_losses``; ``on_eval(step,
            val_loss)`` after each. ``val_text``: a held-out stream for ``text``.
        val_fraction: hold out this fraction of the corpus instead: of ``text``, its last
            characters (contiguous, as nanoGPT's split); of ``docs``,
            :func:`~microgpt_xp.data.split_docs` by ``seed``.
        eval_tokens: the most tokens one evaluation predicts (its cost): of held-out
            documents, the first ones that fit (at least one); of a held-out stream,
            evenly spaced windows that predict disjoint tokens
            (:func:`~microgpt_xp.data.eval_windows`). Default: ``0.3`` times the tokens
            trained between two evaluations (a forward costs about a third of a training
            step, so scoring takes about a tenth of the run), at least 512.
        callback: called as ``callback(step, loss)`` after every step (``step`` 1-based);
            shorthand for ``on_step``, called as ``on_step(StepStats(...))`` after it.

    A ``KeyboardInterrupt`` (Ctrl-C; the command turns SIGTERM and SIGHUP into one) in a
    run with a ``checkpoint`` saves the state after the last step completed (its update
    and, where one was due, its evaluation) before it goes on up: resuming gives the
    losses and weights of the uninterrupted run.

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
    _check_corpora(docs, text, val_docs, val_text, val_fraction)
    changes = {
        "lr": lr,
        "warmup": warmup,
        "decay": decay,
        "min_lr": min_lr,
        "weight_decay": weight_decay,
        "grad_clip": grad_clip,
        "init_std": init_std,
    }
    given = {k: v for k, v in changes.items() if v is not None}
    optimizer = adam_config(optimizer, **given, num_steps=steps)  # one call: warmup < steps
    no_held_out = val_docs is None and val_text is None and val_fraction is None
    for name, idle in (
        ("resume", resume and checkpoint is None),
        ("overwrite", overwrite and checkpoint is None),
        ("checkpoint_every", checkpoint_every > 0 and checkpoint is None),
        ("eval_every", eval_every is not None and no_held_out),
        ("eval_tokens", eval_tokens is not None and no_held_out),
    ):
        if idle:  # an option that would do nothing
            needs = (
                "held-out data (val_docs, val_text or val_fraction)"
                if name.startswith("eval")
                else "a checkpoint path"
            )
            raise ArgumentValueError(name, f"{name}= needs {needs}")
    if checkpoint is not None and Path(checkpoint).exists() and not (resume or overwrite):
        raise FileExistsError(
            f"checkpoint {str(checkpoint)!r} exists; resume it (resume=True) or replace it "
            "(overwrite=True)"
        )
    if text is not None:
        corpus, held_out, tokenizer = _texts(text, val_text, val_fraction, tokenizer)
    else:
        corpus, held_out, tokenizer = _docs(docs, val_docs, val_fraction, seed, tokenizer)
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
        step_tokens = float(batch_size * block)
    else:
        tokens, lengths = encode_docs(tokenizer, corpus, block)
        batch_indices(len(corpus), batch_size, 0, seed)  # raises early if the corpus is too small
        step_tokens = batch_size * float(np.minimum(lengths - 1, block).mean())
    every = eval_every or max(1, steps // 10)
    if eval_tokens is None:
        eval_tokens = max(EVAL_MIN_TOKENS, math.ceil(EVAL_SHARE * every * step_tokens))
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
            history = {"losses": [], "val_losses": [], "val_token_losses": []}
        result = TrainResult(params, adam, tokenizer, step=adam.t, start_step=adam.t)
        if text is not None:
            batches: Batches = functools.partial(_windows, ids, block, batch_size, seed)
            scorer = (
                _held_out_text(tokenizer, held_out[0], block, eval_tokens) if held_out else None
            )
        else:
            batches = functools.partial(_doc_batch, tokens, lengths, batch_size, seed)
            scorer = _held_out_docs(tokenizer, held_out, block, eval_tokens) if held_out else None
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
            scorer,
            every,
            on_eval,
        )
        with use_threads(threads, config=config, batch_size=batch_size):
            try:
                loop.run(result, batches, steps, callback, on_step)
            finally:  # inside: the workers' pool restores the threads it found when it started
                runner.close()
        if checkpoint is not None:
            loop.save(result.params, result.step)
    if _xp.entry(backend).chunked:  # in memory on the caller's side: outlives any cluster
        result.params = result.params.to(backend)
    return result


def _check_corpora(docs: Any, text: Any, val_docs: Any, val_text: Any, val_fraction: Any) -> None:
    """``ArgumentValueError`` for corpora that do not go together."""
    if text is not None and docs is not None:
        raise ArgumentValueError(
            "text", "text= and docs= are exclusive: one stream of text or a list of documents"
        )
    if text is not None and val_docs is not None:
        raise ArgumentValueError(
            "val_docs", "val_docs= goes with docs=; a text run holds out val_text= or val_fraction="
        )
    if text is None and val_text is not None:
        raise ArgumentValueError(
            "val_text", "val_text= goes with text=; a run on documents holds out val_docs="
        )
    if val_fraction is not None:
        if val_docs is not None or val_text is not None:
            raise ArgumentValueError(
                "val_fraction", "val_fraction= and val_docs=/val_text= are exclusive"
            )
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
            raise ArgumentTypeError(
                "val_fraction", f"val_fraction must be a real number, got {val_fraction!r}"
            )


def _texts(
    text: Any, val_text: Any, val_fraction: float | None, tokenizer: Tokenizer | None
) -> tuple[list[str], list[str] | None, Tokenizer]:
    """``([train text], [held-out text] or None, tokenizer)`` of a text run."""
    text = check_text(text, "text")
    if val_fraction is not None:
        text, val_text = split_text(text, float(val_fraction))
    held = None if val_text is None else check_text(val_text, "val_text")
    if tokenizer is None:
        tokenizer = Tokenizer(set(text).union(held or ""))
    return [text], None if held is None else [held], tokenizer


def _docs(
    docs: Sequence[str] | None,
    val_docs: Sequence[str] | None,
    val_fraction: float | None,
    seed: int,
    tokenizer: Tokenizer | None,
) -> tuple[list[str], list[str] | None, Tokenizer]:
    """``(documents, held-out documents or None, tokenizer)`` of a run on documents."""
    corpus = check_docs(docs, "docs")
    held = None if val_docs is None else check_docs(val_docs, "val_docs")
    if val_fraction is not None:
        try:
            corpus, held = split_docs(corpus, float(val_fraction), seed)
        except DataError as exc:
            raise DataError(str(exc), "val_fraction") from exc
    every_doc = corpus if held is None else [*corpus, *held]
    return corpus, held, tokenizer or Tokenizer.from_docs(every_doc)


def _windows(
    ids: np.ndarray, block: int, batch_size: int, seed: int, step: int, trim: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A text run's batch of step ``step``: windows of ``block + 1`` tokens (one shape)."""
    return take_windows(ids, text_windows(len(ids), block, batch_size, step, seed), block)


def _doc_batch(
    tokens: np.ndarray,
    lengths: np.ndarray,
    batch_size: int,
    seed: int,
    step: int,
    trim: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """A run on documents' batch of step ``step``."""
    idx = batch_indices(len(lengths), batch_size, step, seed)
    return take_batch(tokens, lengths, idx) if trim else (tokens[idx], lengths[idx])


#: ``(mean over documents, mean over tokens)`` of the held-out data for weights on a runner.
Scorer = Callable[[Params, runners.Runner], tuple[float, float]]


def _held_out_docs(tokenizer: Tokenizer, docs: list[str], block: int, max_tokens: int) -> Scorer:
    """The scorer of held-out documents: the first ones that predict at most
    ``max_tokens`` tokens in all (at least one)."""
    predicted = np.cumsum([min(len(d) + 1, block) for d in docs])
    first = docs[: max(1, int(np.searchsorted(predicted, max_tokens, side="right")))]

    def scorer(params: Params, runner: runners.Runner) -> tuple[float, float]:
        summary = score_docs(params, tokenizer, first, runner=runner)
        return summary.mean, summary.token_mean

    return scorer


def _held_out_text(tokenizer: Tokenizer, text: str, block: int, max_tokens: int) -> Scorer:
    """The scorer of a held-out stream: its fixed windows
    (:func:`~microgpt_xp.data.eval_windows`); both means are the mean per token."""
    tokens, lengths = held_out_rows(tokenizer, text, block, max_tokens)

    def scorer(params: Params, runner: runners.Runner) -> tuple[float, float]:
        summary: ScoreSummary = score_encoded(params, tokens, lengths, runner=runner)
        return summary.token_mean, summary.token_mean

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
    held_out: Scorer | None
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
        block = params.config.block_size
        done_state = self._completed(result)
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
                    self.history["losses"].append(value)
                    result.params, result.step = params, done
                    due = self.held_out is not None and (
                        done % self.eval_every == 0 or done == steps
                    )
                    if not due:  # complete: its update and its history
                        done_state = self._completed(result)
                    if callback is not None:
                        callback(done, value)
                    if on_step is not None:
                        predicted = int(np.minimum(lengths - 1, block).sum())
                        on_step(StepStats(done, value, predicted, seconds))
                    if due:
                        self.evaluate(result)
                        done_state = self._completed(result)  # and its evaluation
                    cp_every = self.checkpoint_every
                    if self.checkpoint is not None and cp_every > 0 and done % cp_every == 0:
                        self.save(params, done)
        except KeyboardInterrupt:
            if self.checkpoint is not None and done_state[0] > result.start_step:
                self._go_back(result, done_state)
                self.save(result.params, result.step)
            raise

    def _completed(self, result: TrainResult) -> tuple[Any, ...]:
        """What :meth:`_go_back` needs to return to the state of now (the step reached,
        its weights and optimizer state, the lengths of the lists of its history)."""
        return result.step, result.params, self.adam.state, [len(x) for x in self._lists(result)]

    def _lists(self, result: TrainResult) -> list[list[Any]]:
        """The lists a step appends to: the result's and the history's."""
        return [
            result.losses,
            result.val_losses,
            result.val_token_losses,
            *self.history.values(),
        ]

    def _go_back(self, result: TrainResult, state: tuple[Any, ...]) -> None:
        """Put ``result``, Adam and the history back to a :meth:`_completed` state."""
        result.step, result.params, self.adam.state, sizes = state
        self.adam.t = result.step
        for x, n in zip(self._lists(result), sizes, strict=True):
            del x[n:]

    def evaluate(self, result: TrainResult) -> None:
        """Score the held-out data with the current weights (documents: as ``eval`` does)."""
        assert self.held_out is not None
        mean, token_mean = self.held_out(result.params, self.runner)
        result.val_losses.append((result.step, mean))
        result.val_token_losses.append((result.step, token_mean))
        self.history["val_losses"].append([result.step, mean])
        self.history["val_token_losses"].append([result.step, token_mean])
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
    that the shards' results add up to the batch's; compiled as ``jit`` says.

    Not compiled and on a CPU, the rows are computed in groups of near-equal length, each
    trimmed to its longest, where that saves more than the extra calls cost
    (:func:`~microgpt_xp.data.length_groups`, a call costing :data:`CALL_COST` ``/
    n_embd²`` positions): the same sum, to rounding, with little padding computed. A
    shard's groups depend on its rows only, so a shard gives the same bits wherever it
    runs."""
    cfg = params.config
    fn: Callable[..., Any] = _LOSS_AND_GRADS[reduction]
    groups: list[np.ndarray | None] = [None]  # None: all the rows, as they came
    if _xp.compiler(params.backend, jit) is not None:
        fn = _xp.compiled(fn, params.backend)
    elif "cpu" in str(params.device).lower() and len(lengths) > 1:
        found = length_groups(lengths, cfg.block_size, CALL_COST / cfg.n_embd**2)
        groups = [None] if len(found) == 1 else list(found)
    parts = []
    for rows in groups:
        tok, lens = (tokens, lengths) if rows is None else take_batch(tokens, lengths, rows)
        if reduction == "mean":
            weight = len(lens) / total_rows
        else:
            weight = float(np.minimum(lens - 1, cfg.block_size).sum() / total_tokens)
        loss, flat = fn(params, *to_batch(tok, lens, params.backend, device=params.device))
        parts.append((loss, flat) if weight == 1.0 else (weight * loss, weight * flat))
    return parts[0] if len(parts) == 1 else runners.tree_sum(parts, add_pair)


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

"""Resuming a run from its checkpoint: the record of what fixes a run's losses, and the
check that a resumed run is the run it continues."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _xp
from ._errors import ArgumentValueError
from .checkpoint import load
from .config import GPTConfig
from .data import Tokenizer
from .optim import Adam, AdamConfig
from .params import Params


class ResumeError(ValueError):
    """A resumed run would not be the run its checkpoint holds: ``option`` (a
    :func:`~microgpt_xp.train` argument) is ``given`` here but was ``saved`` in the
    checkpoint."""

    def __init__(self, option: str, saved: Any, given: Any, checkpoint: str) -> None:
        self.option, self.saved, self.given = option, saved, given
        super().__init__(
            f"cannot resume {checkpoint!r} with {option}={given!r}: the checkpoint's run "
            f"has {option}={saved!r} (a resumed run must be the run it continues)"
        )


#: The lists of a run's history (``meta["history"]``).
HISTORY = ("losses", "val_losses", "val_token_losses")


def corpus_digest(docs: Sequence[str]) -> str:
    """A SHA-256 of the documents in order (what a checkpoint records of its corpus)."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


#: The optimizer's settings beyond ``lr`` that a resumed run must share with its checkpoint
#: (checked against the checkpoint's own :class:`~microgpt_xp.AdamConfig`, which an older
#: file holds with the spec's values for the fields it predates).
OPTIMIZER_FIELDS = (
    "beta1",
    "beta2",
    "eps",
    "warmup",
    "decay",
    "min_lr",
    "weight_decay",
    "grad_clip",
    "init_std",
)


def run_record(
    seed: int,
    batch_size: int,
    lr: float,
    dtype: str,
    reduction: str,
    docs: Sequence[str],
    val_docs: Sequence[str] | None,
    *,
    mode: str = "docs",
    optimizer: dict[str, Any] | None = None,
    eval_tokens: int | None = None,
) -> dict[str, Any]:
    """What a checkpoint records of the settings that fix a run's losses (JSON-able):
    ``mode`` (``"docs"``, or ``"text"`` where ``docs`` is ``[text]``), the ``optimizer``'s
    settings of :data:`OPTIMIZER_FIELDS` and the held-out
    bound ``eval_tokens`` (informative: not checked on resume)."""
    record = {
        "mode": mode,
        "seed": seed,
        "batch_size": batch_size,
        "lr": float(lr),
        "dtype": dtype,
        "reduction": reduction,
        "corpus": corpus_digest(docs),
        "val_corpus": None if val_docs is None else corpus_digest(val_docs),
        **{k: (optimizer or {}).get(k, getattr(AdamConfig(), k)) for k in OPTIMIZER_FIELDS},
        "eval_tokens": eval_tokens,
    }
    return record


def resume(
    checkpoint: str | Path,
    run: dict[str, Any],
    steps: int,
    config: GPTConfig,
    tokenizer: Tokenizer,
    backend: str,
    device: Any,
    params: Params | None,
) -> tuple[Params, Adam, dict[str, list[Any]]]:
    """The params, optimizer and history (``{"losses": [...], "val_losses": [[step, loss],
    ...], "val_token_losses": [[step, loss], ...]}``) of the run in ``checkpoint``, after
    checking that the arguments continue that run (:class:`ResumeError` otherwise)."""
    name = str(checkpoint)
    if params is not None:
        raise ArgumentValueError(
            "params", "params= cannot be given with resume=True on an existing checkpoint"
        )
    saved = load(checkpoint, backend=backend, device=device)
    meta = saved.meta if isinstance(saved.meta, dict) else {}
    if "microgpt_exact" in meta:
        raise ValueError(
            f"checkpoint {name!r} holds a microgpt-exact replay (one document a step from "
            "seed 42): batched training cannot continue it; start a new run"
        )
    saved_run = meta.get("run")
    if not isinstance(saved_run, dict):
        raise ValueError(f"checkpoint {name!r} holds no record of its run's settings to resume")
    if saved.config != config:
        raise ResumeError("config", saved.config, config, name)
    if saved.tokenizer is not None and saved.tokenizer != tokenizer:
        chars = "".join(saved.tokenizer.chars), "".join(tokenizer.chars)
        raise ResumeError("tokenizer", f"chars {chars[0]!r}", f"chars {chars[1]!r}", name)
    if saved.adam is None:
        raise ValueError(f"checkpoint {name!r} holds no optimizer state to resume")
    saved_dtype = _xp.dtype_name(saved.params.wte)
    if saved_dtype != run["dtype"]:
        raise ResumeError("dtype", saved_dtype, run["dtype"], name)
    saved_mode = saved_run.get("mode", "docs")
    if saved_mode != run["mode"]:
        raise ResumeError("mode", saved_mode, run["mode"], name)
    for option in ("seed", "batch_size", "lr", "reduction"):
        if option in saved_run and saved_run[option] != run[option]:
            raise ResumeError(option, saved_run[option], run[option], name)
    for option in OPTIMIZER_FIELDS:
        if getattr(saved.adam.config, option) != run[option]:
            raise ResumeError(option, getattr(saved.adam.config, option), run[option], name)
    names = ("text", "val_text") if run["mode"] == "text" else ("docs", "val_docs")
    for option, key in zip(names, ("corpus", "val_corpus"), strict=True):
        was, now = saved_run.get(key), run[key]
        if key in saved_run and was != now:  # corpora are shown by their digests
            raise ResumeError(option, _short(was), _short(now), name)
    adam, start = saved.adam, saved.step
    if steps != adam.num_steps:
        if start < adam.num_steps or steps < adam.num_steps:
            raise ResumeError("steps", adam.num_steps, steps, name)
        adam.extend(steps)  # a finished run, extended (see train's docstring)
    history = meta.get("history")
    history = history if isinstance(history, dict) else {}
    return saved.params, adam, {k: list(history.get(k, [])) for k in HISTORY}


def _short(digest: str | None) -> str:
    return "none" if digest is None else f"sha256:{digest[:12]}"

"""Resuming a run: the record of the settings that fix a run's losses, and the check that a
resumed run is the run its checkpoint holds."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from . import _xp
from ._errors import ArgumentValueError
from .checkpoint import load
from .config import GPTConfig
from .data import Tokenizer
from .optim import Adam, AdamConfig
from .params import Params

#: The lists of a run's history (``meta["history"]``).
HISTORY = ("losses", "val_losses", "val_token_losses")
#: The optimizer's settings beyond ``lr`` that a resumed run must share with its checkpoint
#: (an older file's :class:`~microgpt_xp.AdamConfig` has the spec's for those it predates).
OPTIMIZER_FIELDS = tuple(f.name for f in fields(AdamConfig) if f.name not in ("lr", "num_steps"))


class ResumeError(ValueError):
    """A resumed run would not be the run its checkpoint holds: ``option`` (a
    :func:`~microgpt_xp.train` argument) is ``given`` here but was ``saved``."""

    def __init__(self, option: str, saved: Any, given: Any, checkpoint: str) -> None:
        self.option, self.saved, self.given = option, saved, given
        super().__init__(
            f"cannot resume {checkpoint!r} with {option}={given!r}: the checkpoint's run "
            f"has {option}={saved!r} (a resumed run must be the run it continues)"
        )


def corpus_digest(docs: Sequence[str]) -> str:
    """A SHA-256 of the documents in order (what a checkpoint records of its corpus)."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8") + b"\n")
    return h.hexdigest()


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
    pack: bool = False,
) -> dict[str, Any]:
    """The JSON-able record of the settings that fix a run's losses: ``mode`` (``"docs"``, or
    ``"text"`` where ``docs`` is ``[text]``), the ``optimizer``'s :data:`OPTIMIZER_FIELDS`,
    the held-out bound ``eval_tokens`` (informative: not checked on resume) and ``pack``
    (recorded only when true: an unpacked run's record is as before)."""
    return {
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
        **({"pack": True} if pack else {}),
    }


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
    """The params, optimizer and history (:data:`HISTORY`'s lists, the held-out ones of
    ``[step, loss]`` pairs) of the run in ``checkpoint``, once the arguments are found to
    continue that run (:class:`ResumeError` otherwise)."""
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
    adam = saved.adam
    if adam is None:
        raise ValueError(f"checkpoint {name!r} holds no optimizer state to resume")
    # (option, saved, given) in the order checked; an older run's record may lack a setting
    corpora = ("text", "val_text") if run["mode"] == "text" else ("docs", "val_docs")
    checks: list[tuple[str, Any, Any]] = [
        ("dtype", _xp.dtype_name(saved.params.wte), run["dtype"]),
        ("mode", saved_run.get("mode", "docs"), run["mode"]),
        ("pack", saved_run.get("pack", False), run.get("pack", False)),
        *(
            (k, saved_run[k], run[k])
            for k in ("seed", "batch_size", "lr", "reduction")
            if k in saved_run
        ),
        *((k, getattr(adam.config, k), run[k]) for k in OPTIMIZER_FIELDS),
        *(
            (o, saved_run[k], run[k])
            for o, k in zip(corpora, ("corpus", "val_corpus"), strict=True)
            if k in saved_run
        ),
    ]
    for option, was, now in checks:
        if was != now:
            if option in corpora:  # a corpus is shown by its digest
                was, now = _short(was), _short(now)
            raise ResumeError(option, was, now, name)
    if steps != adam.num_steps:
        if saved.step < adam.num_steps or steps < adam.num_steps:
            raise ResumeError("steps", adam.num_steps, steps, name)
        adam.extend(steps)  # a finished run, extended (see train's docstring)
    history = meta.get("history")
    history = history if isinstance(history, dict) else {}
    return saved.params, adam, {k: list(history.get(k, [])) for k in HISTORY}


def _short(digest: str | None) -> str:
    return "none" if digest is None else f"sha256:{digest[:12]}"

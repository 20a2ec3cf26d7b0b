"""``microgpt-xp train``: batched training (:func:`microgpt_xp.train`), held-out loss,
progress, then sampling. ``train --microgpt-exact`` is the replay (:mod:`.replay`)."""

from __future__ import annotations

import argparse
import importlib
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..resources import default_threads
from . import _common as cli
from ._progress import Progress
from .sample import DEFAULT_LENGTH  # characters of a passage, as sample writes it

#: The optimizer's options, passed only where given (the library's defaults hold otherwise).
SCHEDULE = "warmup decay min_lr weight_decay grad_clip init_std"


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``train`` subcommand to ``sub``."""
    cli.add_command(
        sub,
        "train",
        "train on a data file, a stream of text or the embedded default corpus, then sample",
        "Train microgpt with batched Adam and print sampled names.\n\n"
        "--data FILE trains on documents, one a line; --text FILE on one stream of text\n"
        "(random windows of --block-size + 1 characters; the samples are passages). The\n"
        "shape (--n-layer, --n-embd, --n-head, --block-size) is stored in the checkpoint.\n"
        "An existing --checkpoint is continued with --resume or replaced with --overwrite.\n"
        "Ctrl-C (or SIGTERM, SIGHUP) saves the run at that step in --checkpoint and prints\n"
        "the command that continues it.",
        "backend device dtype steps batch_size lr data|text val_data|val_fraction eval_every "
        "eval_tokens warmup decay min_lr weight_decay grad_clip init_std beta1 beta2 seed "
        "checkpoint/save checkpoint_every resume|overwrite pack chunk_size workers threads jit "
        "scheduler verbose n_layer n_embd n_head block_size plot num_samples/train length "
        "temperature json microgpt_exact newlines",
    ).set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check what can fail before training, then train (on ``--scheduler`` if given)."""
    if args.microgpt_exact:
        from . import replay

        return replay.run(replay.parse_train_argv(args.argv[1:]))
    cli.check_needs(
        args, "newlines resume overwrite checkpoint_every eval_every eval_tokens length"
    )
    cli.check_common(args)
    cli.check_plot(args.plot)
    cli.check_files(args)
    exists = args.checkpoint is not None and Path(args.checkpoint).exists()
    if exists and not (args.resume or args.overwrite):
        raise FileExistsError(
            f"checkpoint {args.checkpoint!r} exists: continue its run with --resume or "
            "replace it with --overwrite"
        )
    with cli.dask_client(args):
        return _train(args, exists and args.resume)


def _corpora(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The corpus as ``train()``'s keywords (``docs``/``val_docs``, or ``text``/``val_text``/
    ``val_fraction``) and every text the tokenizer reads."""
    from ..data import split_docs

    if args.text is not None:
        text = cli.read_text(args.text)
        val = None if args.val_data is None else cli.read_text(args.val_data)
        corpus = {"text": text, "val_text": val, "val_fraction": args.val_fraction}
        return corpus, [text] if val is None else [text, val]
    docs, val_docs = cli.read_docs(args.data), None
    if args.val_data is not None:
        val_docs = cli.read_docs(args.val_data)
    elif args.val_fraction is not None:
        docs, val_docs = split_docs(docs, args.val_fraction, args.seed)
    return {"docs": docs, "val_docs": val_docs}, docs if val_docs is None else [*docs, *val_docs]


@dataclass
class _Speed:
    """ms/step and predicted tokens/s over this run's steps (their ``StepStats``)."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, stats: Any) -> dict[str, str]:
        """Count a step; the progress line's values (``ms/step 3.1``, ``tok/s 10.6k``)."""
        self.steps += 1
        self.tokens += int(stats.tokens)
        self.seconds += float(stats.seconds)
        ms, rate = self.rates()
        shown = {"ms/step": f"{ms:.2f}"}
        if rate is not None:
            shown["tok/s"] = f"{rate / 1000:.3g}k" if rate >= 1000 else f"{rate:.3g}"
        return shown

    def rates(self) -> tuple[float | None, float | None]:
        """ms/step and tokens/s (``None`` before a step, or in no time)."""
        ms = 1000 * self.seconds / self.steps if self.steps else None
        return ms, self.tokens / self.seconds if self.seconds > 0 else None


def _train(args: argparse.Namespace, resuming: bool) -> int:
    """Batched training, inside the scheduler."""
    sampling = importlib.import_module("microgpt_xp.sample")  # the modules, read at the call
    training = importlib.import_module("microgpt_xp.train")
    from ..cluster import ClusterError
    from ..config import GPTConfig
    from ..data import Tokenizer, default_block_size
    from ..optim import adam_config
    from ..runners import WorkerDied

    corpus, every_doc = _corpora(args)
    text_mode = args.text is not None
    tokenizer = Tokenizer.from_docs(every_doc)
    if resuming:  # the checkpoint's shape, from its header (train() loads the run)
        from ..checkpoint import peek

        config = _resumed_config(args, peek(args.checkpoint), tokenizer)
    else:
        longest = None if text_mode else default_block_size(every_doc)  # a stream: the spec's
        config = GPTConfig(
            tokenizer.vocab_size, **cli.shape_of(args, longest, tokenizer.vocab_size)
        )
    state: dict[str, Any] = {"bar": None, "step": None}
    speed = _Speed()

    def begin(step: int) -> Progress:
        """Print the notes and the header once train() has accepted its arguments (so
        that an error is the only line), then show the progress from ``step`` on."""
        size = config.block_size
        if not text_mode:
            what = f"the checkpoint's block size {size}" if resuming else f"--block-size {size}"
            cli.note_cut(every_doc, size, what)
        if args.resume and not resuming:
            cli.note(f"--resume: {args.checkpoint!r} did not exist; the run started at step 0")
        if not args.json:
            print(_header(args, corpus, config), flush=True)
        state["bar"] = Progress(args.steps, desc="train", unit="step", initial=step)
        return state["bar"]  # type: ignore[no-any-return]

    def progress(stats: Any) -> None:
        bar = state["bar"] or begin(stats.step - 1)
        state["step"] = stats.step
        bar.update(stats.step, loss=f"{stats.loss:.4f}", **speed.add(stats))

    betas = cli.keywords(args, "beta1 beta2", given=True)
    started, start = time.time_ns(), time.perf_counter()
    try:
        result = training.train(
            **corpus,
            config=config,
            on_step=progress,
            on_eval=lambda step, loss: state["bar"].update(step, val=f"{loss:.4f}"),
            tokenizer=tokenizer,
            threads=args.threads or default_threads(config, args.batch_size),
            optimizer=adam_config(None, **betas) if betas else None,
            **cli.keywords(args, f"{SCHEDULE} eval_tokens", given=True),
            **cli.keywords(args, "steps batch_size seed backend device dtype checkpoint lr jit"),
            **cli.keywords(args, "chunk_size workers eval_every checkpoint_every resume overwrite"),
            **cli.keywords(args, "pack"),
        )
    except training.ResumeError as exc:
        raise ValueError(resume_words(exc, args)) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP
        stop = KeyboardInterrupt(_stopped(args, "interrupted", state["step"], started, True))
        stop.signum = getattr(exc, "signum", None)  # type: ignore[attr-defined]
        raise stop from None
    except (WorkerDied, ClusterError) as exc:  # a lost worker or scheduler: how to go on
        raise training.TrainingError(_stopped(args, str(exc), state["step"], started)) from None
    finally:
        if state["bar"] is not None:
            state["bar"].close()
    seconds = time.perf_counter() - start
    if state["bar"] is None:  # no step to take: the run in the checkpoint was finished
        begin(result.step).close()
        cli.note(
            f"the run in {args.checkpoint!r} has taken all its {result.step} steps; a "
            "larger --steps extends it"
        )
    count = args.num_samples
    if count is None:
        count = 1 if text_mode else cli.DEFAULT_NUM_SAMPLES
    # a stream is drawn in this process (its window slides): passages of --length characters
    how = (
        {"length": args.length or DEFAULT_LENGTH}
        if text_mode
        else {"chunks": args.chunk_size, "workers": args.workers}
    )
    names = []
    if count:
        names = sampling.sample(
            result.params,
            result.tokenizer,
            count,
            **how,
            **cli.keywords(args, "temperature seed jit"),
        )
    if args.plot is not None and result.losses:
        title = f"microgpt-xp ({args.backend} {args.dtype}, batch {args.batch_size})"
        cli.plot_losses(args.plot, result.losses, result.start_step, title, result.val_losses)
    elif args.plot is not None:
        cli.note(f"no steps were run, so no loss curve was written to {args.plot!r}")
    ms, rate = speed.rates()
    val_docs = corpus.get("val_docs")
    summary = {
        "final_loss": result.losses[-1] if result.losses else None,
        "final_val_loss": result.val_losses[-1][1] if result.val_losses else None,
        "steps": result.step,
        "steps_run": len(result.losses),
        "start_step": result.start_step,
        "losses": result.losses,
        "val_losses": [list(pair) for pair in result.val_losses],
        "seconds": seconds,
        **cli.keywords(args, "backend dtype batch_size"),
        "num_docs": None if text_mode else len(corpus["docs"]),
        "num_val_docs": None if text_mode else 0 if val_docs is None else len(val_docs),
        "config": config.to_dict(),
        "checkpoint": args.checkpoint,
        "samples": names,
        "mode": "text" if text_mode else "docs",
        "num_chars": len(corpus["text"]) if text_mode else None,
        "final_val_token_loss": result.val_token_losses[-1][1] if result.val_token_losses else None,
        "val_token_losses": [list(pair) for pair in result.val_token_losses],
        "tokens": speed.tokens,
        "ms_per_step": ms,
        "tokens_per_s": rate,
    }
    if args.json:
        cli.print_json(summary)
    else:
        _print_run(args, summary, result.start_step)
    return 0


def _print_run(args: argparse.Namespace, run: dict[str, Any], resumed: int) -> None:
    """The text a run prints after its steps: the summary line, the files, the samples."""
    loss = "n/a" if run["final_loss"] is None else f"{run['final_loss']:.4f}"
    val, token = run["final_val_loss"], run["final_val_token_loss"]
    if run["mode"] == "text" and token is not None:
        loss += f" | held-out loss {token:.4f} per token"
    elif val is not None:
        loss += f" | held-out loss {val:.4f}" + (
            "" if token is None else f" ({token:.4f} per token)"
        )
    ms, rate = run["ms_per_step"], run["tokens_per_s"]
    speed = "" if rate is None else f", {rate:,.0f} tokens/s"
    speed = "" if ms is None else f" ({ms:.2f} ms/step{speed})"
    resumed_at = f" (resumed at step {resumed})" if resumed else ""
    print(
        f"done: {run['steps_run']} steps{resumed_at} in {run['seconds']:.1f} s{speed} | final loss {loss}"
    )
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {run['steps']})")
    if args.plot is not None and run["losses"]:
        print(f"loss curve: {args.plot}")
    cli.print_samples(run["samples"], passages=run["mode"] == "text")


def _header(args: argparse.Namespace, corpus: dict[str, Any], config: Any) -> str:
    """The first line of a run: corpus, vocabulary, weights, shape, backend, batch, steps."""
    shape = {name: getattr(config, name) for name in cli.SPEC_SHAPE}
    shape_text = ", ".join(f"{k} {v}" for k, v in shape.items())
    shape_text = "" if shape == cli.SPEC_SHAPE else f" ({shape_text})"
    val = corpus.get("val_docs", corpus.get("val_text"))
    held = "" if val is None else f" (+{len(val)} held out)"
    if "text" in corpus:
        what = f"{len(corpus['text'])} characters"
        if val is None and args.val_fraction is not None:
            held = f" (the last {args.val_fraction:g} held out)"
    else:
        what = f"{len(corpus['docs'])} docs"
    return (
        f"train: {what}{held} | vocab {config.vocab_size} | {config.num_params} "
        f"params{shape_text} | {args.backend} {args.dtype} | batch {args.batch_size} | "
        f"{args.steps} steps"
    )


def _resumed_config(args: argparse.Namespace, ck: Any, tokenizer: Any) -> Any:
    """The shape of the run that --resume continues; a shape option given, or the corpus's
    characters, must match it (the library checks the rest)."""
    from ..resume import ResumeError

    for key in cli.SPEC_SHAPE:
        given, saved = getattr(args, key), getattr(ck.config, key)
        if given is not None and given != saved:
            raise ValueError(resume_words(ResumeError(key, saved, given, args.checkpoint), args))
    if ck.tokenizer is not None and ck.tokenizer != tokenizer:
        raise ValueError(
            f"cannot resume {args.checkpoint!r} with {_source(args)}: its run trained on a "
            "corpus of other characters"
        )
    return ck.config


def _source(args: argparse.Namespace) -> str:
    """The corpus option given: ``--text FILE``, ``--data FILE`` or the embedded corpus."""
    if args.text is not None:
        return f"--text {args.text}"
    return f"--data {args.data or '(the embedded corpus)'}"


def resume_words(exc: Any, args: argparse.Namespace) -> str:
    """A ``ResumeError`` in the command line's words: the option, given and saved."""
    name, option = args.checkpoint, cli.OPTIONS.get(exc.option, exc.option)
    if exc.option == "mode":  # documents against a stream of text
        was = "a stream of text (--text)" if exc.saved == "text" else "documents (--data)"
        return f"cannot resume {name!r} with {_source(args)}: its run trained on {was}"
    if exc.option in ("docs", "val_docs", "text", "val_text"):  # the corpus, or its split
        given = _source(args)
        if args.val_fraction is not None:
            given += f" --val-fraction {args.val_fraction}"
        elif args.val_data is not None and exc.option.startswith("val_"):
            given = f"--val-data {args.val_data}"
        held = " held-out" if exc.option.startswith("val_") else ""
        split = "" if args.val_fraction is None else " or split"
        return (
            f"cannot resume {name!r} with {given}: its run trained on another{held} corpus"
            f"{split} ({exc.saved}, not {exc.given})"
        )
    text = f"cannot resume {name!r} with {option} {exc.given}: its run has {option} {exc.saved}"
    if exc.option == "steps":
        text += " (a finished run is extended by a larger --steps; an unfinished one keeps its own)"
    return text


def _stopped(
    args: argparse.Namespace, why: str, step: int | None, started_ns: int, saves: bool = False
) -> str:
    """What a stopped run prints: why and where it stopped, the last checkpoint, and the
    command that continues the run (or starts it again). ``saves``: the library saved the
    run at the stop (a ``KeyboardInterrupt``: its last step completed, if it took one)."""
    after = "" if step is None else f" after step {step}"
    if args.checkpoint is None:
        return f"{why}{after}; nothing was saved (with --checkpoint PATH a run can be resumed)"
    path = Path(args.checkpoint)
    fresh = path.exists() and path.stat().st_mtime_ns >= started_ns  # written by this run
    if not (fresh or (path.exists() and args.resume)):
        # no file yet, or the old file that --overwrite has not replaced yet
        every = (
            f" (it is saved every {args.checkpoint_every} steps)"
            if args.checkpoint_every
            else " (--checkpoint-every N saves it every N steps)"
        )
        again = shlex.join([cli.PROG, *args.argv])
        return f"{why}{after}; no checkpoint of this run was saved yet{every}; start again with: {again}"
    try:  # the file this run wrote: which step it holds
        from ..checkpoint import peek

        at: int | None = peek(args.checkpoint).step
    except Exception:  # the message must come out whatever the file holds
        at = None
    kept = ""
    if saves and fresh and at is not None:  # the state at the stop: its last completed step
        after, kept = f" after step {at}", "its state was saved: "
    saved = "" if at is None else f" (step {at})"
    return (
        f"{why}{after}; {kept}the last checkpoint is {args.checkpoint}{saved}; continue the run "
        f"with: {resume_command(args.argv)}"
    )


def resume_command(argv: Sequence[str]) -> str:
    """The command line ``argv`` with ``--resume`` instead of ``--overwrite`` (argparse
    also takes unambiguous prefixes, ``--over``)."""

    def is_flag(arg: str, flag: str) -> bool:
        return len(arg) > 3 and flag.startswith(arg)

    kept = [a for a in argv if not is_flag(a, "--overwrite")]
    if not any(is_flag(a, "--resume") for a in kept):
        kept.append("--resume")
    return shlex.join([cli.PROG, *kept])

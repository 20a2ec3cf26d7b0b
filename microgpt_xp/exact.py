"""microgpt-exact mode: the original script's run step for step on any array type (float64,
one document a step, ``random.Random(42)`` drawing in the original's order)."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _xp
from ._errors import ArgumentValueError
from .config import GPTConfig
from .data import Tokenizer
from .model import KVCache, decode_step, loss_and_grads
from .optim import Adam
from .params import Params, materialize, state_dict_shapes
from .primitives import softmax

#: The original's seed, step count, sample count and temperature.
SEED, NUM_STEPS, NUM_SAMPLES, TEMPERATURE = 42, 1000, 20, 0.5
INFERENCE_HEADER = "--- inference (new, hallucinated names) ---"


@dataclass
class ExactRun:
    """What :func:`run_exact` returns: printed ``lines``, step ``losses``, ``samples``, the
    trained state and the generator's state after the initialisation."""

    lines: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    params: Params | None = None
    adam: Adam | None = None
    tokenizer: Tokenizer | None = None
    sample_rng_state: Any = None


def original_state_dict(
    config: GPTConfig, rng: random.Random, std: float = 0.08
) -> dict[str, list[list[float]]]:
    """The original's initial weights as nested lists, ``rng.gauss(0, std)`` row by row."""
    return {
        key: [[rng.gauss(0, std) for _ in range(n_in)] for _ in range(n_out)]
        for key, (n_out, n_in) in state_dict_shapes(config).items()
    }


def export_state_dict(params: Params) -> dict[str, list[list[float]]]:
    """The weights in the original's state-dict layout as nested lists of Python floats."""
    return {k: v.tolist() for k, v in params.to_state_dict().items()}


def _print(text: str, end: str) -> None:
    sys.stdout.write(text + end)
    if end == "\r":
        sys.stdout.flush()


def sample_exact(
    params: Params,
    tokenizer: Tokenizer,
    rng: random.Random,
    num_samples: int = NUM_SAMPLES,
    temperature: float = TEMPERATURE,
) -> list[str]:
    """Sample as the original: each token by ``rng.choices(range(V), weights=softmax(logits
    * temperature**-1))`` with a fresh KV cache a name, until BOS or ``block_size`` tokens."""
    if not temperature > 0:
        raise ArgumentValueError("temperature", f"temperature must be > 0, got {temperature!r}")
    ids = range(params.config.vocab_size)
    names = []
    for _ in range(num_samples):
        cache, token, chars = KVCache(), tokenizer.bos, []
        for _pos in range(params.config.block_size):
            tok = _xp.asarray([token], params.backend, device=params.device, dtype="int64")
            logits, cache = decode_step(params, tok, cache)
            probs = _xp.to_numpy(softmax(logits[0, :] * temperature**-1)).tolist()
            token = rng.choices(ids, weights=probs)[0]
            if token == tokenizer.bos:
                break
            chars.append(token)
        names.append(tokenizer.decode(chars))
    return names


def run_exact(
    docs: Sequence[str],
    *,
    backend: str = "numpy",
    device: Any = None,
    num_steps: int = NUM_STEPS,
    max_steps: int | None = None,
    num_samples: int = NUM_SAMPLES,
    temperature: float = TEMPERATURE,
    n_layer: int = 1,
    n_embd: int = 16,
    n_head: int = 4,
    block_size: int = 16,
    print_fn: Callable[[str, str], None] | None = _print,
    newlines: bool = False,
) -> ExactRun:
    """Replay the original run on ``docs`` (``input.txt``'s lines), printing through
    ``print_fn(text, end)`` (step lines end in ``"\\r"``, ``"\\n"`` with ``newlines``);
    ``max_steps`` stops early, keeping the schedule."""
    if not docs:
        raise ArgumentValueError("docs", "microgpt-exact needs at least one document")
    run = ExactRun()

    def emit(text: str, end: str = "\n") -> None:
        run.lines.append(text)
        if print_fn is not None:
            print_fn(text, end)

    rng = random.Random(SEED)
    docs = list(docs)
    rng.shuffle(docs)
    emit(f"num docs: {len(docs)}")
    tokenizer = Tokenizer.from_docs(docs)
    emit(f"vocab size: {tokenizer.vocab_size}")
    config = GPTConfig(
        tokenizer.vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=block_size
    )
    params = Params.from_state_dict(
        original_state_dict(config, rng), config=config, backend=backend, device=device
    )
    emit(f"num params: {config.num_params}")
    run.sample_rng_state = rng.getstate()
    adam = Adam(params, num_steps=num_steps)
    for step in range(num_steps if max_steps is None else min(max_steps, num_steps)):
        row = tokenizer.encode_doc(docs[step % len(docs)])[: block_size + 1]
        tokens = _xp.asarray([row], backend, device=device, dtype="int64")
        lengths = _xp.asarray([len(row)], backend, device=device, dtype="int64")
        loss, grads = loss_and_grads(params, tokens, lengths)
        params = adam.step(params, grads)
        loss, params, adam.state = materialize(loss, params, adam.state)
        run.losses.append(float(_xp.to_numpy(loss)))
        emit(
            f"step {step + 1:4d} / {num_steps:4d} | loss {run.losses[-1]:.4f}",
            "\n" if newlines else "\r",
        )
    if print_fn is not None:
        print_fn("", "\n")  # ends the last step's line
    emit(INFERENCE_HEADER)
    run.samples = sample_exact(params, tokenizer, rng, num_samples, temperature)
    for i, name in enumerate(run.samples, start=1):
        emit(f"sample {i:2d}: {name}")
    run.params, run.adam, run.tokenizer = params, adam, tokenizer
    return run

"""microgpt-exact mode: replay the original script's run, step for step, on any array type.

Python's own ``random`` seeded with 42 shuffles the documents and draws the 4192 initial
weights in the original's order; training takes one document per step in the shuffled
order in float64 with the spec's Adam; sampling draws each token with the standard
library's ``choices`` from the same generator, so the printed losses and names are the
original's.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _xp
from .config import GPTConfig
from .data import Tokenizer
from .model import KVCache, decode_step, loss_and_grads
from .optim import Adam
from .params import Params, field_shapes, materialize, state_dict_keys
from .primitives import softmax

#: The original's seed, step count, sample count and temperature.
SEED = 42
NUM_STEPS = 1000
NUM_SAMPLES = 20
TEMPERATURE = 0.5
INFERENCE_HEADER = "--- inference (new, hallucinated names) ---"


@dataclass
class ExactRun:
    """What :func:`run_exact` returns: the printed ``lines`` (without line ends), the step
    ``losses``, the ``samples``, the trained ``params``, the ``tokenizer``, and the
    generator state at the start of sampling (``sample_rng_state``, for
    :func:`sample_exact` later)."""

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
    """The original's initial weights: ``rng.gauss(0, std)`` per entry, keys in the
    spec's order, each matrix row by row, as nested lists."""
    shapes = field_shapes(config)
    out = {}
    for key in state_dict_keys(config):
        shape = shapes[key.split(".")[-1]]
        n_out, n_in = shape[-2:]
        out[key] = [[rng.gauss(0, std) for _ in range(n_in)] for _ in range(n_out)]
    return out


def export_state_dict(params: Params) -> dict[str, list[list[float]]]:
    """The weights in the original's state-dict layout (``"wte"``, …,
    ``"layer0.mlp_fc2"``) as nested lists of Python floats (JSON-able)."""
    return {k: v.tolist() for k, v in params.to_state_dict().items()}


def _emit(
    print_fn: Callable[[str, str], None], lines: list[str], text: str, end: str = "\n"
) -> None:
    lines.append(text)
    print_fn(text, end)


def _default_print(text: str, end: str) -> None:
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
    """Sample as the original does: one name at a time with fresh KV caches, from BOS at
    position 0, ``probs = softmax(logits * temperature**-1)``, the next token drawn with
    ``rng.choices(range(V), weights=probs)`` (one ``random()`` per token, the final BOS
    included), stopping at BOS or after ``block_size`` tokens."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    cfg = params.config
    backend, dev = params.backend, params.device
    scale = temperature**-1
    ids = range(cfg.vocab_size)
    names = []
    for _ in range(num_samples):
        cache, token, chars = KVCache(), tokenizer.bos, []
        for _pos in range(cfg.block_size):
            tok = _xp.asarray(np.array([token], dtype=np.int64), backend, device=dev)
            logits, cache = decode_step(params, tok, cache)
            probs = _xp.to_numpy(softmax(logits[0, :] * scale)).tolist()
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
    print_fn: Callable[[str, str], None] | None = _default_print,
    newlines: bool = False,
) -> ExactRun:
    """Replay the original microgpt run on ``docs`` (the lines of ``input.txt``).

    Prints, through ``print_fn(text, end)``, the original's output: ``num docs``, ``vocab
    size``, ``num params``, one ``step    s / 1000 | loss x.xxxx`` line per step (ended by
    ``"\\r"`` as the original does, or ``"\\n"`` with ``newlines=True``), the inference
    header and ``sample  i: name`` lines. ``max_steps`` stops training early while keeping
    the ``num_steps`` learning-rate schedule. Everything runs in float64 on ``backend``.
    """
    if not docs:
        raise ValueError("microgpt-exact needs at least one document")
    print_fn = print_fn or (lambda text, end: None)
    run = ExactRun()
    rng = random.Random(SEED)
    docs = list(docs)
    rng.shuffle(docs)
    _emit(print_fn, run.lines, f"num docs: {len(docs)}")
    tokenizer = Tokenizer.from_docs(docs)
    _emit(print_fn, run.lines, f"vocab size: {tokenizer.vocab_size}")
    config = GPTConfig(
        tokenizer.vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=block_size
    )
    params = Params.from_state_dict(
        original_state_dict(config, rng),
        config=config,
        backend=backend,
        device=device,
        dtype="float64",
    )
    _emit(print_fn, run.lines, f"num params: {config.num_params}")
    run.sample_rng_state = rng.getstate()
    adam = Adam(params, num_steps=num_steps)
    steps = num_steps if max_steps is None else min(max_steps, num_steps)
    step_end = "\n" if newlines else "\r"
    for step in range(steps):
        row = tokenizer.encode_doc(docs[step % len(docs)])[: block_size + 1]
        tokens = _xp.asarray(np.array([row], dtype=np.int64), backend, device=device)
        lengths = _xp.asarray(np.array([len(row)], dtype=np.int64), backend, device=device)
        loss, grads = loss_and_grads(params, tokens, lengths)
        params = adam.step(params, grads)
        loss, params, adam.state = materialize(loss, params, adam.state)
        loss_value = float(_xp.to_numpy(loss))
        run.losses.append(loss_value)
        _emit(
            print_fn,
            run.lines,
            f"step {step + 1:4d} / {num_steps:4d} | loss {loss_value:.4f}",
            step_end,
        )
    print_fn("", "\n")
    _emit(print_fn, run.lines, INFERENCE_HEADER)
    run.samples = sample_exact(params, tokenizer, rng, num_samples, temperature)
    for i, name in enumerate(run.samples, start=1):
        _emit(print_fn, run.lines, f"sample {i:2d}: {name}")
    run.params, run.adam, run.tokenizer = params, adam, tokenizer
    return run

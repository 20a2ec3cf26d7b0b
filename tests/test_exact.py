"""microgpt-exact mode replays the original run: the same printed lines as the scalar
reference (tests/reference.py, which follows the original operation by operation)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import reference
from xp_testing import state_dict_arrays, xp_assert_close

from microgpt_xp import GPTConfig, Params
from microgpt_xp.data import default_docs, read_docs
from microgpt_xp.exact import (
    INFERENCE_HEADER,
    export_state_dict,
    original_state_dict,
    run_exact,
    sample_exact,
)


def _quiet(text: str, end: str) -> None:
    """Prints nothing."""


@pytest.fixture(scope="module")
def small_docs() -> list[str]:
    # a few hundred names of the embedded corpus: fast, and always available
    return default_docs()[::10]


@pytest.fixture(scope="module")
def run5(small_docs: list[str]) -> Any:
    """Five steps and two samples, the weights, generator state and tokenizer kept."""
    return run_exact(small_docs, max_steps=5, num_samples=2, print_fn=_quiet)


def test_initial_weights_are_the_references(small_docs: list[str]) -> None:
    config = GPTConfig(27)
    ours = original_state_dict(config, random.Random(7))
    theirs = reference.init_state_dict(27, rng=random.Random(7))
    assert list(ours) == list(theirs) == reference.state_dict_keys(1)
    assert ours == theirs


def test_first_steps_and_samples_print_the_references_lines(backend, small_docs) -> None:
    expected = reference.run_microgpt(
        small_docs, max_steps=4, num_samples=3, print_fn=lambda s: None
    )
    on = {"backend": backend.name, "device": backend.device}
    run = run_exact(small_docs, **on, max_steps=4, num_samples=3, print_fn=_quiet)
    assert run.lines == expected
    assert run.lines[0] == f"num docs: {len(small_docs)}"
    assert run.lines[-4] == INFERENCE_HEADER
    assert len(run.samples) == 3


def test_output_format(small_docs, capsys) -> None:
    with pytest.raises(ValueError, match="at least one document"):
        run_exact([], print_fn=_quiet)
    run_exact(small_docs, max_steps=2, num_samples=2)
    out = capsys.readouterr().out
    assert "step    1 / 1000 | loss " in out
    assert "\r" in out and out.count("\r") == 2  # step lines end in '\r' like the original
    assert f"\n{INFERENCE_HEADER}\nsample  1: " in out
    run_exact(small_docs, max_steps=2, num_samples=2, newlines=True)
    out = capsys.readouterr().out
    assert "\r" not in out
    assert "step    2 / 1000 | loss " in out.splitlines()[4]


def test_trained_weights_match_the_reference(small_docs, run5) -> None:
    """Beyond printed digits: the float64 weights after a few steps agree to ~1e-13."""
    docs = list(small_docs)
    rng = random.Random(42)
    rng.shuffle(docs)
    bos = len(sorted(set("".join(docs))))
    sd = reference.init_state_dict(bos + 1, rng=rng)
    m, v = reference.zeros_like(sd), reference.zeros_like(sd)
    chars = sorted(set("".join(docs)))
    for step in range(5):
        tokens = [bos] + [chars.index(c) for c in docs[step]] + [bos]
        _, grads = reference.loss_and_grads(sd, tokens)
        reference.adam_step(sd, grads, m, v, step)
    ours = state_dict_arrays(run5.params)
    assert list(ours) == list(sd)
    float64_on_numpy = np.zeros((), dtype=np.float64)  # what the exact mode computes in
    for key, a in ours.items():
        xp_assert_close(
            a, sd[key], rtol=1e-12, atol=1e-14, like=float64_on_numpy, what=key, elementwise=True
        )


def test_sample_exact_uses_one_draw_per_token(run5) -> None:
    run, rng = run5, random.Random()
    rng.setstate(run.sample_rng_state)
    again = sample_exact(run.params, run.tokenizer, rng, num_samples=2)
    assert again == run.samples
    # the draws consumed: one random() per token, the final BOS included
    check = random.Random()
    check.setstate(run.sample_rng_state)
    n_draws = sum(len(s) + 1 if len(s) < 16 else 16 for s in run.samples)
    for _ in range(n_draws):
        check.random()
    assert check.getstate() == rng.getstate()


def test_export_round_trips_through_the_original_layout(run5) -> None:
    exported = export_state_dict(run5.params)
    assert all(isinstance(row, list) and isinstance(row[0], float) for row in exported["wte"])
    assert list(exported) == reference.state_dict_keys(1)
    again = Params.from_state_dict(exported)
    for name, a in again.arrays().items():
        xp_assert_close(a, getattr(run5.params, name), rtol=0, what=name)


@pytest.mark.slow
def test_full_replay_on_names_equals_the_reference(backend, names_txt) -> None:
    """The whole original run (1000 steps + 20 samples) on makemore's names: on NumPy every
    printed line equals the scalar reference's (a few minutes in pure Python); every other
    namespace prints the same 1024 lines as NumPy."""
    docs = read_docs(names_txt)
    run = run_exact(docs, backend=backend.name, device=backend.device, print_fn=_quiet)
    if backend.name != "numpy":
        assert run.lines == run_exact(docs, print_fn=_quiet).lines
        return
    assert docs == reference.read_docs(str(names_txt))
    assert run.lines[:3] == ["num docs: 32033", "vocab size: 27", "num params: 4192"]
    assert len(run.lines) == 3 + 1000 + 1 + 20
    assert run.lines == reference.run_microgpt(docs, print_fn=lambda s: None)

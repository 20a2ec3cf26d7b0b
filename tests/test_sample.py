"""microgpt_xp.sample: seeded, batch- and chunk-independent generation by the spec's §10
protocol (against the pure-Python oracle), temperature, the draw ``choose`` (against the
standard library), argument errors, and streams of text (``length=N``) with the CLI."""

from __future__ import annotations

import bisect
import fractions
import itertools
import json
import math
import random
import sys
from typing import Any

import numpy as np
import pytest
import reference
from xp_testing import raises_about

from microgpt_xp import GPTConfig, Params, forward, init_params, save
from microgpt_xp.cli import main
from microgpt_xp.data import Tokenizer
from microgpt_xp.sample import (
    choose,
    decode_batch,
    iter_sample_tokens,
    iter_samples,
    sample,
    sample_tokens,
    stream_uniforms,
)

TOKENIZER = Tokenizer("abcde")
CONFIG = GPTConfig(TOKENIZER.vocab_size, n_layer=1, n_embd=8, n_head=2, block_size=8)
BOS = TOKENIZER.bos
# Few samples and one shape, so that backends that compile per shape (JAX) stay quick.
N = 4


def _params(backend: Any = None, dtype: str = "float64", seed: int = 0) -> Params:
    kw = {} if backend is None else dict(backend=backend.name, device=backend.device)
    return init_params(CONFIG, seed=seed, dtype=dtype, **kw)


def _cut(row: np.ndarray) -> list[int]:
    """The ids of a sampled row before its first BOS."""
    return list(itertools.takewhile(lambda i: i != BOS, row.tolist()))


# -- determinism ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_deterministic_and_independent_of_batch_size(backend: Any, dtype: str) -> None:
    params = _params(backend, dtype)
    names = sample(params, TOKENIZER, N, temperature=1.0, seed=3)
    assert len(names) == N
    on_dask = [{"chunks": 1}, {"chunks": 3}, {"batch_size": 2, "chunks": 1}]
    for kw in [{}, {"batch_size": 2}, *(on_dask if backend.name == "dask" else [])]:
        assert sample(params, TOKENIZER, N, temperature=1.0, seed=3, **kw) == names, kw
    # streamed batch by batch: the same names
    batches = list(iter_samples(params, TOKENIZER, N, temperature=1.0, seed=3, batch_size=3))
    assert [len(b) for b in batches] == [3, N - 3]
    assert [name for b in batches for name in b] == names
    # a stream on every backend
    params, kw = _params(backend), dict(length=3 * CONFIG.block_size, seed=2, prompt="a")
    if backend.name == "dask":  # a stream is drawn in this process, not as Dask tasks
        with pytest.raises(ValueError, match="in this process"):
            sample(params, TOKENIZER, 2, **kw)  # type: ignore[arg-type]
        return
    want = sample(_params(), TOKENIZER, 2, **kw)  # type: ignore[arg-type]
    assert sample(params, TOKENIZER, 2, **kw) == want  # type: ignore[arg-type]


def test_independent_of_batch_size_and_streamed_batch_by_batch() -> None:
    params = _params()
    ids = sample_tokens(params, BOS, 23, temperature=1.0, seed=5)
    names = sample(params, TOKENIZER, 23, temperature=1.0, seed=5)
    for bs in (1, 4, 5, 7, 23, 100):
        got = sample_tokens(params, BOS, 23, temperature=1.0, seed=5, batch_size=bs)
        np.testing.assert_array_equal(got, ids)
        batches = list(iter_samples(params, TOKENIZER, 23, batch_size=bs, temperature=1.0, seed=5))
        assert [len(b) for b in batches] == [min(bs, 23 - i) for i in range(0, 23, bs)]
        assert [name for b in batches for name in b] == names
    # the first samples of a longer run are the samples of a shorter one; seeds differ
    np.testing.assert_array_equal(sample_tokens(params, BOS, 5, temperature=1.0, seed=5), ids[:5])
    other = sample(params, TOKENIZER, 20, temperature=1.0, seed=2)
    assert sample(params, TOKENIZER, 20, temperature=1.0, seed=1) != other
    # a trillion samples: only the batches taken are made (no O(N) list or array)
    batches = iter_samples(params, TOKENIZER, 10**12, batch_size=4, temperature=1.0, seed=5)
    first, second = next(batches), next(batches)
    batches.close()
    assert first + second == sample(params, TOKENIZER, 8, temperature=1.0, seed=5)
    ids = iter_sample_tokens(params, BOS, 10**12, batch_size=3, temperature=1.0, seed=5)
    assert next(ids).shape == (3, CONFIG.block_size)


# -- the protocol -------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_matches_the_reference_sampler(backend: Any, temperature: float) -> None:
    """Each sample is the spec's §10 loop (the pure-Python oracle, fresh KV cache, stop at
    BOS) driven by the documented uniforms ``default_rng(seed).random((N, block_size))``."""
    params = _params(backend)
    seed = 11
    ids = sample_tokens(params, BOS, N, temperature=temperature, seed=seed)
    uniforms = np.random.default_rng(seed).random((N, CONFIG.block_size))
    sd = {k: v.tolist() for k, v in params.to_state_dict().items()}
    for i in range(N):
        rng = random.Random()  # whose random() returns row i's uniforms in order
        rng.random = iter(uniforms[i].tolist()).__next__  # type: ignore[method-assign]
        want = reference.sample_one(sd, rng, BOS, temperature=temperature, n_head=CONFIG.n_head)
        assert _cut(ids[i]) == want, i


def test_samples_are_valid_names_and_temperature_narrows_them() -> None:
    params = _params(seed=4)
    n = 60
    ids = sample_tokens(params, BOS, n, temperature=1.0, seed=0)
    assert ids.shape == (n, CONFIG.block_size) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < CONFIG.vocab_size
    for bos in (-1, CONFIG.vocab_size):
        with pytest.raises(ValueError, match="bos"):
            sample_tokens(params, bos, 2)
    names = sample(params, TOKENIZER, n, temperature=1.0, seed=0)
    for row, name in zip(ids, names, strict=True):
        prefix = _cut(row)
        assert np.all(row[len(prefix) :] == BOS)  # after the first BOS, only BOS
        assert name == "".join(TOKENIZER.chars[i] for i in prefix)
        assert set(name) <= set(TOKENIZER.chars) and len(name) <= CONFIG.block_size
    lengths = [len(name) for name in names]
    # both ways of stopping happen: a sampled BOS and the end of the block
    assert min(lengths) < CONFIG.block_size and max(lengths) == CONFIG.block_size
    # a tie at zero temperature is drawn among
    # every lm_head row equal: every id ties for the largest logit at every position,
    # so the uniforms choose among all of them (not always the first id)
    params = _params(seed=2)
    head = np.broadcast_to(params.lm_head[:1], params.lm_head.shape).copy()
    tied = Params(**{**params.arrays(), "lm_head": head}, config=CONFIG)
    names = sample(tied, TOKENIZER, 40, temperature=1e-320, seed=0)
    assert len(set(names)) > 10 and set("".join(names)) == set(TOKENIZER.chars)
    # lower temperature fewer distinct samples
    params = _params(seed=0)
    distinct = [
        len(set(sample(params, TOKENIZER, 40, temperature=t, seed=7))) for t in (1.0, 0.05, 1e-3)
    ]
    assert distinct[0] > distinct[1] > distinct[2] == 1 and distinct[0] >= 20
    # a temperature of any real number type
    p32 = _params(dtype="float32")
    for t in (np.float32(0.5), np.float64(0.5), 1, np.int64(1), fractions.Fraction(1, 2)):
        want = sample(p32, TOKENIZER, 6, temperature=float(t), seed=4)
        assert sample(p32, TOKENIZER, 6, temperature=t, seed=4) == want, t


def _greedy(params: Params) -> list[int]:
    """Argmax decoding with the oracle's whole-sequence logits, stopping at BOS."""
    sd = {k: v.tolist() for k, v in params.to_state_dict().items()}
    tokens = [BOS]
    for _ in range(CONFIG.block_size):
        logits = reference.gpt_logits(sd, tokens, n_head=CONFIG.n_head)[-1]
        nxt = max(range(len(logits)), key=logits.__getitem__)
        if nxt == BOS:
            break
        tokens.append(nxt)
    return tokens[1:]


@pytest.mark.parametrize(
    ("dtype", "temperature"),
    [("float32", 1e-40), ("float32", 1e-37), ("float32", 5e-324), ("float64", 1e-310),
     ("float64", 5e-324), ("float64", 1e-3)],
)  # fmt: skip
def test_a_low_temperature_is_argmax(dtype: str, temperature: float) -> None:
    # 1e-3; or 1/T (or logits/T) overflows the dtype: sampling must still be the T -> 0 limit
    params = _params(dtype=dtype, seed=2)
    greedy = "".join(TOKENIZER.chars[i] for i in _greedy(params))
    assert sample(params, TOKENIZER, 30, temperature=temperature, seed=0) == [greedy] * 30
    if np.float32(temperature) > 0:  # 5e-324 is 0 in float32
        as_float32 = np.float32(temperature)
        assert sample(params, TOKENIZER, 5, temperature=as_float32, seed=0) == [greedy] * 5


@pytest.mark.parametrize(("dtype", "temperature"), [("float32", 1e-40), ("float64", 1e-310)])
def test_a_temperature_whose_inverse_overflows_is_argmax_on_every_backend(
    backend: Any, dtype: str, temperature: float
) -> None:
    params = _params(backend, dtype=dtype, seed=2)
    greedy = "".join(TOKENIZER.chars[i] for i in _greedy(_params(dtype=dtype, seed=2)))
    assert sample(params, TOKENIZER, N, temperature=temperature, seed=0) == [greedy] * N


# -- choose --------------------------------------------------------------------------------
def _stdlib_draw(weights: list[float], u: float) -> int:
    """The spec's §10 draw: bisect-right of ``u * total`` in the running sums, hi = V - 1."""
    cum = list(itertools.accumulate(weights))
    return bisect.bisect(cum, u * cum[-1], 0, len(cum) - 1)


def test_choose_matches_random_choices(backend: Any) -> None:
    rng = np.random.default_rng(0)
    b, v = 64, 7
    probs = rng.random((b, v))
    probs[rng.random((b, v)) < 0.3] = 0.0  # zero weights are skipped
    probs[:, -1] += 1e-3  # keep every row's total positive
    seeds = list(range(100, 100 + b))
    u = np.array([random.Random(s).random() for s in seeds])
    want = [
        random.Random(s).choices(range(v), weights=probs[i].tolist())[0]
        for i, s in enumerate(seeds)
    ]
    assert want == [_stdlib_draw(probs[i].tolist(), u[i]) for i in range(b)]
    got = backend.to_numpy(choose(backend.asarray(probs), backend.asarray(u)))
    assert got.shape == (b,) and got.tolist() == want
    # choose edges
    probs = np.array(
        [
            [0.0, 0.0, 1.0, 0.0],  # one-hot: always index 2
            [0.0, 0.0, 1.0, 0.0],
            [0.0, 0.5, 0.5, 0.0],  # u = 0 skips the leading zero
            [3.0, 1.0, 0.0, 4.0],  # unnormalised; u near 1 gives the last non-zero index
            [0.25, 0.25, 0.25, 0.25],  # u exactly on a boundary: bisect-right goes past it
        ]
    )
    u = np.array([0.0, math.nextafter(1.0, 0.0), 0.0, math.nextafter(1.0, 0.0), 0.5])
    want = [_stdlib_draw(p.tolist(), x) for p, x in zip(probs, u, strict=True)]
    assert want == [2, 2, 1, 3, 2] and choose(probs, u).tolist() == want


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [sample, iter_samples])
@pytest.mark.parametrize(
    ("kwargs", "match", "param"),
    [*[({"num_samples": v}, None, "num_samples") for v in (0, -1, 2.0, True)],
     *[({"temperature": v}, None, "temperature")
       for v in (0, 0.0, -0.5, math.nan, math.inf, "1", True, np.bool_(True), 1j, None)],
     *[({"length": v}, None, "length") for v in (0, -1, 2.0, True, "3")],
     ({"batch_size": 0}, None, "batch_size"),
     ({"prompt": "a" * CONFIG.block_size}, "leaves no position", "prompt"),
     ({"tokenizer": Tokenizer("abcdef")}, "tokenizer has 7 ids but the model 6", None),
     ({"length": 5, "workers": 2}, "in this process", "length")],  # a stream is drawn here
)  # fmt: skip
def test_bad_arguments_are_refused_at_the_call(
    fn: Any, kwargs: dict[str, Any], match: str | None, param: str | None
) -> None:
    with raises_about(ValueError, param, match=match):
        fn(_params(), **{"tokenizer": TOKENIZER, "num_samples": 2, **kwargs})


# -- streams of text (length=N) ---------------------------------------------------------------
def _reference_stream(
    params: Params, seed: int, length: int, temperature: float, prompt: list[int]
) -> list[int]:
    """The stream by the naive rule: at every draw, ``forward`` of the whole window (BOS and
    the prompt first; after a slide the last ``block_size // 2`` ids, no BOS; after a drawn
    BOS, BOS alone), one uniform a model step of the incremental decode."""
    block, window = CONFIG.block_size, CONFIG.block_size // 2
    u = itertools.chain.from_iterable(c[0] for c in stream_uniforms(seed, 0, block))
    for _ in prompt:  # the prompt's steps take theirs, as document mode
        next(u)
    ctx, out = [BOS, *prompt], []
    while len(out) < length:
        logits = forward(params, np.array([ctx]))[0, -1] / temperature
        draw = int(choose(np.exp(logits - logits.max())[None, :], np.array([next(u)]))[0])
        if draw == BOS:
            ctx = [BOS]
            continue
        out.append(draw)
        ctx.append(draw)
        if len(ctx) > block:  # the cache is full: the window slides, its re-read takes uniforms
            ctx = ctx[-window:]
            for _ in range(window - 1):
                next(u)
    return out


@pytest.mark.parametrize(("prompt", "other"), [("", ""), ("ab", "cd")])
def test_a_stream_is_the_naive_window_rule_and_begins_with_a_document(
    prompt: str, other: str
) -> None:
    params = _params(seed=1)
    length = 5 * CONFIG.block_size  # several slides, and drawn BOS (random weights) restart
    got = sample(params, TOKENIZER, 1, length=length, seed=7, temperature=0.9, prompt=prompt)
    want = _reference_stream(params, 7, length, 0.9, TOKENIZER.encode(prompt))
    assert got == [prompt + TOKENIZER.decode(want)] and len(got[0]) == len(prompt) + length
    # a stream begins with the document of the same uniforms
    prompt = other
    params = _params(seed=3)
    names = sample(params, TOKENIZER, 12, temperature=1.0, seed=4, prompt=prompt)
    streams = sample(params, TOKENIZER, 12, temperature=1.0, seed=4, prompt=prompt, length=30)
    assert [s[: len(n)] for s, n in zip(streams, names, strict=True)] == names
    assert any(len(n) == CONFIG.block_size for n in names)  # whole windows among them
    # the same through the one loop's entry points, for one row's uniforms
    u = next(stream_uniforms(4, 5, CONFIG.block_size))
    doc = decode_batch(params, BOS, u, 1.0, prompt=TOKENIZER.encode(prompt))[0]
    assert TOKENIZER.decode(_cut(doc)) == names[5]


def test_streams_are_reproducible_by_seed_and_prefixes_of_longer_ones() -> None:
    params = _params(seed=2)
    one = sample(params, TOKENIZER, 3, length=50, seed=5, temperature=0.8, top_k=3)
    assert sample(params, TOKENIZER, 3, length=50, seed=5, temperature=0.8, top_k=3) == one
    longer = sample(params, TOKENIZER, 4, length=90, seed=5, temperature=0.8, top_k=3)
    assert [s[:50] for s in longer[:3]] == one
    assert sample(params, TOKENIZER, 3, length=50, seed=6, temperature=0.8, top_k=3) != one
    assert all(len(s) == 50 and set(s) <= set(TOKENIZER.chars) for s in one)
    ids = sample_tokens(params, BOS, 3, length=50, seed=5, temperature=0.8, top_k=3)
    assert ids.shape == (3, 50) and [TOKENIZER.decode(r) for r in ids] == one
    got = sample(params, TOKENIZER, 2, length=40, temperature=1e-3, seed=0)
    assert got[0] == got[1]  # greedy through slides: no uniform matters
    # iter samples streams pieces as they are drawn
    params = _params()
    pieces = iter_samples(params, TOKENIZER, 2, length=20, seed=1, prompt="e")
    assert next(pieces) == "e"  # the prompt first, before anything is drawn
    rest = list(pieces)
    assert all(len(p) == 1 for p in rest) and len(rest) == 2 * 20 + 1
    want = "".join(sample(params, TOKENIZER, 2, length=20, seed=1, prompt="e"))
    assert "e" + "".join(rest) == want


# -- the command line ---------------------------------------------------------------------------
@pytest.fixture()
def checkpoints(tmp_path: Any) -> dict[str, Any]:
    params = _params(seed=1, dtype="float32")
    text = save(tmp_path / "text.ckpt", params, tokenizer=TOKENIZER, meta={"run": {"mode": "text"}})
    return {"text": text, "params": params}


def test_cli_length_streams_a_passage(capsys: Any, monkeypatch: Any, checkpoints: Any) -> None:
    writes: list[str] = []
    real = sys.stdout.write
    monkeypatch.setattr(sys.stdout, "write", lambda s: writes.append(s) or real(s))
    argv = ["sample", "--checkpoint", str(checkpoints["text"]), "--seed", "3"]
    assert main([*argv, "--length", "40", "--prompt", "ab"]) == 0
    out = capsys.readouterr().out
    want = sample(checkpoints["params"], TOKENIZER, 1, length=40, seed=3, prompt="ab")[0]
    assert out == want + "\n" and len(writes) > 40  # written piece by piece
    assert main(argv) == 0  # a text checkpoint writes a passage without --length
    out = capsys.readouterr().out
    assert out == sample(checkpoints["params"], TOKENIZER, 1, length=500, seed=3)[0] + "\n"
    assert main([*argv, "--length", "9", "--num-samples", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["samples"] == sample(checkpoints["params"], TOKENIZER, 2, length=9, seed=3)


def test_cli_length_out_and_usage_errors(capsys: Any, tmp_path: Any, checkpoints: Any) -> None:
    out = tmp_path / "passages.txt"
    argv = ["sample", "--checkpoint", str(checkpoints["text"]), "--length", "12", "--seed", "1"]
    assert main([*argv, "--num-samples", "3", "--out", str(out)]) == 0
    want = sample(checkpoints["params"], TOKENIZER, 3, length=12, seed=1)
    assert out.read_text(encoding="utf-8") == "\n\n".join(want) + "\n"
    assert capsys.readouterr().out == f"wrote 3 passages of 12 characters to {out}\n"
    assert main([*argv, "--workers", "2"]) == 2
    assert "--workers" in capsys.readouterr().err

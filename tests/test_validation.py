"""Bad inputs fail with a clear ``ValueError`` / ``TypeError`` that names the problem; every
call goes through :func:`realize` (lazy Dask checks fire when computed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from microgpt_xp import (
    GPTConfig,
    KVCache,
    Params,
    decode_step,
    forward,
    init_params,
    loss_and_grads,
    score,
)
from microgpt_xp.params import FIELDS

CONFIG = GPTConfig(vocab_size=7, n_layer=1, n_embd=8, n_head=2, block_size=5)


def realize(backend: Any, out: Any) -> Any:
    """Compute whatever a model call returned (a no-op on eager backends)."""
    if isinstance(out, tuple):
        return tuple(realize(backend, o) for o in out)
    if isinstance(out, Params):
        return {k: backend.to_numpy(a) for k, a in out.arrays().items()}
    if isinstance(out, KVCache):
        return out
    return backend.to_numpy(out)


def params_on(backend: Any, config: GPTConfig = CONFIG) -> Params:
    return init_params(config, seed=0, backend=backend.name, device=backend.device, dtype="float64")


def ints(backend: Any, host: Any) -> Any:
    return backend.asarray(np.asarray(host), dtype="int64")


GOOD_TOKENS = [[1, 2, 3, 0], [4, 5, 6, 6]]
GOOD_LENGTHS = [4, 2]
CALLS: dict[str, Any] = {"forward": forward, "loss_and_grads": loss_and_grads, "score": score}
DOCS = ("loss_and_grads", "score")  # the calls whose rows are documents (targets included)


def test_good_inputs_pass_bad_reductions_and_decode_steps_fail(backend: Any) -> None:
    """The baseline the other tests perturb is accepted; an unknown reduction is not."""
    params = params_on(backend)
    tokens, lengths = ints(backend, GOOD_TOKENS), ints(backend, GOOD_LENGTHS)
    assert realize(backend, forward(params, tokens, lengths)).shape == (2, 4, 7)
    realize(backend, loss_and_grads(params, tokens, lengths))
    realize(backend, score(params, tokens, lengths))
    for call in DOCS:  # documents of block_size + 1 tokens fit
        fits = np.zeros((2, CONFIG.block_size + 1), dtype=np.int64)
        realize(backend, CALLS[call](params, ints(backend, fits), ints(backend, [6, 2])))
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'token_mean'"):
        loss_and_grads(params, tokens, lengths, reduction="sum")  # type: ignore[arg-type]
    # decode step errors
    cache = KVCache()
    ids = ints(backend, [1, 2])
    for _ in range(CONFIG.block_size):
        _, cache = decode_step(params, ids, cache)
    assert cache.pos == CONFIG.block_size
    with pytest.raises(ValueError, match=r"cache is full: position 5 is past block_size 5"):
        decode_step(params, ids, cache)
    with pytest.raises(ValueError, match="token_ids must be 1-d"):
        decode_step(params, ints(backend, [[1, 2]]), KVCache())
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        decode_step(params, ints(backend, [1, 2]), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tokens must have an integer dtype"):
        decode_step(params, backend.asarray([1.0, 2.0], "float64"), KVCache())
    with pytest.raises(ValueError, match=r"token id.*\[0, 7\)"):
        realize(backend, decode_step(params, ints(backend, [1, 7]), KVCache())[0])


def _bad_id(bad: int) -> np.ndarray:
    tokens = np.array(GOOD_TOKENS)
    tokens[1, 1] = bad  # a real position (row 1 has length 2)
    return tokens


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.int64)


# (calls, tokens, lengths, error, match): host tokens and lengths (None: none), or a function
# of the backend for tokens that are not int64
BAD_BATCHES = [
    *[(tuple(CALLS), _bad_id(bad), GOOD_LENGTHS, ValueError,
       r"token id.*outside \[0, 7\)|token ids.*\[0, 7\)") for bad in (7, -1, 100)],
    *[((call,),
       lambda b, d=dtype: b.asarray(np.array(GOOD_TOKENS) > 2 if d == "bool" else GOOD_TOKENS, d),
       lens, TypeError, "tokens must have an integer dtype")
      for dtype in ("float64", "float32", "bool")
      for call, lens in (("forward", None), ("loss_and_grads", GOOD_LENGTHS))],
    *[(("forward",), np.ones(shape, dtype=np.int64), None, ValueError, "tokens must be 2-d")
      for shape in ((4,), (2, 2, 2))],
    (("forward",), _zeros(2, 6), None, ValueError, r"sequence length 6 exceeds the model's limit 5"),
    (DOCS, _zeros(2, 7), [7, 2], ValueError, r"sequence length 7 exceeds the model's limit 6"),
    (("forward",), _zeros(2, 0), None, ValueError, r"at least 1 token"),
    (("loss_and_grads",), _zeros(2, 1), [1, 1], ValueError, r"at least 2 token"),
    *[(("forward",), GOOD_TOKENS, bad, ValueError, r"lengths.*\[1, 4\]")
      for bad in ([0, 2], [5, 2], [4, -1])],
    *[(DOCS, GOOD_TOKENS, bad, ValueError, r"lengths.*\[2, 4\]")
      for bad in ([1, 2], [0, 2], [5, 2])],
    *[(("forward", "loss_and_grads"), GOOD_TOKENS, np.full(shape, 2), ValueError,
       r"lengths must have shape \(2,\)") for shape in ((3,), (1,), (2, 1))],
    (("forward",), GOOD_TOKENS, lambda b: b.asarray(GOOD_LENGTHS, dtype="float64"), TypeError,
     "lengths must have an integer dtype"),
]  # fmt: skip


@pytest.mark.parametrize(("calls", "tokens", "lengths", "error", "match"), BAD_BATCHES)
def test_bad_batches(
    backend: Any, calls: tuple[str, ...], tokens: Any, lengths: Any, error: type, match: str
) -> None:
    params = params_on(backend)
    for call in calls:
        tok = tokens(backend) if callable(tokens) else ints(backend, tokens)
        lens = lengths if lengths is None or callable(lengths) else ints(backend, lengths)
        lens = lengths(backend) if callable(lengths) else lens
        with pytest.raises(error, match=match):
            args = (params, tok) if lens is None else (params, tok, lens)
            realize(backend, CALLS[call](*args))


# -- namespaces and devices ----------------------------------------------------------------------
def test_tokens_of_another_namespace(backend: Any) -> None:
    """NumPy tokens with the backend's params (array-api-strict ones on the NumPy backend)."""
    params = params_on(backend)
    if backend.name == "numpy":
        strict = pytest.importorskip("array_api_strict")
        foreign = strict.asarray(np.array(GOOD_TOKENS))
    else:
        foreign = np.array(GOOD_TOKENS)
    with pytest.raises(TypeError, match="tokens and params are arrays of different namespaces"):
        forward(params, foreign)
    with pytest.raises(TypeError, match="lengths and params are arrays of different namespaces"):
        forward(params, ints(backend, GOOD_TOKENS), foreign[:, 0])


def test_numpy_tokens_with_torch_params() -> None:
    pytest.importorskip("torch")
    params = init_params(CONFIG, backend="torch")
    with pytest.raises(TypeError, match=r"tokens and params .*different namespaces"):
        forward(params, np.array(GOOD_TOKENS))
    with pytest.raises(TypeError, match=r"token_ids and params|tokens and params"):
        decode_step(params, np.array([1, 2]), KVCache())


def test_array_api_strict_tokens_and_params_on_other_devices() -> None:
    strict = pytest.importorskip("array_api_strict")
    params = init_params(CONFIG, backend="array_api_strict", device="device1")
    cpu = strict.Device("CPU_DEVICE")
    tokens = strict.asarray(np.array(GOOD_TOKENS), device=cpu)
    with pytest.raises(ValueError, match=r"tokens is on device .*CPU_DEVICE.* params are on"):
        forward(params, tokens)
    on_params_device = strict.asarray(np.array(GOOD_TOKENS), device=params.device)
    lengths = strict.asarray(np.array(GOOD_LENGTHS), device=cpu)
    with pytest.raises(ValueError, match=r"lengths is on device .*CPU_DEVICE"):
        loss_and_grads(params, on_params_device, lengths)
    # Params of mixed namespaces or devices
    arrays = init_params(CONFIG).arrays()
    with pytest.raises(TypeError, match="Params fields must be arrays of one namespace"):
        Params(CONFIG, **{**arrays, "lm_head": strict.asarray(arrays["lm_head"])})
    other = init_params(CONFIG, backend="array_api_strict")
    with pytest.raises(ValueError, match="Params fields must share one device"):
        Params(CONFIG, **{**params.arrays(), "wpe": other.wpe})


# -- state dicts -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "match"),
    [({"layer0.mlp_fc2": None}, r"missing keys \['layer0.mlp_fc2'\]"),
     ({"layer0.attn_bias": (8,)}, r"extra keys \['layer0.attn_bias'\]"),
     ({"ln_f": (8,)}, r"extra keys \['ln_f'\]"), ({"wte": (7, 9)}, r"'wte' has shape \(7,"),
     ({"wpe": (4, 8)}, r"'wpe' has shape \(4,"), ({"lm_head": (7,)}, r"'lm_head' has shape \(7,"),
     ({"layer0.mlp_fc1": (8, 32)}, r"'layer0.mlp_fc1' has shape \(8,")],
)  # fmt: skip
def test_state_dict_keys_and_shapes(changes: dict[str, Any], match: str) -> None:
    """A missing key (None), an extra key or a wrong shape (a shape) is named."""
    sd = _sd()
    for key, shape in changes.items():
        if shape is None:
            del sd[key]
        else:
            sd[key] = np.zeros(shape)
    with pytest.raises(ValueError, match=match):
        Params.from_state_dict(sd, config=CONFIG)


# -- GPTConfig and Params ----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["vocab_size", "n_layer", "n_embd", "n_head", "block_size"])
@pytest.mark.parametrize("value", [0, -3, 16.0, "16", True, None])
def test_config_fields_are_positive_ints(field: str, value: Any) -> None:
    error, match = (
        (ValueError, rf"GPTConfig.{field} must be positive, got {value}")
        if type(value) is int
        else (TypeError, rf"GPTConfig.{field} must be an int")
    )
    with pytest.raises(error, match=match):
        GPTConfig(**{"vocab_size": 27, field: value})


def _sd(config: GPTConfig = CONFIG) -> dict[str, Any]:
    return init_params(config, dtype="float64").to_state_dict()


#: (call, error, match) of calls outside the batch checks
CALL_ERRORS = [
    (lambda: forward(init_params(CONFIG), GOOD_TOKENS), TypeError, "tokens must be an array"),
    (lambda: Params.from_state_dict(_sd(GPTConfig(7, n_layer=2, n_embd=8, n_head=2, block_size=5)),
                                    config=CONFIG), ValueError, r"extra keys \['layer1.attn_wq'"),
    (lambda: Params.from_state_dict([("wte", np.zeros((7, 8)))]), TypeError,
     "state_dict must be a mapping"),
    (lambda: GPTConfig(vocab_size=27, n_head=3), ValueError,
     r"n_embd \(16\) must be divisible by n_head \(3\)"),
    (lambda: GPTConfig.from_dict({"vocab_size": 27, "dropout": 0.1}), ValueError,
     r"unknown GPTConfig keys: \['dropout'\]"),
    (lambda: init_params({"vocab_size": 27}), TypeError, "config must be a GPTConfig"),
    *[(lambda kw=kw: init_params(CONFIG, **kw), ValueError, m) for kw, m in (
        ({"backend": "tensorflow"}, "unknown backend 'tensorflow'"),
        ({"dtype": "float16"}, "unsupported dtype 'float16'"))],
    *[(lambda kw=kw: init_params(CONFIG).to(**kw), ValueError, m) for kw, m in (
        ({"backend": "tensorflow"}, "unknown backend 'tensorflow'"),
        ({"dtype": "float16"}, "unsupported dtype 'float16'"))],
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "match"), CALL_ERRORS)
def test_call_errors(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_params_checks(backend: Any) -> None:
    """A wrong shape in any one field (not only the first), another config, mixed dtypes and
    integer or float16 weights are refused."""
    p = params_on(backend)
    for name in FIELDS:
        a = getattr(p, name)
        smaller = a[..., :-1] if a.shape[-1] > 1 else a[:0]
        with pytest.raises(ValueError, match=rf"Params.{name} has shape"):
            Params(CONFIG, **{**p.arrays(), name: smaller})
    arrays = p.arrays()
    narrower = GPTConfig(vocab_size=7, n_layer=1, n_embd=4, n_head=2, block_size=5)
    with pytest.raises(ValueError, match=r"Params.wte has shape \(7, 8\), but the config needs"):
        Params(narrower, **arrays)
    deeper = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)
    with pytest.raises(ValueError, match=r"Params.attn_wq has shape \(1, 8, 8\)"):
        Params(deeper, **arrays)
    with pytest.raises(TypeError, match=r"Params\.config must be a GPTConfig"):
        Params(CONFIG.to_dict(), **arrays)  # type: ignore[arg-type]
    p32 = init_params(CONFIG, backend=backend.name, device=backend.device, dtype="float32")
    with pytest.raises(TypeError, match="Params fields must share one dtype"):
        Params(CONFIG, **{**p.arrays(), "wte": p32.wte})
    as_int = {k: backend.asarray(np.zeros(a.shape), dtype="int64") for k, a in p.arrays().items()}
    with pytest.raises(TypeError, match=r"Params must be float32 or float64, got .*int64"):
        Params(CONFIG, **as_int)
    # float16 weights could not be checkpointed: they are refused where they are made
    if not hasattr(backend.xp, "float16"):
        return  # array-api-strict has no float16
    as_half = {
        k: backend.asarray(np.zeros(a.shape), dtype="float16") for k, a in p.arrays().items()
    }
    with pytest.raises(TypeError, match=r"Params must be float32 or float64, got .*float16"):
        Params(CONFIG, **as_half)

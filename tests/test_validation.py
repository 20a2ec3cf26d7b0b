"""Bad inputs fail with an ``ArgumentValueError``/``ArgumentTypeError`` whose ``param`` names the
argument; every call goes through :func:`realize` (lazy Dask checks fire when computed)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from xp_testing import raises_about

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
from microgpt_xp._errors import ArgumentTypeError, ArgumentValueError
from microgpt_xp.params import FIELDS

CONFIG = GPTConfig(vocab_size=7, n_layer=1, n_embd=8, n_head=2, block_size=5)
GOOD_TOKENS = [[1, 2, 3, 0], [4, 5, 6, 6]]
GOOD_LENGTHS = [4, 2]
CALLS: dict[str, Any] = {"forward": forward, "loss_and_grads": loss_and_grads, "score": score}
DOCS = ("loss_and_grads", "score")  # the calls whose rows are documents (targets included)
V, T = ValueError, TypeError
IDS, FROM1, FROM2 = r"\[0, 7\)", r"\[1, 4\]", r"\[2, 4\]"


def realize(backend: Any, out: Any) -> Any:
    """Compute whatever a model call returned (a no-op on eager backends)."""
    if isinstance(out, tuple):
        return tuple(realize(backend, o) for o in out)
    if isinstance(out, Params):
        return {k: backend.to_numpy(a) for k, a in out.arrays().items()}
    return out if isinstance(out, KVCache) else backend.to_numpy(out)


def params_on(backend: Any, dtype: str = "float64") -> Params:
    return init_params(CONFIG, seed=0, backend=backend.name, device=backend.device, dtype=dtype)


def ints(backend: Any, host: Any) -> Any:
    return backend.asarray(np.asarray(host), dtype="int64")


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
    with raises_about(ValueError, "reduction"):
        loss_and_grads(params, tokens, lengths, reduction="sum")  # type: ignore[arg-type]
    cache, ids = KVCache(), ints(backend, [1, 2])
    for _ in range(CONFIG.block_size):
        _, cache = decode_step(params, ids, cache)
    assert cache.pos == CONFIG.block_size
    with raises_about(ValueError, "cache", "full"):
        decode_step(params, ids, cache)
    with raises_about(ValueError, "token_ids", "1-d"):
        decode_step(params, ints(backend, [[1, 2]]), KVCache())
    with raises_about(TypeError, "cache"):
        decode_step(params, ids, None)  # type: ignore[arg-type]
    with raises_about(TypeError, "tokens", "integer dtype"):
        decode_step(params, backend.asarray([1.0, 2.0], "float64"), KVCache())
    with raises_about(ValueError, "tokens", IDS):
        realize(backend, decode_step(params, ints(backend, [1, 7]), KVCache())[0])


def _bad_id(bad: int) -> np.ndarray:
    tokens = np.array(GOOD_TOKENS)
    tokens[1, 1] = bad  # a real position (row 1 has length 2)
    return tokens


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.int64)


BAD_BATCHES = [
    *[(tuple(CALLS), _bad_id(bad), GOOD_LENGTHS, V, "tokens", IDS) for bad in (7, -1, 100)],
    *[((call,),
       lambda b, d=dtype: b.asarray(np.array(GOOD_TOKENS) > 2 if d == "bool" else GOOD_TOKENS, d),
       lens, T, "tokens", "integer dtype")
      for dtype in ("float64", "float32", "bool")
      for call, lens in (("forward", None), ("loss_and_grads", GOOD_LENGTHS))],
    *[(("forward",), np.ones(shape, np.int64), None, V, "tokens", "2-d") for shape in ((4,), (2, 2, 2))],
    (("forward",), _zeros(2, 6), None, V, "tokens", "length 6 exceeds the model's limit 5"),
    (DOCS, _zeros(2, 7), [7, 2], V, "tokens", "length 7 exceeds the model's limit 6"),
    (("forward",), _zeros(2, 0), None, V, "tokens", "at least 1 token"),
    (("loss_and_grads",), _zeros(2, 1), [1, 1], V, "tokens", "at least 2 token"),
    *[(("forward",), GOOD_TOKENS, bad, V, "lengths", FROM1) for bad in ([0, 2], [5, 2], [4, -1])],
    *[(DOCS, GOOD_TOKENS, bad, V, "lengths", FROM2) for bad in ([1, 2], [0, 2], [5, 2])],
    *[(("forward", "loss_and_grads"), GOOD_TOKENS, np.full(shape, 2), V, "lengths", r"shape \(2,\)")
      for shape in ((3,), (1,), (2, 1))],
    (("forward",), GOOD_TOKENS, lambda b: b.asarray(GOOD_LENGTHS, dtype="float64"), T, "lengths",
     "integer dtype"),
]  # fmt: skip


@pytest.mark.parametrize(("calls", "tokens", "lengths", "error", "param", "match"), BAD_BATCHES)
def test_bad_batches(
    backend: Any,
    calls: tuple[str, ...],
    tokens: Any,
    lengths: Any,
    error: type,
    param: str,
    match: str,
) -> None:
    """Host ``tokens`` and ``lengths`` (``None``: none) or functions of the backend."""
    arrays = [
        a(backend) if callable(a) else ints(backend, a) for a in (tokens, lengths) if a is not None
    ]
    for call in calls:
        with raises_about(error, param, match):
            realize(backend, CALLS[call](params_on(backend), *arrays))


# -- namespaces and devices ----------------------------------------------------------------------
def test_tokens_of_another_namespace(backend: Any) -> None:
    """NumPy tokens with the backend's params (array-api-strict ones on the NumPy backend)."""
    params = params_on(backend)
    if backend.name == "numpy":
        foreign = pytest.importorskip("array_api_strict").asarray(np.array(GOOD_TOKENS))
    else:
        foreign = np.array(GOOD_TOKENS)
    with raises_about(TypeError, "tokens", "different namespaces"):
        forward(params, foreign)
    with raises_about(TypeError, "lengths", "different namespaces"):
        forward(params, ints(backend, GOOD_TOKENS), foreign[:, 0])


def test_numpy_tokens_with_torch_params() -> None:
    pytest.importorskip("torch")
    params = init_params(CONFIG, backend="torch")
    with raises_about(TypeError, "tokens", "different namespaces"):
        forward(params, np.array(GOOD_TOKENS))
    with pytest.raises(TypeError, match=r"token_ids and params|tokens and params"):
        decode_step(params, np.array([1, 2]), KVCache())


def test_array_api_strict_tokens_and_params_on_other_devices() -> None:
    strict = pytest.importorskip("array_api_strict")
    params = init_params(CONFIG, backend="array_api_strict", device="device1")
    cpu = strict.Device("CPU_DEVICE")
    with raises_about(ValueError, "tokens", "CPU_DEVICE"):
        forward(params, strict.asarray(np.array(GOOD_TOKENS), device=cpu))
    on_params_device = strict.asarray(np.array(GOOD_TOKENS), device=params.device)
    with raises_about(ValueError, "lengths", "CPU_DEVICE"):
        loss_and_grads(params, on_params_device, strict.asarray(np.array(GOOD_LENGTHS), device=cpu))
    # Params of mixed namespaces or devices
    arrays = init_params(CONFIG).arrays()
    with pytest.raises(TypeError, match="one namespace"):
        Params(CONFIG, **{**arrays, "lm_head": strict.asarray(arrays["lm_head"])})
    other = init_params(CONFIG, backend="array_api_strict")
    with pytest.raises(ValueError, match="one device"):
        Params(CONFIG, **{**params.arrays(), "wpe": other.wpe})


# -- state dicts, GPTConfig and Params -------------------------------------------------------------
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
    with raises_about(ValueError, "state_dict", match):
        Params.from_state_dict(sd, config=CONFIG)


@pytest.mark.parametrize("field", ["vocab_size", "n_layer", "n_embd", "n_head", "block_size"])
@pytest.mark.parametrize("value", [0, -3, 16.0, "16", True, None])
def test_config_fields_are_positive_ints(field: str, value: Any) -> None:
    error = ValueError if type(value) is int else TypeError
    with raises_about(error, field, "positive" if error is ValueError else "an int"):
        GPTConfig(**{"vocab_size": 27, field: value})


def _sd(config: GPTConfig = CONFIG) -> dict[str, Any]:
    return init_params(config, dtype="float64").to_state_dict()


#: (call, error, param, match) of calls outside the batch checks
CALL_ERRORS = [
    (lambda: forward(init_params(CONFIG), GOOD_TOKENS), TypeError, "tokens", "must be an array"),
    (lambda: Params.from_state_dict(_sd(GPTConfig(7, n_layer=2, n_embd=8, n_head=2, block_size=5)),
                                    config=CONFIG), ValueError, "state_dict", r"\['layer1.attn_wq'"),
    (lambda: Params.from_state_dict([("wte", np.zeros((7, 8)))]), TypeError, "state_dict", None),
    (lambda: GPTConfig(vocab_size=27, n_head=3), ValueError, "n_head", "divisible"),
    (lambda: GPTConfig.from_dict({"vocab_size": 27, "dropout": 0.1}), ValueError, None,
     r"unknown GPTConfig keys: \['dropout'\]"),
    (lambda: init_params({"vocab_size": 27}), TypeError, "config", None),
    *[(lambda f=f, kw=kw: f(**kw), ValueError, next(iter(kw)), None)
      for f in (lambda **kw: init_params(CONFIG, **kw), lambda **kw: init_params(CONFIG).to(**kw))
      for kw in ({"backend": "tensorflow"}, {"dtype": "float16"})],
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "param", "match"), CALL_ERRORS)
def test_call_errors(call: Any, error: type, param: str | None, match: str | None) -> None:
    with raises_about(error, param, match):
        call()


def test_params_checks(backend: Any) -> None:
    """A wrong shape in any field, another config, mixed dtypes, int or float16 weights."""
    p = params_on(backend)
    arrays = p.arrays()
    for name in FIELDS:
        a = getattr(p, name)
        with raises_about(ValueError, name, "has shape"):
            Params(CONFIG, **{**arrays, name: a[..., :-1] if a.shape[-1] > 1 else a[:0]})
    narrower = GPTConfig(vocab_size=7, n_layer=1, n_embd=4, n_head=2, block_size=5)
    with raises_about(ValueError, "wte", r"\(7, 8\), but the config needs"):
        Params(narrower, **arrays)
    deeper = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)
    with raises_about(ValueError, "attn_wq", r"\(1, 8, 8\)"):
        Params(deeper, **arrays)
    with raises_about(TypeError, "config"):
        Params(CONFIG.to_dict(), **arrays)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="one dtype"):
        Params(CONFIG, **{**arrays, "wte": params_on(backend, "float32").wte})
    # integer and float16 weights (float16 could not be checkpointed; array-api-strict has none)
    for dtype in ("int64", "float16")[: 1 + hasattr(backend.xp, "float16")]:
        other = {k: backend.asarray(np.zeros(a.shape), dtype=dtype) for k, a in arrays.items()}
        with pytest.raises(TypeError, match=rf"float32 or float64, got .*{dtype}"):
            Params(CONFIG, **other)


@pytest.mark.parametrize("error", [ArgumentValueError, ArgumentTypeError])
def test_user_errors_keep_their_param_through_pickle(error: type) -> None:
    """An error raised in a worker process or a Dask task reaches the caller whole."""
    again = pickle.loads(pickle.dumps(error("batch_size", "batch_size must be positive")))
    assert type(again) is error and again.param == "batch_size"
    assert str(again) == "batch_size must be positive"

"""``microgpt_xp.optim.Adam`` against the scalar ``reference.adam_step`` (spec §8): updates,
moments, the schedule, zero-gradient weights that keep moving, errors; nanoGPT's options
against its ``get_lr`` and ``torch.optim.AdamW``; the spec's update bit for bit when off."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import reference
from conftest import ref_state
from xp_testing import params_on, raises_about, state_dict_arrays, xp_assert_close

from microgpt_xp import GPTConfig, Params, init_params
from microgpt_xp.optim import Adam, AdamConfig, AdamState, adam_init, adam_update
from microgpt_xp.params import flatten, unflatten

CONFIG = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)


def random_grads(rng: np.random.Generator, sd: dict[str, Any]) -> dict[str, np.ndarray]:
    """Gradients of a few magnitudes, with exact zeros (a whole ``wte`` row among them)."""
    grads = {}
    for key, mat in sd.items():
        g = rng.standard_normal(np.shape(mat)) * 10.0 ** rng.integers(-6, 1, size=np.shape(mat))
        g[rng.random(g.shape) < 0.2] = 0.0
        grads[key] = g
    grads["wte"][2] = 0.0
    return grads


@pytest.mark.parametrize("num_steps", [1000, 5])
def test_adam_matches_reference(backend: Any, num_steps: int) -> None:
    """Weights and both moments after each step, to 1e-15 of the scalar reference."""
    rng = np.random.default_rng(0)
    sd = copy.deepcopy(ref_state(CONFIG, 3))  # reference.adam_step updates it in place
    ref_m, ref_v = reference.zeros_like(sd), reference.zeros_like(sd)
    params = params_on(backend, CONFIG, sd)
    adam = Adam(params, num_steps=num_steps)
    assert adam.m.backend == adam.v.backend == backend.name
    for step in range(5):
        g = random_grads(rng, sd)
        params = adam.step(params, params_on(backend, CONFIG, g))
        reference.adam_step(sd, {k: v.tolist() for k, v in g.items()}, ref_m, ref_v, step,
                            num_steps=num_steps)  # fmt: skip
        assert adam.t == step + 1 and params.backend == backend.name
        for name, got, ref in (("p", params, sd), ("m", adam.m, ref_m), ("v", adam.v, ref_v)):
            for key, a in state_dict_arrays(got).items():
                what = f"step {step} {name}[{key}]"
                xp_assert_close(a, ref[key], rtol=1e-15, like=params.wte, what=what)


def test_zero_gradient_weights_keep_moving(backend: Any) -> None:
    sd = ref_state(CONFIG, 3)
    params = params_on(backend, CONFIG, sd)
    g = {k: np.full(np.shape(v), 0.5) for k, v in sd.items()}
    g["wte"][4] = 0.0  # never has a gradient
    adam = Adam(params)
    p1 = adam.step(params, params_on(backend, CONFIG, g))
    s0, s1 = params.to_state_dict(), p1.to_state_dict()
    # no moment yet: no move
    xp_assert_close(p1.wte[4, :], params.wte[4, :], rtol=0, what="wte[4]")
    assert np.all(s1["wte"][:4] != s0["wte"][:4])
    # at step 1, m̂/√v̂ = sign(g): every weight with a gradient moves by about lr
    moved = params.lm_head - p1.lm_head
    xp_assert_close(moved, np.full(tuple(moved.shape), 0.01), rtol=1e-7, like=params.wte,
                    what="lm_head", elementwise=True)  # fmt: skip
    s2 = adam.step(p1, params.map(lambda a: a * 0.0)).to_state_dict()
    for key in s1:
        expected = np.ones(s1[key].shape, dtype=bool)
        if key == "wte":
            expected[4] = False
        np.testing.assert_array_equal(s2[key] != s1[key], expected, err_msg=key)
    assert np.all(s2["wte"][0] < s1["wte"][0])  # momentum keeps the direction of g > 0
    # adam does not modify its inputs
    grads = params_on(backend, CONFIG, random_grads(np.random.default_rng(1), sd))
    before_g = grads.to_state_dict()
    assert Adam(params).step(params, grads) is not params
    for key, a in params.to_state_dict().items():
        np.testing.assert_array_equal(a, s0[key])
        np.testing.assert_array_equal(grads.to_state_dict()[key], before_g[key])


def test_step_errors_and_the_spec_schedule(backend: Any) -> None:
    params = init_params(CONFIG, backend=backend.name, device=backend.device, dtype="float64")
    grads = params.map(lambda a: a * 0.0 + 1.0)
    adam = Adam(params, num_steps=2)
    params = adam.step(adam.step(params, grads), grads)
    with pytest.raises(ValueError, match="num_steps=2"):
        adam.step(params, grads)
    assert adam.t == 2
    other = init_params(GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=4, block_size=5))
    with raises_about(ValueError, "grads", "different configs"):
        Adam(params).step(params, other)
    with raises_about(ValueError, "t", r"\[0, 2\]"):
        adam.restore(adam.m, adam.v, 3)
    with pytest.raises(ValueError, match="moments"):
        adam.restore(other, adam.v, 1)
    with raises_about(TypeError, "params"):
        Adam(params.to_state_dict())  # type: ignore[arg-type]
    # spec schedule end points
    adam = Adam(init_params(GPTConfig(vocab_size=27)))
    assert adam.lr_at(0) == 0.01 and adam.lr_at(999) == pytest.approx(1e-5, rel=1e-12)
    hp = adam.config
    assert (hp.beta1, hp.beta2, hp.eps, hp.num_steps) == (0.85, 0.99, 1e-8, 1000)
    assert hp == AdamConfig()  # the spec's record


nan, inf = float("nan"), float("inf")
BAD = {"lr": [0.0, -0.01, nan, inf], "beta1": [1.0, -0.1], "beta2": [1.5, nan], "eps": [0.0, -1e-8],
       "num_steps": [0, 10.0, True], "warmup": [-1, 1000, 2.0], "decay": ["step", 1],
       "min_lr": [-1e-4, 0.02], "weight_decay": [-0.1, "0.1"], "grad_clip": [-1.0, inf],
       "init_std": [0.0]}  # fmt: skip


@pytest.mark.parametrize(("name", "value"), [(k, v) for k, vs in BAD.items() for v in vs])
def test_bad_hyperparameters(name: str, value: Any) -> None:
    """A ValueError naming the option (warmup=1000: not below num_steps=1000), a TypeError
    for a decay or weight decay of the wrong type."""
    error = TypeError if (name, value) in {("decay", 1), ("weight_decay", "0.1")} else ValueError
    with raises_about(error, name):
        Adam(init_params(CONFIG), **{name: value})


@pytest.mark.parametrize("std", [0.0, -1.0, float("nan"), "1"])
def test_init_std(std: Any) -> None:
    flat = flatten(init_params(CONFIG, seed=5, dtype="float64", std=0.02))
    assert np.array_equal(flat, flatten(init_params(CONFIG, seed=5, dtype="float64")) / 4)
    with raises_about(TypeError if isinstance(std, str) else ValueError, "std"):
        init_params(CONFIG, std=std)


# -- nanoGPT's options ----------------------------------------------------------------------
def get_lr(it: int, lr: float, warmup: int, steps: int, min_lr: float, cosine: bool) -> float:
    """nanoGPT's train.py ``get_lr`` (``lr_decay_iters = num_steps``), plus the linear decay."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    decay_ratio = (it - warmup) / (steps - warmup)
    if not cosine:
        return min_lr + (lr - min_lr) * (1 - decay_ratio)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (lr - min_lr)


@pytest.mark.parametrize(
    ("warmup", "decay", "min_lr"),
    [(0, "linear", 0.0), (3, "linear", 0.0), (0, "cosine", 0.0), (2, "cosine", 0.004),
     (1, "linear", 0.01)],
)  # fmt: skip
def test_schedule(backend: Any, warmup: int, decay: str, min_lr: float) -> None:
    """``lr_at`` is nanoGPT's ``get_lr``; ``adam_update`` and ``Adam.step`` on the namespace
    move every weight by it (a constant gradient: m̂/√v̂ = 1 up to rounding and eps)."""
    sched = dict(lr=0.01, num_steps=8, grad_clip=20.0, warmup=warmup, decay=decay, min_lr=min_lr)
    want = [get_lr(t, 0.01, warmup, 8, min_lr, decay == "cosine") for t in range(8)]
    hp = AdamConfig(**sched)
    params = init_params(CONFIG, backend=backend.name, device=backend.device, dtype="float64")
    adam = Adam(params, **sched)
    assert [hp.lr_at(t) for t in range(8)] == [adam.lr_at(t) for t in range(8)] == want
    ones, state, by_class = params.map(lambda a: a * 0.0 + 1.0), adam_init(params), params
    for t in range(8):
        (new, state), stepped = adam_update(params, ones, state, hp), adam.step(by_class, ones)
        for before, after in ((params, new), (by_class, stepped)):
            for name, a in after.arrays().items():
                moved = getattr(before, name) - a
                xp_assert_close(moved, np.full(tuple(moved.shape), want[t]), rtol=1e-7,
                                like=params.wte, what=f"step {t} {name}", elementwise=True)  # fmt: skip
        params, by_class = new, stepped


def spec_update(params: Params, grads: Params, state: AdamState, hp: AdamConfig) -> Any:
    """main's adam_update before the options (flat form), kept here as the spec's exact one."""
    xp, dtype = params.xp, params.dtype
    t = xp.astype(state.step, xp.float64)
    lr_t = xp.astype(hp.lr * (1.0 - t / hp.num_steps), dtype)
    bc1 = xp.astype(1.0 - hp.beta1 ** (t + 1.0), dtype)
    bc2 = xp.astype(1.0 - hp.beta2 ** (t + 1.0), dtype)
    g, m, v = flatten(grads), state.m, state.v
    m = hp.beta1 * m + (1 - hp.beta1) * g
    v = hp.beta2 * v + (1 - hp.beta2) * (g * g)
    return flatten(params) - (lr_t * (m / bc1)) / ((v / bc2) ** 0.5 + hp.eps), m, v


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_defaults_are_the_spec_bit_for_bit(dtype: str) -> None:
    rng = np.random.default_rng(7)
    params = init_params(CONFIG, seed=1, dtype=dtype)
    n, cast = CONFIG.num_params, lambda a: np.asarray(a, dtype=dtype)
    for t in (0, 1, 17, 999):
        grads = unflatten(cast(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 1, n)), CONFIG)
        m, v = cast(rng.standard_normal(n) * 1e-2), cast(rng.random(n) * 1e-3)
        step = np.asarray(t, dtype=np.int64)
        want = spec_update(params, grads, AdamState(m, v, step), AdamConfig())
        per_weight = AdamState(unflatten(m, CONFIG), unflatten(v, CONFIG), step)
        p, s = adam_update(params, grads, per_weight, AdamConfig(num_steps=1000))
        for got, ref in zip((p, s.m, s.v), want, strict=True):
            assert got.dtype == ref.dtype and np.array_equal(flatten(got), ref), f"step {t}"
        assert int(s.step) == t + 1


ALL_ON = {"warmup": 2, "decay": "cosine", "min_lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0}


def every_option_grads(seed: int) -> list[Params]:
    """Six steps' gradients, clipped (norm > 1) every other step."""
    rng = np.random.default_rng(seed)
    scale = [0.01 if t % 2 else 1.0 for t in range(6)]
    return [unflatten(rng.standard_normal(CONFIG.num_params) * s, CONFIG) for s in scale]


def test_every_option_on_matches_numpy(backend: Any) -> None:
    """Every option on: the update on each namespace matches NumPy's."""
    hp = AdamConfig(lr=0.02, num_steps=6, **ALL_ON)
    host = init_params(CONFIG, seed=2, dtype="float64")
    params = host.to(backend.name, device=backend.device)
    on_host, state = adam_init(host), adam_init(params)
    for g in every_option_grads(3):
        host, on_host = adam_update(host, g, on_host, hp)
        params, state = adam_update(params, g.to(backend.name, device=backend.device), state, hp)
        for name, a in params.arrays().items():
            xp_assert_close(a, getattr(host, name), rtol=1e-13, like=params.wte, what=name)


def test_adamw_and_clipping_match_torch() -> None:
    """nanoGPT's optimiser: ``torch.optim.AdamW`` with its ``lr`` set to ``get_lr`` each
    step after ``clip_grad_norm_``; the weights and both moments agree (float64)."""
    torch = pytest.importorskip("torch")
    hp = AdamConfig(lr=0.02, beta2=0.95, num_steps=6, **ALL_ON)
    params = init_params(CONFIG, seed=2, dtype="float64")
    ours = {k: torch.tensor(np.array(a)).requires_grad_() for k, a in params.arrays().items()}
    tensors = list(ours.values())
    opt = torch.optim.AdamW(tensors, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps,
                            weight_decay=hp.weight_decay)  # fmt: skip
    state = adam_init(params)
    for t, g in enumerate(every_option_grads(4)):
        for x, a in zip(tensors, g.arrays().values(), strict=True):
            x.grad = torch.tensor(np.array(a))
        norm = float(torch.nn.utils.clip_grad_norm_(tensors, hp.grad_clip))
        assert (norm > hp.grad_clip) == (t % 2 == 0)  # clipped every other step
        opt.param_groups[0]["lr"] = hp.lr_at(t)
        opt.step()
        params, state = adam_update(params, g, state, hp)
        for k, x in ours.items():
            moments = opt.state[x]
            for what, got, want in (("p", params, x), ("m", state.m, moments["exp_avg"]),
                                    ("v", state.v, moments["exp_avg_sq"])):  # fmt: skip
                np.testing.assert_allclose(getattr(got, k), want.detach().numpy(), rtol=1e-10,
                                           atol=1e-15, err_msg=f"step {t} {what}[{k}]")  # fmt: skip

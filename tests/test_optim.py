"""``microgpt_xp.optim.Adam`` against the scalar ``reference.adam_step`` (spec §8): the
updates, the moments, the linear learning-rate decay, zero-gradient parameters that keep
moving, and the errors for bad hyperparameters and for too many steps."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import reference
from xp_testing import state_dict_arrays, xp_assert_close

from microgpt_xp import GPTConfig, Params, init_params
from microgpt_xp.optim import Adam, AdamConfig

CONFIG = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)
#: float64 updates agree with the scalar reference to this relative error (or bit for bit).
RTOL = 1e-15


def ref_state() -> dict[str, list[list[float]]]:
    return reference.init_state_dict(
        CONFIG.vocab_size, CONFIG.n_layer, CONFIG.n_embd, CONFIG.block_size, rng=random.Random(3)
    )


def random_grads(rng: np.random.Generator, sd: dict[str, Any]) -> dict[str, np.ndarray]:
    """Gradients of a few magnitudes, with exact zeros (a whole ``wte`` row among them)."""
    grads = {}
    for key, mat in sd.items():
        g = rng.standard_normal(np.shape(mat)) * 10.0 ** rng.integers(-6, 1, size=np.shape(mat))
        g[rng.random(g.shape) < 0.2] = 0.0
        grads[key] = g
    grads["wte"][2] = 0.0
    return grads


def on(backend: Any, sd: dict[str, Any]) -> Params:
    return Params.from_state_dict(
        sd, config=CONFIG, backend=backend.name, device=backend.device, dtype="float64"
    )


@pytest.mark.parametrize("num_steps", [1000, 5])
def test_adam_matches_reference(backend: Any, num_steps: int) -> None:
    rng = np.random.default_rng(0)
    sd = ref_state()
    ref_m, ref_v = reference.zeros_like(sd), reference.zeros_like(sd)
    params = on(backend, sd)
    like = params.wte
    adam = Adam(params, num_steps=num_steps)
    assert adam.m.backend == adam.v.backend == backend.name
    for step in range(5):
        g = random_grads(rng, sd)
        params = adam.step(params, on(backend, g))
        reference.adam_step(
            sd, {k: v.tolist() for k, v in g.items()}, ref_m, ref_v, step, num_steps=num_steps
        )
        assert adam.t == step + 1
        assert params.backend == backend.name
        for name, got, ref in (("p", params, sd), ("m", adam.m, ref_m), ("v", adam.v, ref_v)):
            for key, a in state_dict_arrays(got).items():
                what = f"step {step} {name}[{key}]"
                xp_assert_close(a, ref[key], rtol=RTOL, like=like, what=what)


def test_adam_does_not_modify_its_inputs(backend: Any) -> None:
    sd = ref_state()
    params = on(backend, sd)
    grads = on(backend, random_grads(np.random.default_rng(1), sd))
    before_p, before_g = params.to_state_dict(), grads.to_state_dict()
    new = Adam(params).step(params, grads)
    assert new is not params
    for key, a in params.to_state_dict().items():
        np.testing.assert_array_equal(a, before_p[key])
        np.testing.assert_array_equal(grads.to_state_dict()[key], before_g[key])


def test_learning_rate_schedule(backend: Any) -> None:
    """``lr_t = lr (1 - t/num_steps)``; with a constant gradient each step moves every
    weight by ``lr_t`` (m̂/√v̂ = 1 up to rounding and eps)."""
    num_steps, lr = 8, 0.05
    params = init_params(CONFIG, backend=backend.name, device=backend.device, dtype="float64")
    ones = params.map(lambda a: a * 0.0 + 1.0)
    adam = Adam(params, lr=lr, num_steps=num_steps)
    like = params.wte
    for t in range(num_steps):
        assert adam.lr_at(t) == lr * (1 - t / num_steps)
        before = params
        params = adam.step(params, ones)
        for name, a in params.arrays().items():
            moved = getattr(before, name) - a
            xp_assert_close(
                moved,
                np.full(tuple(moved.shape), lr * (1 - t / num_steps)),
                rtol=1e-7,
                like=like,
                what=f"step {t} {name}",
                elementwise=True,
            )
    assert adam.lr_at(0) == lr
    assert adam.lr_at(num_steps - 1) == pytest.approx(lr / num_steps, rel=1e-15)


def test_spec_schedule_end_points() -> None:
    adam = Adam(init_params(GPTConfig(vocab_size=27)))
    assert adam.lr_at(0) == 0.01
    assert adam.lr_at(999) == pytest.approx(1e-5, rel=1e-12)
    hp = adam.config
    assert (hp.beta1, hp.beta2, hp.eps, hp.num_steps) == (0.85, 0.99, 1e-8, 1000)
    assert hp == AdamConfig()  # the spec's record


def test_zero_gradient_weights_keep_moving(backend: Any) -> None:
    sd = ref_state()
    params = on(backend, sd)
    zero = params.map(lambda a: a * 0.0)
    g = {k: np.full(np.shape(v), 0.5) for k, v in sd.items()}
    g["wte"][4] = 0.0  # never has a gradient
    adam = Adam(params)
    p1 = adam.step(params, on(backend, g))
    s0, s1 = params.to_state_dict(), p1.to_state_dict()
    # no moment yet: no move
    xp_assert_close(p1.wte[4, :], params.wte[4, :], rtol=0, what="wte[4]")
    assert np.all(s1["wte"][:4] != s0["wte"][:4])
    # at step 1, m̂/√v̂ = sign(g): every weight with a gradient moves by about lr
    moved = params.lm_head - p1.lm_head
    xp_assert_close(
        moved,
        np.full(tuple(moved.shape), 0.01),
        rtol=1e-7,
        like=params.wte,
        what="lm_head",
        elementwise=True,
    )
    p2 = adam.step(p1, zero)
    s2 = p2.to_state_dict()
    for key in s1:
        moved = s2[key] != s1[key]
        expected = np.ones_like(moved)
        if key == "wte":
            expected[4] = False
        np.testing.assert_array_equal(moved, expected, err_msg=key)
    assert np.all(s2["wte"][0] < s1["wte"][0])  # momentum keeps the direction of g > 0


def test_step_errors(backend: Any) -> None:
    params = init_params(CONFIG, backend=backend.name, device=backend.device, dtype="float64")
    grads = params.map(lambda a: a * 0.0 + 1.0)
    adam = Adam(params, num_steps=2)
    params = adam.step(adam.step(params, grads), grads)
    with pytest.raises(ValueError, match=r"taken all its num_steps=2 steps"):
        adam.step(params, grads)
    assert adam.t == 2
    other = init_params(GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=4, block_size=5))
    with pytest.raises(ValueError, match="different configs"):
        Adam(params).step(params, other)
    with pytest.raises(ValueError, match=r"t must be an int in \[0, 2\], got 3"):
        adam.restore(adam.m, adam.v, 3)
    with pytest.raises(ValueError, match="Adam's moments must be Params of"):
        adam.restore(other, adam.v, 1)
    with pytest.raises(TypeError, match="Adam needs a Params"):
        Adam(params.to_state_dict())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": 0.0}, "lr must be positive"),
        ({"lr": -0.01}, "lr must be positive"),
        ({"lr": float("nan")}, "lr must be finite"),
        ({"lr": float("inf")}, "lr must be finite"),
        ({"beta1": 1.0}, r"beta1 must lie in \[0, 1\)"),
        ({"beta1": -0.1}, r"beta1 must lie in \[0, 1\)"),
        ({"beta2": 1.5}, r"beta2 must lie in \[0, 1\)"),
        ({"beta2": float("nan")}, "beta2 must be finite"),
        ({"eps": 0.0}, "eps must be positive"),
        ({"eps": -1e-8}, "eps must be positive"),
        ({"num_steps": 0}, "num_steps must be a positive int"),
        ({"num_steps": 10.0}, "num_steps must be a positive int"),
        ({"num_steps": True}, "num_steps must be a positive int"),
    ],
)
def test_bad_hyperparameters(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        Adam(init_params(CONFIG), **kwargs)
    assert info.value.param == next(iter(kwargs))  # type: ignore[attr-defined]

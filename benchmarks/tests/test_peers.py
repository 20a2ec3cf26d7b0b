"""The peers compute what ours computes (so the benchmark compares the same work), on
our side's case and data."""

from __future__ import annotations

import random

import numpy as np
import pytest

import microgpt_xp as mx
from benchmarks.bench import peers as P
from benchmarks.bench import workloads as W

TINY = mx.GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)
ref = P.reference_module()


def test_peers_table_and_skips() -> None:
    assert list(P.PEERS) == ["scalar", "torch", "matmul", "jax"]
    decode = W.Case("decode", "tiny", TINY, 2, "float32", "numpy")
    for peer, match in (
        ("scalar", "train and text only"),
        ("matmul", "train and score only"),
        ("jax", "on JAX only"),
    ):
        with pytest.raises(P.PeerSkipped, match=match):
            P.PEERS[peer](decode)
    with pytest.raises(P.PeerSkipped, match="too slow"):
        P.scalar(W.Case("train", "medium", W.CONFIGS["medium"], 1, "float32", "numpy"))


def test_scalar_peer_is_the_reference_with_adam() -> None:
    sd = ref.init_state_dict(
        TINY.vocab_size, TINY.n_layer, TINY.n_embd, TINY.block_size, rng=random.Random(4)
    )
    peer = P.ScalarReference(sd, [6, 1, 2, 6], n_head=TINY.n_head)
    assert peer.ref is ref and ref.__file__ == str(P.REFERENCE)  # the one scalar GPT
    want, grads = ref.loss_and_grads(peer.initial, peer.doc, n_head=TINY.n_head)
    assert peer.train_step() == want
    moved = np.array(peer.state["layer0.mlp_fc1"]) - np.array(peer.initial["layer0.mlp_fc1"])
    g = np.array(grads["layer0.mlp_fc1"])
    nz = np.abs(g) > 1e-6  # Adam's first step: about lr * sign(g)
    np.testing.assert_allclose(moved[nz], -0.01 * np.sign(g[nz]), rtol=1e-3)
    assert peer.train_step() < want and peer.step == 2
    peer.reset()
    assert peer.state == peer.initial and peer.step == 2  # the weights go back, Adam's state stays


def test_scalar_peer_trains_what_ours_trains_and_matmul_flops() -> None:
    case = W.Case("train", "tiny", TINY, 1, "float64", "numpy", seed=3)
    want, _ = mx.loss_and_grads(case.params(), case.host_tokens(), np.full(1, TINY.block_size + 1))
    assert P.scalar(case).fn() == pytest.approx(float(want), rel=1e-12)
    cfg, b = W.CONFIGS["medium"], 32
    t, c, v, layers = cfg.block_size, cfg.n_embd, cfg.vocab_size, cfg.n_layer
    forward = 2 * b * t * (12 * c * c * layers + c * v) + 2 * 2 * b * t * t * c * layers
    assert P.matmul_flops(W.Case("score", "medium", cfg, b, "float32", "numpy")) == forward
    assert P.matmul_flops(W.Case("train", "medium", cfg, b, "float32", "numpy")) == 3 * forward
    assert isinstance(P.matmul(W.Case("train", "tiny", TINY, 2, "float32", "numpy")).fn(), float)


def test_torch_peer_is_the_same_model() -> None:
    torch = pytest.importorskip("torch")

    from benchmarks.bench.torch_peer import TorchGPT

    case = W.Case("train", "tiny", TINY, 3, "float64", "numpy", seed=2)
    tokens, lengths = case.host_tokens(), np.full(3, TINY.block_size + 1)
    want_loss, want = mx.loss_and_grads(case.params(), tokens, lengths)
    peer = TorchGPT(P.host_weights(case), TINY, "float64")
    loss = peer.loss(torch.from_numpy(tokens))
    loss.backward()
    assert loss.item() == pytest.approx(float(want_loss), rel=1e-12)
    close = {"rtol": 1e-9, "atol": 1e-13}
    np.testing.assert_allclose(peer.wte.grad.numpy(), want.wte, **close)
    np.testing.assert_allclose(peer.lm_head.grad.numpy(), want.lm_head, **close)
    for i, (wqkv, _, _, fc2) in enumerate(peer.layers):
        qkv = np.concatenate([want.attn_wq[i], want.attn_wk[i], want.attn_wv[i]])
        np.testing.assert_allclose(wqkv.grad.numpy(), qkv, **close)
        np.testing.assert_allclose(fc2.grad.numpy(), want.mlp_fc2[i], **close)
    before = peer.score(torch.from_numpy(tokens)).numpy()
    peer.opt.step()
    assert not np.allclose(peer.score(torch.from_numpy(tokens)).numpy(), before)
    peer.reset()
    want_nll = mx.score(case.params(), tokens, lengths)
    np.testing.assert_allclose(peer.score(torch.from_numpy(tokens)).numpy(), want_nll, rtol=1e-12)
    t = W.target_for(
        W.Case("train", "default", W.CONFIGS["default"], 64, "float32", "torch"), "torch"
    )
    assert t is not None and t[0] == 1.0 and "through our code" in t[1]


def test_torch_peer_decodes_what_we_sample() -> None:
    torch = pytest.importorskip("torch")

    from benchmarks.bench.torch_peer import TorchGPT
    from microgpt_xp.sample import sample_tokens

    cfg = mx.GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=6)
    params = mx.init_params(cfg, seed=1, dtype="float64")
    ours = sample_tokens(params, 6, 40, seed=9)
    u = torch.from_numpy(np.random.default_rng(9).random((40, cfg.block_size)))
    host = {k: np.asarray(v) for k, v in params.arrays().items()}
    theirs = TorchGPT(host, cfg, "float64").decode(u, 6).numpy()
    for row_ours, row_theirs in zip(ours, theirs, strict=True):
        stop = list(row_theirs).index(6) + 1 if 6 in row_theirs else cfg.block_size
        assert list(row_ours[:stop]) == list(row_theirs[:stop])


def test_jax_peer_trains_the_same_model() -> None:
    pytest.importorskip("jax")
    from benchmarks.bench.jax_peer import JaxGPT

    case = W.Case("train", "tiny", TINY, 3, "float64", "jax")
    tokens = case.host_tokens()
    model = JaxGPT(P.host_weights(case), TINY, "float64")
    lengths = np.full(tokens.shape[0], tokens.shape[1])
    want, _ = mx.loss_and_grads(case.params(), case.asarray(tokens), case.asarray(lengths))
    first = model.train_step(tokens)
    assert first == pytest.approx(float(want), rel=1e-12) and model.train_step(tokens) < first
    assert float(model.score(tokens).mean()) < first

"""The benchmark: a tiny end-to-end run with its JSON, the peers computing the same model
as ours, and the pieces that make the ratios trustworthy (the /proc/stat filter, the
interleaving, the FLOP count)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference

from microgpt_xp import GPTConfig, init_params, loss_and_grads

# the benchmarks live in the repository, outside the installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench import configure_parser, main
from benchmarks.bench import peers as P
from benchmarks.bench import profiling as B
from benchmarks.bench import targets as TG
from benchmarks.bench import timing as T
from benchmarks.bench import workloads as W

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
TINY = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)


def needs_torch(test: Any) -> Any:
    """Skip without PyTorch; marked so that the torch nox session runs it too."""
    skip = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
    return pytest.mark.needs_torch(skip(test))


def test_malloc_tuning_is_on_by_default() -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert parser.parse_args([]).tune_malloc is True
    assert parser.parse_args(["--no-tune-malloc"]).tune_malloc is False


def test_tiny_run_writes_json_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    peers = "scalar,matmul" + (",torch" if HAS_TORCH else "")
    argv = [
        "--config",
        "L1,C8,H2,T4",
        "--batch-size",
        "3",
        "--decode-batch-size",
        "2",
        "--repeats",
        "1",
        "--max-rounds",
        "1",
        "--warmup",
        "1",
        "--min-time",
        "0.001",
        "--gap",
        "0.01",
        "--peers",
        peers,
        "--json",
        str(out),
        "--no-tune-malloc",  # leave the test process's allocator as it is
    ]
    if HAS_MPL:
        argv += ["--plot", str(png)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "ours[numpy] / scalar" in printed and "breakdown of our training step" in printed

    result = json.loads(out.read_text())
    assert result["schema"] == "microgpt-xp-bench/2"
    assert "benchmarks.bench" in result["command"] and "--json" in result["command"]
    m = result["machine"]
    assert m["cpus"] >= 1 and m["square_matmul_gflops"] > 0
    assert m["malloc_tuned"] is False  # --no-tune-malloc
    if HAS_TORCH:
        assert m["torch_threads"] >= 1
    impls = {"ours[numpy]", "scalar", "matmul"} | ({"torch"} if HAS_TORCH else set())
    for workload in ("train", "score", "decode"):
        rows = [r for r in result["results"] if r["workload"] == workload]
        want = impls - ({"matmul"} if workload == "decode" else set())
        assert {r["impl"] for r in rows} == want
        for r in rows:
            assert r["config"] == "L1,C8,H2,T4,V27" and r["seq_len"] == 4
            assert r["batch"] == (2 if workload == "decode" else 3)
            assert r["tokens_per_call"] == (4 if r["impl"] == "scalar" else r["batch"] * 4)
            assert r["rounds_kept"] + r["rounds_dropped"] == 1
            tps = r["tokens_per_s"]
            assert tps["n"] == 1 and 0 < tps["min"] <= tps["median"] <= tps["max"]
            assert r["dtype_used"] == ("float64" if r["impl"] == "scalar" else "float32")
    comps = result["comparisons"]
    assert len(comps) == 3 * len(impls) - 1 - 3  # every peer of every workload, no matmul decode
    results = {(r["workload"], r["impl"]): r for r in result["results"]}
    for c in comps:
        assert c["ours"] == "ours[numpy]" and len(c["ratios"]) == 1
        ours = results[(c["workload"], "ours[numpy]")]["tokens_per_s"]["median"]
        peer = results[(c["workload"], c["peer"])]["tokens_per_s"]["median"]
        assert c["ratio"]["median"] == pytest.approx(ours / peer, rel=1e-9)
        assert c["target"] is None and c["meets_target"] is None  # no target for this config
        assert len(c["other_cpu_share"]) == 1
    mm = next(c for c in comps if c["peer"] == "matmul" and c["workload"] == "train")
    assert mm["model_flops_per_call"] > 0 and mm["matmul_gflops"]["median"] > 0
    assert {s["peer"] for s in result["skipped"]} == {"matmul"}
    (bd,) = result["breakdown"]
    _check_breakdown(bd)
    assert "profiler" in printed and "for shares, not absolute times" in printed
    assert bd["upcasts"] == [], bd["dtypes"]  # float32 stays float32 in every layer
    assert m["usable_cpus"] >= 1 and m["devices"]["numpy"] == {"ours": "cpu", "torch_peer": "cpu"}
    if HAS_MPL:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: What a training step calls in microgpt_xp.layers, whatever else it calls.
STEP_LAYERS = {
    f"layers.{name}_{direction}"
    for name in ("embedding", "rmsnorm", "linear", "linear_t", "causal_attention", "relu")
    for direction in ("forward", "backward")
} | {"layers.cross_entropy_forward", "layers.cross_entropy_backward"}


def _check_breakdown(bd: dict[str, Any]) -> None:
    """A breakdown's rows: the layer functions of a step, then optim and other, adding up
    to the step; a function's own time within its inclusive time."""
    names = [r["function"] for r in bd["rows"]]
    assert names[-2:] == ["optim", "other"] and len(set(names)) == len(names)
    assert set(names[:-2]) >= STEP_LAYERS
    assert all(n.startswith(("layers.", "primitives.")) for n in names[:-2])
    assert bd["step_s"] > 0 and bd["steps_kept"] + bd["steps_dropped"] >= 1
    assert sum(r["own_s"] for r in bd["rows"]) == pytest.approx(bd["step_s"], rel=1e-9)
    assert sum(r["share"] for r in bd["rows"]) == pytest.approx(1.0, rel=1e-9)
    for r in bd["rows"][:-1]:
        assert 0 <= r["own_s"] <= r["inclusive_s"] * (1 + 1e-9) and r["calls"] >= 1
    optim = bd["rows"][-2]
    assert optim["calls"] == 1  # Adam.step, once a step
    assert bd["minor_faults_per_step"] >= 0
    assert "cProfile" in bd["method"] and "for shares, not absolute times" in bd["method"]


def test_profile_rows_are_found_by_their_code_whatever_the_caller_calls_them() -> None:
    from microgpt_xp import layers
    from microgpt_xp.layers import causal_attention_forward as attention
    from microgpt_xp.layers import relu_forward

    before = dict(vars(layers))
    x = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)

    def work() -> None:
        for _ in range(20):
            relu_forward(x)
            attention(x, 4, 16, 4)  # qkv of B=4, T=16, C=16
        sum(range(10_000))  # not a layer: in no row

    codes = {"relu": relu_forward.__code__}
    functions, timed, seconds = B.profile_call(work, B.ModuleMatcher(B.PROFILED), codes)
    assert functions["layers.relu_forward"]["calls"] == 20
    att = functions["layers.causal_attention_forward"]
    assert att["calls"] == 20
    # what attention calls in the primitives is a row of its own, left out of attention's
    # own time (on NumPy arrays, the primitive runs its NumPy override, a row too)
    inner = functions["primitives.causal_attention"]
    assert inner["calls"] == 20 and functions["primitives._numpy_causal_attention"]["calls"] == 20
    assert att["own_s"] < att["inclusive_s"] - inner["inclusive_s"] * 0.999
    entry = att["inclusive_s"] + functions["layers.relu_forward"]["inclusive_s"]
    assert sum(f["own_s"] for f in functions.values()) == pytest.approx(entry, rel=1e-9)
    assert timed["relu"]["calls"] == 20 and seconds >= entry
    assert timed["relu"]["inclusive_s"] == functions["layers.relu_forward"]["inclusive_s"]
    assert vars(layers) == before  # nothing patched


def test_module_matcher_takes_modules_and_packages() -> None:
    import json.decoder

    from microgpt_xp import layers

    matcher = B.ModuleMatcher(["microgpt_xp.layers", "json", "microgpt_xp.no_such_module"])
    assert matcher.label(layers.__file__) == "layers"
    assert matcher.label(json.__file__) == "json"
    assert matcher.label(json.decoder.__file__) == "json.decoder"
    assert matcher.label(np.__file__) is None
    assert sorted(matcher.files.values()) == ["layers"]


def test_module_matcher_leaves_out_a_submodule_found_outside_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install of another checkout can make find_spec find a submodule there."""
    import importlib.machinery
    import importlib.util

    stray = tmp_path / "microgpt_xp" / "primitives.py"
    stray.parent.mkdir()
    stray.write_text("raise ImportError('not this package')\n")
    find_spec = importlib.util.find_spec

    def fake(name: str, *args: Any) -> Any:
        if name == "microgpt_xp.primitives":
            return importlib.machinery.ModuleSpec(name, None, origin=str(stray))
        return find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    matcher = B.ModuleMatcher(["microgpt_xp.layers", "microgpt_xp.primitives"])
    assert sorted(matcher.files.values()) == ["layers"] and not matcher.packages


def test_breakdown_records_what_each_layer_returns() -> None:
    case = W.Case("train", "tiny", TINY, 3, "float32", "numpy")
    bd = B.breakdown(case, steps=1, warmup=0)
    assert bd["dtypes"]["layers.rmsnorm_forward"] == ["float32"]
    assert bd["upcasts"] == []
    wide = B.breakdown(W.Case("train", "tiny", TINY, 3, "float64", "numpy"), steps=1, warmup=0)
    assert wide["dtypes"]["layers.rmsnorm_forward"] == ["float64"]


def test_bad_arguments_exit_with_status_2(capsys: pytest.CaptureFixture) -> None:
    assert main(["--workload", "nope", "--repeats", "1"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["--peers", "numpy2", "--repeats", "1"]) == 2
    assert main(["--gap", "-1", "--repeats", "1"]) == 2
    assert "--gap must be" in capsys.readouterr().err


@needs_torch
def test_peers_and_breakdown_on_another_backend_and_device() -> None:
    """The pieces the GPU run uses, on torch's CPU: the torch peer on a chosen device, the
    matmul yardstick on our backend, and the breakdown that waits for each layer."""
    import torch

    assert W.torch_device_like("numpy", "cpu") == "cpu" and W.device_name("numpy", "cpu") == "cpu"
    assert W.torch_device_like("torch", torch.device("cpu")) == "cpu"
    assert W.device_name("torch", torch.device("cpu")) == "cpu"
    case = W.Case("train", "tiny", TINY, 3, "float32", "torch", device="cpu", peer_device="cpu")
    assert case.torch_device() == "cpu"
    assert isinstance(W.ours(case).fn(), float)
    peer = P.make_peer("torch", case)
    assert math.isfinite(peer.fn())
    assert isinstance(P.make_peer("matmul", case).fn(), float)
    _check_breakdown(B.breakdown(case, steps=2, warmup=1))


def test_a_peer_is_one_function_of_the_peers_table() -> None:
    assert list(P.PEERS) == ["scalar", "torch", "torch_sdpa", "matmul", "jax"]
    case = W.Case("decode", "tiny", TINY, 2, "float32", "numpy")
    with pytest.raises(P.PeerSkipped, match="train and score only"):
        P.make_peer("matmul", case)
    with pytest.raises(P.PeerSkipped, match="KV-cache loop"):
        P.make_peer("torch_sdpa", case)
    medium = W.Case("train", "medium", W.CONFIGS["medium"], 1, "float32", "numpy")
    with pytest.raises(P.PeerSkipped, match="too slow"):
        P.make_peer("scalar", medium)
    with pytest.raises(ValueError, match="unknown peer"):
        P.make_peer("tensorflow", case)
    with pytest.raises(P.PeerSkipped, match="against ours on JAX only"):
        P.make_peer("jax", case)
    timed = P.make_peer("scalar", case)
    assert timed.name == "scalar" and timed.tokens == TINY.block_size
    assert len(timed.fn()) == TINY.block_size


def test_targets_name_what_they_compare() -> None:
    default, medium = W.CONFIGS["default"], W.CONFIGS["medium"]
    t = TG.target_for(W.Case("train", "default", default, 64, "float32", "numpy"), "torch")
    assert t is not None and t.minimum == 2.0 and "PyTorch eager" in t.what
    t = TG.target_for(W.Case("train", "medium", medium, 32, "float32", "numpy"), "torch")
    assert t is not None and t.minimum == 1.0
    for case, peer in [
        (W.Case("train", "default", default, 32, "float32", "numpy"), "torch"),
        (W.Case("train", "default", default, 64, "float64", "numpy"), "torch"),
        (W.Case("score", "default", default, 64, "float32", "numpy"), "torch"),
        (W.Case("train", "default", default, 64, "float32", "numpy"), "scalar"),
        (W.Case("train", "default", default, 64, "float32", "numpy", peer_device="cuda:0"), "torch"),
    ]:
        assert TG.target_for(case, peer) is None
    assert {(t.backend, t.config, t.batch) for t in TG.TARGETS} == {
        ("numpy", "default", 64),
        ("numpy", "medium", 32),
        ("torch", "default", 64),
        ("torch", "medium", 32),
    }
    assert all(t.what and t.peer == "torch" and t.dtype == "float32" for t in TG.TARGETS)


@needs_torch
def test_torch_through_our_code_has_its_target() -> None:
    case = W.Case("train", "default", W.CONFIGS["default"], 64, "float32", "torch")
    t = TG.target_for(case, "torch")
    assert t is not None and t.minimum == 1.0 and "through our code" in t.what


@pytest.mark.parametrize(("minimum", "status"), [(1e9, 1), (1e-9, 0)])
def test_check_targets_exits_1_when_a_target_is_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minimum: float, status: int
) -> None:
    what = "ours against the plain matmuls, for this test"
    target = TG.Target(what, "numpy", "train", "L1,C8,H2,T4,V27", 3, "matmul", minimum)
    monkeypatch.setattr(TG, "TARGETS", (target,))
    out = tmp_path / "bench.json"
    argv = ["--config", "L1,C8,H2,T4", "--batch-size", "3", "--workload", "train"]
    argv += ["--repeats", "1", "--max-rounds", "1", "--warmup", "1", "--min-time", "0.001"]
    argv += ["--gap", "0", "--peers", "matmul", "--no-breakdown", "--no-tune-malloc"]
    assert main([*argv, "--json", str(out)]) == 0  # without --check-targets
    assert main([*argv, "--json", str(out), "--check-targets"]) == status
    (comp,) = json.loads(out.read_text())["comparisons"]
    assert comp["target"] == minimum and comp["target_what"] == what
    assert comp["meets_target"] is (status == 0)


def test_parse_config() -> None:
    assert W.parse_config("default") == ("default", W.CONFIGS["default"])
    label, cfg = W.parse_config("L4,C128,H4,T64")
    assert (
        cfg == GPTConfig(27, n_layer=4, n_embd=128, n_head=4, block_size=64) == W.CONFIGS["medium"]
    )
    assert label == "L4,C128,H4,T64,V27"
    assert W.parse_config("c32l2t8v11")[1] == GPTConfig(11, n_layer=2, n_embd=32, block_size=8)
    with pytest.raises(ValueError, match="unknown config"):
        W.parse_config("big")


def _state_dict(cfg: GPTConfig, seed: int) -> dict[str, list[list[float]]]:
    return reference.init_state_dict(
        cfg.vocab_size, cfg.n_layer, cfg.n_embd, cfg.block_size, rng=random.Random(seed)
    )


def _scalar_peer(cfg: GPTConfig, seed: int, doc: list[int]) -> P.ScalarReference:
    return P.ScalarReference(
        _state_dict(cfg, seed), doc, n_head=cfg.n_head, bos=cfg.vocab_size - 1, seed=seed
    )


def test_scalar_peer_is_the_tests_reference_oracle() -> None:
    peer = _scalar_peer(TINY, 3, [6, 0, 3, 3, 5, 6])
    assert peer.ref is reference  # the one scalar GPT of the repository, not a second one
    assert P.reference_module() is reference


def test_scalar_peer_train_step_is_adam_on_the_reference_loss() -> None:
    doc = [6, 1, 2, 6]
    sd = _state_dict(TINY, 4)
    want_loss, g = reference.loss_and_grads(sd, doc, n_head=TINY.n_head)
    peer = _scalar_peer(TINY, 4, doc)
    assert peer.score() == pytest.approx(want_loss, rel=1e-12)  # forward on floats
    loss0 = peer.train_step()
    assert loss0 == want_loss
    # at the first step Adam moves every weight with a non-zero gradient by about lr * sign(g)
    moved = np.array(peer.state["layer0.mlp_fc1"]) - np.array(sd["layer0.mlp_fc1"])
    gs = np.array(g["layer0.mlp_fc1"])
    nz = np.abs(gs) > 1e-6
    np.testing.assert_allclose(moved[nz], -0.01 * np.sign(gs[nz]), rtol=1e-3)
    assert peer.score() < loss0  # one step on a document lowers its loss
    peer.reset()
    assert peer.state == sd and peer.step == 1  # the weights go back, Adam's state stays
    assert peer.score() == pytest.approx(loss0, rel=1e-12)


def test_scalar_peer_samples_the_requested_number_of_tokens() -> None:
    a = _scalar_peer(TINY, 5, [6, 1, 6]).decode()
    b = _scalar_peer(TINY, 5, [6, 1, 6]).decode()
    assert a == b and len(a) == TINY.block_size and all(0 <= t < 6 for t in a)  # never BOS


@needs_torch
@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_torch_peer_is_the_same_model(attention: str) -> None:
    import torch

    from benchmarks.bench.torch_peer import TorchGPT

    case = W.Case("train", "tiny", TINY, 3, "float64", "numpy", seed=2)
    params = case.params()
    host = P.host_weights(case, "float64")
    tokens = case.host_tokens()
    want_loss, want = loss_and_grads(params, tokens, np.full(3, TINY.block_size + 1))
    peer = TorchGPT(host, TINY, "float64", attention=attention)
    loss = peer.loss(torch.from_numpy(tokens))
    loss.backward()
    assert loss.item() == pytest.approx(float(want_loss), rel=1e-12)
    np.testing.assert_allclose(peer.wte.grad.numpy(), want.wte, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(peer.lm_head.grad.numpy(), want.lm_head, rtol=1e-9, atol=1e-13)
    for i, (wqkv, _wo, _fc1, fc2) in enumerate(peer.layers):
        qkv = np.concatenate([want.attn_wq[i], want.attn_wk[i], want.attn_wv[i]])
        np.testing.assert_allclose(wqkv.grad.numpy(), qkv, rtol=1e-9, atol=1e-13)
        np.testing.assert_allclose(fc2.grad.numpy(), want.mlp_fc2[i], rtol=1e-9, atol=1e-13)
    before = peer.score(torch.from_numpy(tokens)).numpy()
    peer.opt.step()
    assert not np.allclose(peer.score(torch.from_numpy(tokens)).numpy(), before)
    peer.reset()
    nll = peer.score(torch.from_numpy(tokens)).numpy()
    from microgpt_xp import score

    np.testing.assert_allclose(nll, score(params, tokens, np.full(3, 6)), rtol=1e-12)


@needs_torch
def test_torch_peer_decodes_what_sample_tokens_samples() -> None:
    import torch

    from benchmarks.bench.torch_peer import TorchGPT
    from microgpt_xp.sample import sample_tokens

    cfg = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=6)
    params = init_params(cfg, seed=1, dtype="float64")
    host = {k: np.asarray(v) for k, v in params.arrays().items()}
    ours = sample_tokens(params, 6, 40, seed=9)
    u = torch.from_numpy(np.random.default_rng(9).random((40, cfg.block_size)))
    theirs = TorchGPT(host, cfg, "float64").decode(u, 6).numpy()
    for row_ours, row_theirs in zip(ours, theirs, strict=True):
        stop = list(row_theirs).index(6) + 1 if 6 in row_theirs else cfg.block_size
        assert list(row_ours[:stop]) == list(row_theirs[:stop])


def test_matmul_flops_are_three_forward_passes() -> None:
    cfg = W.CONFIGS["medium"]
    b, t, c, v, L = 32, cfg.block_size, cfg.n_embd, cfg.vocab_size, cfg.n_layer
    n = b * t
    forward = 2 * n * (12 * c * c * L + c * v) + 2 * 2 * b * t * t * c * L
    assert P.matmul_flops(W.Case("score", "medium", cfg, b, "float32", "numpy")) == forward
    assert P.matmul_flops(W.Case("train", "medium", cfg, b, "float32", "numpy")) == 3 * forward
    ops = P.matmul_operands(W.Case("train", "default", W.CONFIGS["default"], 2, "float32", "numpy"))
    assert all(a.dtype == np.float32 and b_.dtype == np.float32 for a, b_ in ops)
    assert all(a.shape[-1] == b_.shape[-2] for a, b_ in ops)


def test_other_cpu_share() -> None:
    before = T.CpuSample(busy=1000, total=5000, own=100, wall=0.0)
    # 200 jiffies of capacity: 60 busy of which 50 ours -> 10 by others = 5 %
    after = T.CpuSample(busy=1060, total=5200, own=150, wall=1.0)
    assert T.other_cpu_share(before, after) == pytest.approx(0.05)
    assert T.other_cpu_share(before, T.CpuSample(1050, 5200, 150, 1.0)) == 0.0
    assert T.other_cpu_share(None, after) is None
    sample = T.cpu_sample()
    if Path("/proc/stat").exists():
        assert sample is not None and sample.total >= sample.busy >= sample.own >= 0


def test_interleave_drops_disturbed_rounds_and_alternates_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    shares = iter([0.0, 0.5, 0.01, 0.9, 0.0, 0.0, 0.0])
    monkeypatch.setattr(T, "other_cpu_share", lambda a, b: next(shares))
    timed = [T.Timed("a", lambda: calls.append("a"), 1), T.Timed("b", lambda: calls.append("b"), 1)]
    rounds = T.interleave(timed, repeats=3, max_other=0.05, max_rounds=10)
    assert rounds.kept == [True, False, True, False, True]
    assert rounds.dropped == 2 and rounds.filtered and len(rounds.kept_seconds()) == 3
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]


def test_interleave_idles_for_the_gap_before_each_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    monkeypatch.setattr(T.time, "sleep", lambda s: events.append(f"sleep {s}"))
    monkeypatch.setattr(T, "other_cpu_share", lambda a, b: 0.0)
    timed = [T.Timed(n, lambda n=n: events.append(n), 1) for n in ("a", "b")]
    T.interleave(timed, repeats=2, gap=0.25)
    assert events == ["sleep 0.25", "a", "sleep 0.25", "b", "sleep 0.25", "b", "sleep 0.25", "a"]
    events.clear()
    T.interleave(timed, repeats=1)  # no gap by default
    assert events == ["a", "b"]


def test_interleave_reports_unfiltered_when_every_round_is_disturbed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(T, "other_cpu_share", lambda a, b: 1.0)
    rounds = T.interleave([T.Timed("a", lambda: None, 1)], repeats=2, max_rounds=3)
    assert rounds.kept == [False] * 3 and not rounds.filtered
    assert len(rounds.kept_seconds()) == 3  # all rounds, flagged as unfiltered


def test_summary_statistics() -> None:
    s = T.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["n"], s["median"], s["min"], s["max"]) == (5, 3.0, 1.0, 5.0)
    assert s["q1"] <= s["median"] <= s["q3"]
    assert math.isnan(T.summary([])["median"])


def test_tune_malloc_runs_in_a_child_process() -> None:
    # mallopt changes the whole process, so try it in a child, not in the test runner
    code = "from microgpt_xp._alloc import tune_malloc; print(tune_malloc())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("True", "False")
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert out.stdout.strip() == "True"
    assert T.minor_faults() >= 0


def test_blas_threads_round_trip() -> None:
    n = T.blas_threads()
    if n is None:
        pytest.skip("NumPy's BLAS thread count cannot be read here")
    try:
        assert T.set_blas_threads(1) and T.blas_threads() == 1
    finally:
        T.set_blas_threads(n)
    assert T.blas_threads() == n


@pytest.mark.needs_jax
def test_the_jax_peer_trains_the_same_model() -> None:
    """The jax peer's first loss is ours on the same weights and batch (so the benchmark
    compares the same work), and a step lowers it."""
    pytest.importorskip("jax")
    import microgpt_xp as mx
    from benchmarks.bench.jax_peer import JaxGPT

    case = W.Case("train", "tiny", TINY, 3, "float64", "jax")
    tokens = case.host_tokens()
    model = JaxGPT(P.host_weights(case, "float64"), TINY, "float64")
    lengths = np.full(tokens.shape[0], tokens.shape[1])
    want, _ = mx.loss_and_grads(case.params(), case.asarray(tokens), case.asarray(lengths))
    first = model.train_step(tokens)
    assert first == pytest.approx(float(want), rel=1e-12)
    assert model.train_step(tokens) < first

"""The harness: rounds and their filter, the CLI end to end with its JSON and tables, the
targets, the A/B of two checkouts, and the profile of our step (by module, not by name)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench import _configs, main
from benchmarks.bench import profiling as B
from benchmarks.bench import timing as T
from benchmarks.bench import workloads as W
from benchmarks.bench.report import render
from microgpt_xp import GPTConfig

TINY = GPTConfig(vocab_size=7, n_layer=2, n_embd=8, n_head=2, block_size=5)
SMALL = ["--config", "L1,C8,H2,T4", "--batch-size", "3", "--decode-batch-size", "2", "--gap", "0"]
SMALL += [
    "--repeats",
    "1",
    "--max-rounds",
    "1",
    "--warmup",
    "1",
    "--min-time",
    "0.001",
    "--no-tune-malloc",
]


def test_interleave_alternates_and_drops_busy_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    shares = iter([0.0, 0.5, 0.01, 0.9, 0.0])
    monkeypatch.setattr(T, "other_cpu_share", lambda a, b: next(shares))
    rounds = T.interleave([T.Timed(n, lambda n=n: calls.append(n)) for n in "ab"], 3, max_rounds=10)
    assert (
        rounds.kept == [True, False, True, False, True]
        and rounds.dropped == 2
        and len(rounds.use()) == 3
    )
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    events: list[str] = []
    monkeypatch.setattr(T.time, "sleep", lambda s: events.append(f"sleep {s}"))
    monkeypatch.setattr(T, "other_cpu_share", lambda a, b: 1.0)
    figures = [T.Figures(n, lambda n=n: events.append(n) or {"s": 1.0}) for n in "ab"]
    rounds = T.interleave(figures, 1, max_rounds=2, gap=0.25)
    assert events == ["sleep 0.25", "a", "sleep 0.25", "b", "sleep 0.25", "b", "sleep 0.25", "a"]
    assert rounds.kept == [False, False] and not rounds.filtered and len(rounds.use()) == 2  # all


def test_calibrate_summary_and_configs() -> None:
    t = T.Timed("sleep", lambda: T.time.sleep(0.002))
    assert T.calibrate(t, 2, 0.02) >= 0.002 and 2 <= t.repeat <= 10
    s = T.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["n"], s["median"], s["min"], s["max"]) == (5, 3.0, 1.0, 5.0) and s["q1"] <= 3 <= s[
        "q3"
    ]
    assert math.isnan(T.summary([])["median"])
    assert W.parse_config("L4,C128,H4,T64") == ("L4,C128,H4,T64,V27", W.CONFIGS["medium"])
    assert W.parse_config("c32l2t8v11")[1] == GPTConfig(11, n_layer=2, n_embd=32, block_size=8)
    with pytest.raises(ValueError, match="unknown config"):
        W.parse_config("big")
    assert [n for n, _ in _configs("default;L2,C32,T8,medium")] == [
        "default",
        "L2,C32,H4,T8,V27",
        "medium",
    ]


def test_tiny_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = [*SMALL, "--workload", "train,score,decode", "--peers", "scalar,matmul"]
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert render(result) == capsys.readouterr().out.rstrip("\n") and "--json" in result["command"]
    report = [sys.executable, "-m", "benchmarks.bench.report"]
    again = subprocess.run([*report, str(tmp_path / "r.json")], capture_output=True, text=True)
    assert again.stdout == render(result) + "\n\n"
    helped = subprocess.run([*report, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "FILE.json" in helped.stdout
    assert (
        result["machine"]["square_matmul_gflops"] > 0 and result["machine"]["malloc_tuned"] is False
    )
    tps = {(r["workload"], r["impl"]): r["tokens_per_s"]["median"] for r in result["results"]}
    skipped = {(s["workload"], s["peer"]) for s in result["skipped"]}
    assert skipped == {("score", "scalar"), ("decode", "scalar"), ("decode", "matmul")}
    assert (
        set(tps)
        == {(w, i) for w in W.WORKLOADS[:3] for i in ("ours[numpy]", "scalar", "matmul")} - skipped
    )
    for r in result["results"]:
        assert r["tokens_per_call"] == (4 if r["impl"] == "scalar" else 4 * r["batch"])
        assert r["rounds_kept"] + r["rounds_dropped"] == 1 and r["tokens_per_s"]["n"] == 1
    for c in result["comparisons"]:  # tokens/s over tokens/s of the same round
        ratio = tps[(c["workload"], "ours[numpy]")] / tps[(c["workload"], c["peer"])]
        assert c["ratio"]["median"] == pytest.approx(ratio, rel=1e-9) and c["target"] is None
        assert c["peer"] != "matmul" or c["matmul_gflops"]["median"] > 0 < c["model_flops_per_call"]
    check_breakdown(result["breakdown"][0])


def test_targets_and_check_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = W.Case("train", "default", W.CONFIGS["default"], 64, "float32", "numpy")
    target = W.target_for(case, "torch")
    assert (
        target
        and target[0] == 2.0
        and "PyTorch eager" in target[1]
        and W.target_for(case, "scalar") is None
    )
    assert W.target_for(dataclasses.replace(case, batch=32), "torch") is None
    assert (
        W.target_for(dataclasses.replace(case, peer_device="cuda:0"), "torch") is None
    )  # CPU only
    argv = [
        *SMALL,
        "--workload",
        "train",
        "--peers",
        "matmul",
        "--no-breakdown",
        "--json",
        str(tmp_path / "r.json"),
    ]
    for minimum, status in ((1e9, 1), (1e-9, 0)):
        key = ("numpy", "train", "L1,C8,H2,T4,V27", 3, "float32", "matmul")
        monkeypatch.setattr(W, "TARGETS", {key: (minimum, "for this test")})
        assert main(argv) == 0 and main([*argv, "--check-targets"]) == status
        (comp,) = json.loads((tmp_path / "r.json").read_text())["comparisons"]
        assert comp["target"] == minimum and comp["meets_target"] is (status == 0)


def test_text_workload_has_its_own_config_and_batch(tmp_path: Path) -> None:
    """``text``: nanoGPT's CPU shape whatever ``--config`` says, 12 windows by default (a
    smaller batch here), every position predicted; its target and medium's."""
    argv = [*SMALL, "--workload", "text,train", "--batch-size", "2", "--peers", "matmul"]
    assert main([*argv, "--no-breakdown", "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    rows = {(r["workload"], r["config_spec"], r["impl"]): r for r in result["results"]}
    text = rows[("text", "L4,C128,H4,T64,V65", "ours[numpy]")]
    assert (text["config"], text["batch"], text["tokens_per_call"]) == ("text", 2, 2 * 64)
    assert ("train", "L1,C8,H2,T4,V27", "ours[numpy]") in rows and len(rows) == 4
    case = W.Case("text", "text", W.CONFIGS["text"], 12, "float32", "numpy")
    assert case.trains and W.target_for(case, "torch")[0] == 1.0  # type: ignore[index]
    medium = W.Case("train", "medium", W.CONFIGS["medium"], 32, "float32", "numpy")
    assert W.target_for(medium, "torch")[0] == 1.05  # type: ignore[index]


def test_ab_and_bad_arguments(capsys: pytest.CaptureFixture) -> None:
    root = str(Path(__file__).resolve().parents[2])
    assert (
        main([*SMALL, "--workload", "train", "--peers", "none", "--no-breakdown", "--ab", root])
        == 0
    )
    assert (
        "| train | L1,C8,H2,T4,V27 | 3x4 | float32 | ours[numpy] / A |" in capsys.readouterr().out
    )
    for argv, error in (
        (["--workload", "x"], "unknown workload"),
        (["--peers", "x"], "unknown peer"),
        (["--gap", "-1"], "--gap must be"),
    ):
        assert main(argv) == 2 and error in capsys.readouterr().err


def check_breakdown(bd: dict[str, Any]) -> None:
    """Rows of the profiled modules, then optim and other, adding up to the step."""
    names = [r["function"] for r in bd["rows"]]
    assert names[-2:] == ["optim", "other"] and len(set(names)) == len(names)
    assert {n.split(".")[0] for n in names[:-2]} == {"layers", "primitives"}, names
    assert sum(r["own_s"] for r in bd["rows"]) == pytest.approx(bd["step_s"], rel=1e-9)
    assert sum(r["share"] for r in bd["rows"]) == pytest.approx(1.0, rel=1e-9)
    for r in bd["rows"][:-1]:
        assert 0 <= r["own_s"] <= r["inclusive_s"] * (1 + 1e-9) and r["calls"] >= 1
    assert bd["rows"][-2]["calls"] == 1 and bd["steps_kept"] + bd["steps_dropped"] >= 1  # Adam.step
    assert bd["upcasts"] == [], bd["dtypes"]


MODULE = """
def outer(n):
    inner(n)
    return sum(i for i in range(n))  # a generator: outer's own time


def inner(n):
    return sum(range(n))
"""


def test_profile_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "benchfake_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import benchfake_mod

    files = B.profiled_files(("benchfake",))
    assert list(files.values()) == ["benchfake_mod"]
    rows, optim, seconds = B.profile_call(
        lambda: [benchfake_mod.outer(20_000) for _ in range(5)], files
    )
    assert set(rows) == {"benchfake_mod.outer", "benchfake_mod.inner"} and optim["calls"] == 0
    outer, inner = rows["benchfake_mod.outer"], rows["benchfake_mod.inner"]
    assert outer["calls"] == inner["calls"] == 5 and seconds >= outer["inclusive_s"]
    assert outer["own_s"] == pytest.approx(outer["inclusive_s"] - inner["inclusive_s"], rel=1e-6)


@pytest.mark.parametrize(
    ("backend", "dtype"), [("numpy", "float32"), ("numpy", "float64"), ("torch", "float32")]
)
def test_breakdown_of_our_step(backend: str, dtype: str) -> None:
    from microgpt_xp import layers

    if backend == "torch":
        pytest.importorskip("torch")
    before = dict(vars(layers))
    bd = B.breakdown(W.Case("train", "tiny", TINY, 3, dtype, backend), steps=2, warmup=1)
    check_breakdown(bd)
    assert (
        any(v == [dtype] for v in bd["dtypes"].values()) and vars(layers) == before
    )  # not patched

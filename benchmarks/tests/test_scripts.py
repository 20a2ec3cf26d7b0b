"""The whole-call measurements of ``benchmarks.e2e``, on tiny settings."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import microgpt_xp as mx
from benchmarks import e2e


def test_train_figures_with_worker_processes() -> None:
    figures = e2e.train_figures(6, docs=mx.default_docs()[:200], batch_size=8, workers=2)
    assert 0 < figures["step"] < figures["first_step"] < figures["total"]


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_compiled_sample(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    e2e.main(
        [
            "compiled",
            "--parts",
            "sample",
            "--samples",
            "20",
            "--rounds",
            "2",
            "--max-other",
            "1",
            "--json",
            str(tmp_path / "c.json"),
        ]
    )
    out = json.loads((tmp_path / "c.json").read_text())["sample"]
    assert len(out["rounds"]) == 2 and out["jax/numpy"]["n"] == 2
    assert "same names on both: True" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="Dask is not installed")
def test_dask_scoring_and_memory(tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("\n".join(mx.default_docs()[:500]) + "\n")
    e2e.main(
        [
            "dask",
            "--n-docs",
            "2000",
            "--chunk-sizes",
            "500,2000",
            "--rounds",
            "1",
            "--memory-docs",
            "1000",
            "--memory-chunk",
            "500",
            "--data",
            str(names),
            "--json",
            str(tmp_path / "d.json"),
        ]
    )
    out = json.loads((tmp_path / "d.json").read_text())
    assert set(out["scoring"]) == {"500", "2000"}
    for s in out["scoring"].values():  # each way's seconds over NumPy's, in the same round
        (m,) = s["rounds"]
        assert set(m) == {"numpy", "threads", "cluster"} and s["numpy"]["s"] == m["numpy"]["s"]
        assert s["cluster/numpy"]["median"] == pytest.approx(m["cluster"]["s"] / m["numpy"]["s"])
    assert {m["way"] for m in out["memory"]} == {"threads", "cluster", "numpy"}
    assert all(m["client_mb"] >= m["client_mb_before"] > 0 for m in out["memory"])


def test_threads_and_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e, "THREAD_CASES", (("L1,C8,H2,T4", 4, 10),))
    tiny = ["--rounds", "1", "--max-other", "1", "--json", str(tmp_path / "out.json")]
    e2e.main(["threads", *tiny])
    out = json.loads((tmp_path / "out.json").read_text())["L1,C8,H2,T4,V27 B=4"]
    assert (
        out["policy"]["threads"] == out["1 thread"]["threads"] == 1
        and out["busy policy/policy"]["n"] == 1
    )
    ck = tmp_path / "ck.npz"
    mx.train(
        e2e.full_docs(8, 64),
        config=mx.GPTConfig(27, n_embd=8, block_size=8),
        steps=20,
        checkpoint=ck,
    )
    e2e.main(
        [
            "sample",
            "--checkpoint",
            str(ck),
            "--samples",
            "30",
            "--batch-sizes",
            "7",
            "--threads",
            "1",
            *tiny,
        ]
    )
    assert json.loads((tmp_path / "out.json").read_text())["same_names"] is True

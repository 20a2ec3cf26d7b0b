"""Micro-benchmarks behind the profiling notes of docs/performance.md: the NumPy
operations our training and decoding steps are made of, on the steps' shapes, and the
alternatives considered. Best of several repeats (the least disturbed), microseconds.

    python benchmarks/micro_ops.py [--json benchmarks/out/micro_ops.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit

import array_api_compat.numpy as xpc
import numpy as np

from microgpt_xp import layers as L
from microgpt_xp._xp import array_namespace

RESULTS: list[dict] = []


def t(group: str, label: str, fn, number: int = 200) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=7)) / number
    RESULTS.append({"group": group, "op": label, "us": best * 1e6})
    print(f"{group:28s} {label:52s} {best * 1e6:9.1f} us")
    return best


FAULTS = """
import resource, numpy as np, sys
from microgpt_xp import GPTConfig, init_params, loss_and_grads
from microgpt_xp.optim import Adam
from microgpt_xp._alloc import tune_malloc
import time
if sys.argv[1] == "1":
    tune_malloc()
p = init_params(GPTConfig(27), dtype="float32")
tok = np.random.default_rng(0).integers(0, 27, (64, 17)); lens = np.full(64, 17)
adam = Adam(p, num_steps=10**9)
for _ in range(20):
    loss, g = loss_and_grads(p, tok, lens); adam.step(p, g)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
best = 1e9
for _ in range(100):
    s = time.perf_counter(); loss, g = loss_and_grads(p, tok, lens); adam.step(p, g)
    best = min(best, time.perf_counter() - s)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 100, best * 1e3)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    f32 = np.float32

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(f32)

    # default config, batch 64: N = B*T = 1024 rows, C = 16, H = 4, D = 4, T = 16, V = 27
    x, s, lg = rand(1024, 16), rand(64, 4, 16, 16), rand(1024, 27)
    g = "reduce last axis (default)"
    t(g, "sum(x*x, -1) (1024,16)", lambda: np.sum(x * x, axis=-1, keepdims=True))
    t(g, "(x*x) @ ones(16,1)", lambda: (x * x) @ np.ones((16, 1), f32))
    t(g, "xp.sum through array_api_compat", lambda: xpc.sum(x * x, axis=-1, keepdims=True))
    t(g, "sum(scores, -1) (64,4,16,16)", lambda: np.sum(s, axis=-1, keepdims=True))
    t(g, "scores @ ones(16,1)", lambda: s @ np.ones((16, 1), f32))
    t(g, "max(scores, -1)", lambda: np.max(s, axis=-1, keepdims=True))
    t(g, "max(scores, -2) (the transposed layout)", lambda: np.max(s, axis=-2, keepdims=True))
    t(g, "ones(1,16) @ scores (sum over -2)", lambda: np.ones((1, 16), f32) @ s)
    t(g, "exp(scores)", lambda: np.exp(s))
    t(g, "max(logits, -1) (1024,27)", lambda: np.max(lg, axis=-1, keepdims=True))
    t(g, "sum(logits, -1)", lambda: np.sum(lg, axis=-1, keepdims=True))
    t(g, "logits @ ones(27,1)", lambda: lg @ np.ones((27, 1), f32))
    t(g, "layers.max_last(scores): max over a relaid copy", lambda: L.max_last(s))
    t(g, "layers.sum_last(x) (two ones columns, 2-d)", lambda: L.sum_last(x))
    lgt = np.ascontiguousarray(lg.T)
    t(g, "max(logits_t, 0) (27,1024): the (V, N) layout", lambda: np.max(lgt, axis=0))
    m = np.max(s, axis=-1, keepdims=True)
    g = "broadcasting (default)"
    t(g, "scores - max (a (...,1) operand)", lambda: s - m)
    t(g, "scores + bias (a (16,16) operand)", lambda: s + s[0, 0])
    t(g, "scores + scores (same shape)", lambda: s + s)

    for name, (b, tt, c, h) in {"default": (64, 16, 16, 4), "medium": (32, 64, 128, 4)}.items():
        d, n = c // h, b * tt
        qkv = rand(n, 3 * c)
        q, k, v = (
            np.transpose(np.reshape(qkv[:, i * c : (i + 1) * c], (b, tt, h, d)), (0, 2, 1, 3))
            for i in range(3)
        )
        kt = np.ascontiguousarray(np.swapaxes(k, -1, -2))
        att = rand(b, h, tt, tt)
        g = f"attention matmuls ({name})"
        t(g, "q @ k.T (k.T a transposed view)", lambda q=q, k=k: q @ np.swapaxes(k, -1, -2), 50)
        t(g, "q @ kT (kT made contiguous)", lambda q=q, kt=kt: q @ kt, 50)
        t(
            g,
            "copy k.T to contiguous (reshape through B*H)",
            lambda k=k, b=b, h=h, d=d, tt=tt: np.reshape(
                np.reshape(np.swapaxes(k, -1, -2), (b * h, d, tt)), (b, h, d, tt)
            ),
            50,
        )
        t(g, "einsum('bhtd,bhsd->bhts')", lambda q=q, k=k: np.einsum("bhtd,bhsd->bhts", q, k), 20)
        t(g, "dy @ v.T (backward datt, view)", lambda v=v: v @ np.swapaxes(v, -1, -2), 50)
        t(
            g,
            "att.T @ dy (first operand a view)",
            lambda att=att, v=v: np.swapaxes(att, -1, -2) @ v,
            50,
        )

    u = rand(1024, 64)
    g = "relu (1024,64)"
    t(g, "x * astype(x > 0) (the cached mask)", lambda: u * (u > 0).astype(f32))
    t(g, "where(x > 0, x, 0)", lambda: np.where(u > 0, u, 0))
    t(g, "maximum(x, 0)", lambda: np.maximum(u, 0))

    ids, wte = rng.integers(0, 27, 1024), rand(27, 16)
    classes = np.arange(27)
    g = "embedding (1024 ids, V=27)"
    t(g, "one-hot build + matmul (ours)", lambda: (ids[:, None] == classes).astype(f32) @ wte)
    t(
        g,
        "one-hot build only (needed by the backward)",
        lambda: (ids[:, None] == classes).astype(f32),
    )
    t(g, "take(wte, ids)", lambda: np.take(wte, ids, axis=0))

    g = "namespace lookup"
    t(
        g,
        "array_api_compat.array_namespace",
        lambda: __import__("array_api_compat").array_namespace(x, wte),
        2000,
    )
    t(g, "microgpt_xp._xp.array_namespace (cached)", lambda: array_namespace(x, wte), 2000)

    kv, kn = rand(1024, 4, 15, 4), rand(1024, 4, 1, 4)
    probs = np.abs(lg)
    g = "decode step (1024 sequences)"
    t(g, "KV concat at pos 15, (B,H,pos,D) layout", lambda: np.concatenate([kv, kn], axis=2))
    kp, knp = rand(15, 1024, 16), rand(1, 1024, 16)
    t(g, "KV concat at pos 15, (pos,B,C) layout", lambda: np.concatenate([kp, knp], axis=0))
    qd = rand(1024, 4, 1, 4)
    t(g, "scores: 4,096 (1,4)@(4,16) matmuls", lambda: qd @ np.swapaxes(kv, -1, -2))
    kc16, qc = rand(16, 16, 1024), rand(16, 1024)
    t(g, "KV concat at pos 15, (pos,C,B) layout", lambda: np.concatenate([kc16[:15], kc16[:1]]))
    t(g, "layers.decode_attention at pos 16 (whole)", lambda: L.decode_attention(qc, kc16, kc16, 4))
    sc = rand(1024, 4, 1, 16)
    t(g, "max over 16 keys, (B,H,1,P) layout", lambda: np.max(sc, axis=-1, keepdims=True))
    sp = rand(16, 1024, 4)
    t(g, "max over 16 keys, (P,B,H) layout", lambda: np.max(sp, axis=0))
    t(g, "cumulative_sum(probs, -1) (choose)", lambda: np.cumsum(probs, axis=-1))
    t(g, "probs @ triu(ones(27,27)) (same sums)", lambda: probs @ np.triu(np.ones((27, 27), f32)))

    # a row's sum must not depend on the batch it comes in (Dask chunks, batch sizes)
    big = rand(1000, 16)
    for cols in (1, 2):
        ones = np.ones((16, cols), f32)
        full = (big @ ones)[:, 0]
        differ = sum(
            int(((big[i : i + n] @ ones)[:, 0] != full[i : i + n]).sum())
            for n in (1, 7, 64, 333)
            for i in range(0, 1000, n)
        )
        print(f"{'batch invariance':28s} {f'(1000,16) @ ones(16,{cols}): rows that change':52s} {differ:9d}")
        RESULTS.append({"group": "batch invariance", "op": f"ones(16,{cols})", "rows_changed": differ})

    x32 = rand(4, 4)
    dt = {
        "x * 0.5": (x32 * 0.5).dtype,
        "1.0 / astype(n, float32)": (1.0 / np.arange(1, 3).astype(f32)).dtype,
        "x ** -0.5": (np.abs(x32) ** -0.5).dtype,
    }
    print("dtypes with Python-float scalars (NEP 50):", {k: str(v) for k, v in dt.items()})
    for tuned in ("0", "1"):
        out = subprocess.run(
            [sys.executable, "-c", FAULTS, tuned], capture_output=True, text=True, check=True
        )
        faults, best = (float(v) for v in out.stdout.split())
        label = "tuned (mallopt)" if tuned == "1" else "default malloc"
        print(
            f"{'page faults (train default)':28s} {label:52s} {faults:6.0f} faults/step, best {best:.3f} ms/step"
        )
        RESULTS.append(
            {"group": "page faults", "op": label, "faults_per_step": faults, "best_step_ms": best}
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()

"""What the ONNX tests share (test_export, test_graphs, test_browser): loading an example
as a module, onnxruntime sessions and batches of names."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import microgpt_xp as mx

ROOT = Path(__file__).resolve().parent.parent


def load_module(path: Path, name: str) -> Any:
    """The Python file ``path`` (a script of examples/) loaded as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def session(model: Any) -> Any:
    """An onnxruntime CPU session, one thread, of an ``onnx.ModelProto`` or a file."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    source = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def run(sess: Any, feed: dict[str, Any]) -> dict[str, Any]:
    """``sess``'s outputs on ``feed``, by name."""
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feed), strict=True))


def name_batches(sizes: Sequence[int], block_size: int, seed: int) -> list[tuple[Any, Any]]:
    """Batches ``(tokens, lengths)`` of the default names, one of each size in ``sizes``:
    rows ``BOS, name, BOS`` cut at ``block_size + 1``, padded with 0 to the longest."""
    docs = mx.default_docs()
    tok = mx.Tokenizer.from_docs(docs)
    rng = np.random.default_rng(seed)
    out = []
    for b in sizes:
        rows = [[tok.bos, *tok.encode(docs[i]), tok.bos][: block_size + 1]
                for i in rng.integers(0, len(docs), b)]  # fmt: skip
        t = max(len(r) for r in rows)
        tokens = np.array([r + [0] * (t - len(r)) for r in rows], dtype=np.int64)
        out.append((tokens, np.array([len(r) for r in rows], dtype=np.int64)))
    return out

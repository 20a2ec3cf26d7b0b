"""Serve the microgpt_xp web page on 127.0.0.1: samples names from a checkpoint and trains
a fresh model of the same architecture in the browser, with onnxruntime-web.

    cd examples/web && npm ci            # once: onnxruntime-web, pinned by package-lock.json
    python examples/web/serve.py [CHECKPOINT] [--port 8000] [--data names.txt]

Without a checkpoint, the page samples an untrained default model. The graphs are
exported at start into a temporary folder (removed when the server stops, Ctrl-C):

- ``model/generate.onnx``: the checkpoint's weights, sampling a whole batch in one call;
- ``model/train_step.onnx``: one Adam step (every piece of state an input and a ``new_``
  output);
- ``model/train_init.onnx``: no inputs; its outputs are the initial state, a fresh model
  (``init_params(config, seed)``) and ``adam_init``'s state, so a run starts from scratch;
- ``model/meta.json``: the tokenizer's characters, ``block_size``, the corpus (the
  embedded names, or ``--data``) and the optimizer's settings.

The server binds 127.0.0.1 only, serves the page, onnxruntime-web's files from
``node_modules`` and the exported model, with the headers that let onnxruntime-web use
threads (cross-origin isolation). Nothing is fetched from the network.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import http.server
import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ORT_DIST = HERE / "node_modules" / "onnxruntime-web" / "dist"
TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
         ".onnx": "application/octet-stream", ".json": "application/json"}  # fmt: skip


def write_model(
    folder: Path,
    params: Any,
    tokenizer: Any,
    docs: list[str],
    *,
    seed: int = 0,
    num_steps: int = 1000,
) -> Path:
    """Export the page's graphs and metadata into ``folder`` (see the module); returns it."""
    import microgpt_xp as mx

    params = params.to("numpy", dtype="float32")
    fresh = mx.init_params(params.config, seed=seed, dtype="float32")
    hp = mx.AdamConfig(num_steps=num_steps)
    for graph, weights in [("generate", params), ("train_step", fresh), ("train_init", fresh)]:
        mx.export_onnx(weights, folder / f"{graph}.onnx", graph=graph, tokenizer=tokenizer,
                       optimizer=hp if graph.startswith("train") else None)  # fmt: skip
    cfg = params.config
    meta = {
        "chars": tokenizer.to_dict()["chars"],
        "bos": tokenizer.bos,
        "block_size": cfg.block_size,
        "vocab_size": cfg.vocab_size,
        "config": cfg.to_dict(),
        "optimizer": dataclasses.asdict(hp),
        "docs": docs,
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


class Handler(http.server.SimpleHTTPRequestHandler):
    """The page's files, ``/ort/`` from onnxruntime-web's ``dist``, ``/model/`` from the
    export folder; cross-origin isolation headers; quiet."""

    model_dir: Path = HERE

    def translate_path(self, path: str) -> str:
        clean = path.split("?", 1)[0].split("#", 1)[0]
        for prefix, root in (("/ort/", ORT_DIST), ("/model/", self.model_dir)):
            if clean.startswith(prefix):
                rel = clean[len(prefix) :]
                target = (root / rel).resolve()
                if root.resolve() not in target.parents:
                    return str(root / "__nowhere__")
                return str(target)
        return super().translate_path(path)

    def guess_type(self, path: Any) -> str:
        return TYPES.get(Path(str(path)).suffix) or super().guess_type(path)

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(model_dir: Path, port: int = 0) -> Iterator[str]:
    """A server of the page on 127.0.0.1 (``port=0``: a free one) in a thread; yields
    its URL and stops it on exit."""
    if not ORT_DIST.is_dir():
        raise FileNotFoundError(f"{ORT_DIST} is missing: run `npm ci` in {HERE}")
    handler = type("PageHandler", (Handler,), {"model_dir": Path(model_dir)})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(handler, directory=str(HERE))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", nargs="?", help="a microgpt-xp checkpoint (default: none)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--data", help="a text file of documents, one a line (default: the names)")
    ap.add_argument("--seed", type=int, default=0, help="the fresh model's seed")
    ap.add_argument("--steps", type=int, default=1000, help="the learning rate's decay length")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent.parent))
    import microgpt_xp as mx

    docs = mx.read_docs(args.data) if args.data else mx.default_docs()
    if args.checkpoint:
        ckpt = mx.load(args.checkpoint)
        params, tokenizer = ckpt.params, ckpt.tokenizer or mx.Tokenizer.from_docs(docs)
    else:
        tokenizer = mx.Tokenizer.from_docs(docs)
        params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size), seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="microgpt-web-") as tmp:
        folder = write_model(Path(tmp), params, tokenizer, docs, seed=args.seed,
                             num_steps=args.steps)  # fmt: skip
        with serving(folder, args.port) as url:
            print(f"serving {url} (127.0.0.1 only); Ctrl-C stops", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The web page's **Train** button timed in headless Debian Chromium: ``--steps`` steps
(default 1,000, the page's) of 32 names of the default model, from a fresh model each
run, through onnxruntime-web and the exported ``train_step`` graph; the page served by
``examples/web/serve.py`` on 127.0.0.1. Needs what ``tests/test_browser.py`` needs
(``/usr/bin/chromium``, Playwright's Python package, ``npm ci`` in examples/web).

    python -m benchmarks.web_train [--runs 3] [--steps 1000]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import microgpt_xp as mx

WEB = Path(__file__).resolve().parents[1] / "examples" / "web"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    spec = importlib.util.spec_from_file_location("web_serve", WEB / "serve.py")
    assert spec is not None and spec.loader is not None
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    docs = mx.default_docs()
    tokenizer = mx.Tokenizer.from_docs(docs)
    params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size), seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = serve.write_model(Path(tmp) / "model", params, tokenizer, docs, seed=0,
                                   num_steps=args.steps)  # fmt: skip
        with serve.serving(folder) as url, sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(Path(tmp) / "profile"), executable_path="/usr/bin/chromium", args=ARGS,
                headless=True,
            )  # fmt: skip
            page = browser.new_page()
            page.goto(url)
            page.evaluate("window.microgpt.ready.then(() => true)")
            print(page.text_content("#status"))
            done = f"step {args.steps} / {args.steps}"
            for run in range(args.runs):
                start = time.perf_counter()
                page.click("#train")
                page.wait_for_function(
                    f"() => document.getElementById('train-status').textContent"
                    f".startsWith({done!r})",
                    timeout=600_000,
                )
                seconds = time.perf_counter() - start
                print(f"run {run + 1}: {seconds:.1f} s ({page.text_content('#train-status')})")
                page.wait_for_function("() => !document.getElementById('train').disabled")
            browser.close()


if __name__ == "__main__":
    main()

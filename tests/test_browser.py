"""The web page (examples/web/) in a real browser: Debian's Chromium, headless, driven by
Playwright's Python package through the system executable (no browser download), the page
served on 127.0.0.1 by the example's own server.

Skips cleanly without chromium, without the playwright package or without
``examples/web/node_modules`` (``npm ci`` there). ``MICROGPT_XP_SCREENSHOT=path.png``
keeps the trained page's screenshot (for the docs)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_testing import ROOT, load_module, name_batches

import microgpt_xp as mx
from microgpt_xp.sample import row_uniforms

WEB = ROOT / "examples" / "web"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytest.importorskip("ndonnx")
pytest.importorskip("onnx")
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed", allow_module_level=True)
if importlib.util.find_spec("playwright") is None:
    pytest.skip("the playwright package is not installed", allow_module_level=True)
if not (WEB / "node_modules" / "onnxruntime-web" / "dist").is_dir():
    pytest.skip("examples/web/node_modules is missing (npm ci)", allow_module_level=True)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
NUM_STEPS = 1000  # the page's learning-rate decay


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Any:
    docs = mx.default_docs()
    tokenizer = mx.Tokenizer.from_docs(docs)
    params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size), seed=1)
    serve = load_module(WEB / "serve.py", "microgpt_web_serve")
    folder = serve.write_model(tmp_path_factory.mktemp("model"), params, tokenizer, docs,
                               seed=0, num_steps=NUM_STEPS)  # fmt: skip
    return serve, folder, params, tokenizer, docs


@pytest.fixture(scope="module")
def page(setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from playwright.sync_api import sync_playwright

    serve, folder = setup[0], setup[1]
    profile = tmp_path_factory.mktemp("chromium-profile")
    with serve.serving(folder) as url, sync_playwright() as pw:
        # a fresh profile (--user-data-dir, which Playwright sets from user_data_dir)
        browser = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=ARGS, headless=True
        )
        try:
            pg = browser.new_page()
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(url)
            pg.evaluate("window.microgpt.ready.then(() => true)")
            assert not errors, errors
            yield pg
        finally:
            browser.close()


def test_sample_equals_mx_sample(setup: Any, page: Any) -> None:
    _, _, params, tokenizer, _ = setup
    n, width = 200, params.config.block_size
    for seed, temperature in [(3, 0.5), (4, 1.0)]:
        u = row_uniforms(seed, 0, n, width).astype(np.float32)
        got = page.evaluate(
            "([u, t]) => window.microgpt.sample({uniforms: u, temperature: t})",
            [u.tolist(), temperature],
        )
        want = mx.sample(params, tokenizer, n, seed=seed, temperature=temperature)
        assert got == want


def test_train_gives_numpy_losses(setup: Any, page: Any) -> None:
    cfg = setup[2].config
    batches = name_batches([8] * 50, cfg.block_size, seed=7)
    got = page.evaluate(
        "([t, l]) => window.microgpt.train({tokens: t, lengths: l})",
        [[t.tolist() for t, _ in batches], [n.tolist() for _, n in batches]],
    )
    p = mx.init_params(cfg, seed=0, dtype="float32")
    state = mx.adam_init(p)
    want = []
    for tokens, lengths in batches:
        p, state, loss = mx.train_step(p, state, tokens, lengths, num_steps=NUM_STEPS)
        want.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_buttons_sample_and_train(page: Any, tmp_path: Path) -> None:
    page.click("#sample")
    page.wait_for_function("document.querySelectorAll('#names li').length === 20")
    page.fill("#steps", "60")
    page.click("#train")
    page.wait_for_function("window.microgpt.lastLosses && window.microgpt.lastLosses.length === 60",
                           timeout=120_000)  # fmt: skip
    losses = page.evaluate("window.microgpt.lastLosses")
    assert np.mean(losses[-10:]) < np.mean(losses[:10])
    shot = Path(os.environ.get("MICROGPT_XP_SCREENSHOT") or tmp_path / "page.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0

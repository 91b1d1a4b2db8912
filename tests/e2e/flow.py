"""The default flow of the app by clicking, step by step: what the browser test runs and what
``scripts/screenshots.py`` runs to make the documentation's screenshots.

Settings are small for a shared CPU (influence on 8 x 64 tokens, the default 32 x 128 calibration
tokens, 1024 evaluation tokens). Each step takes the page and the folder its screenshot goes to, and
expects the state the steps before it left (one browser session, as a user would click through it).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")  # Debian's; never `playwright install` (it downloads browsers)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 15 * 60 * 1000  # a calibration or evaluation on a busy shared CPU
ACTION_TIMEOUT_MS = 60 * 1000  # a click or a fill
MAX_SHOT_HEIGHT = 8000  # pixels: a taller page is cut there


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, limit_s: float = 120) -> None:
    """Poll /_stcore/health until it answers ok (or the server dies)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"streamlit did not become healthy at {url}")


@contextmanager
def served_app(environment: dict | None = None, pids: list | None = None) -> Iterator[str]:
    """``streamlit run app.py`` headless on a free loopback port (full app, offline); yields its URL.
    ``environment``: variables set for the server (a deployment, a results folder); ``pids`` gets its pid."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("GHOSTED_DEMO", None)
    env.pop("GHOSTED_DEPLOY", None)
    env.update(environment or {})
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
           f"--server.port={port}", "--server.address=127.0.0.1", "--browser.gatherUsageStats=false",
           "--server.fileWatcherType=none"]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if pids is not None:
        pids.append(server.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server)
        yield url
    finally:
        stop(server)


def stop(server: subprocess.Popen, grace_s: float = 20) -> None:
    """Ask the server to end, and end it if it has not within ``grace_s`` seconds."""
    server.terminate()
    try:
        server.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        server.kill()


def wait_idle(page) -> None:
    """Wait until the connected app has finished its script run."""
    page.wait_for_selector("[data-testid='stApp'][data-test-connection-state='CONNECTED']"
                           "[data-test-script-state='notRunning']", timeout=RUN_TIMEOUT_MS)


def screenshot(page, folder: Path, name: str) -> Path:
    """Save ``folder/<name>.png`` of the whole page.

    Streamlit scrolls an inner container, so a full-page screenshot only holds the viewport: the
    viewport is stretched to the content's height for the shot, then restored.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    size = page.viewport_size
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": size["width"], "height": min(max(size["height"], height + 40), MAX_SHOT_HEIGHT)})
    page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)
    return path


def open_app(browser, url: str):
    """A new browser context and tab on the app, sized for the screenshots; (context, page)."""
    context = browser.new_context(viewport={"width": 1280, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(ACTION_TIMEOUT_MS)
    expect.set_options(timeout=ACTION_TIMEOUT_MS)  # results of a run: RUN_TIMEOUT_MS, explicitly
    page.goto(url)
    wait_idle(page)
    return context, page


def go(page, title: str) -> None:
    page.get_by_role("link", name=title, exact=True).first.click()
    expect(page.locator("h1").first).to_contain_text(title.split(" ")[0])
    wait_idle(page)


def fill(page, key: str, value) -> None:
    box = page.locator(f".st-key-{key} input")
    box.fill(str(value))
    box.press("Tab")


def click(page, key: str) -> None:
    page.locator(f".st-key-{key} button").click()


def click_bar(page, bar) -> None:
    """Click a bar just above the x axis (bars on a log axis reach far below the visible plot)."""
    box = bar.bounding_box()
    plot = page.locator(".st-key-influence_bars .nsewdrag").bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, plot["y"] + plot["height"] - 4)


def sidebar(page):
    return page.get_by_test_id("stSidebar")


def model_page(page, shots: Path) -> None:
    expect(page.locator("h1").first).to_have_text("Model")
    expect(page.get_by_test_id("stMetric").filter(has_text="Layers")).to_contain_text("30")
    expect(sidebar(page)).to_contain_text("SmolLM2-135M-Instruct")
    expect(sidebar(page)).to_contain_text("cpu")
    screenshot(page, shots, "model")


def influence_click_and_preset(page, shots: Path) -> None:
    go(page, "Influence")
    fill(page, "influence_calib_seqs", 8)
    fill(page, "influence_seq_len", 64)
    click(page, "influence_run")
    bars = page.locator(".st-key-influence_bars .trace.bars .point path")
    expect(bars).to_have_count(30, timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    click_bar(page, bars.nth(24))
    expect(sidebar(page)).to_contain_text("Layers to drop: 24 (1 of 30 layers")
    wait_idle(page)
    page.locator(".st-key-influence_preset").click()
    page.get_by_role("option", name="Streamline block of n").click()
    click(page, "influence_apply")
    expect(sidebar(page)).to_contain_text(re.compile(r"Layers to drop: \d+-\d+ \(6 of 30 layers"))
    expect(page.get_by_text("streamline_cosine (LLM-Streamline): block")).to_be_visible()
    wait_idle(page)
    screenshot(page, shots, "influence")


def calibrate_and_recover(page, shots: Path) -> None:
    go(page, "Calibrate & recover")
    click(page, "calibrate_run")  # the defaults: 32 x 128 tokens (+4 held-out), ghost-auto, ghost, replaceme-ls
    expect(page.get_by_text(re.compile(r"^Run: layers"))).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    expect(page.get_by_test_id("stDataFrame")).to_be_visible()
    expect(sidebar(page)).to_contain_text("Recovered: pruned, ghost-auto, ghost, replaceme-ls")
    screenshot(page, shots, "recover")


def compare(page, shots: Path) -> None:
    go(page, "Compare")
    fill(page, "eval_tokens", 1024)
    fill(page, "eval_seq_len", 256)
    click(page, "evaluate_run")
    expect(page.get_by_text("Protocol")).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    fill(page, "new_tokens", 12)
    click(page, "generate_run")
    expect(page.get_by_text("The capital of France is", exact=True).last).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    for title in ("Perplexity (lower is better", "removed (1 = perfect", "Singular values of the discrepancy"):
        expect(page.locator(".gtitle", has_text=title).first).to_be_visible()
    screenshot(page, shots, "compare")


def export(page, shots: Path) -> None:
    go(page, "Export")
    expect(page.get_by_role("button", name="Recipe (JSON)")).to_be_visible()
    expect(page.get_by_role("button", name="Download the model (zip)")).to_be_visible()
    screenshot(page, shots, "export")


def learn(page, shots: Path) -> None:
    go(page, "Learn")
    expect(page.get_by_text(re.compile("perplexity goes from"))).to_be_visible()
    expect(page.get_by_text(re.compile("the attention sink"))).to_be_visible()
    # layers, spectra, removed, frontier (the Compare page evaluated the run), positions, sink spectra
    expect(page.locator(".js-plotly-plot")).to_have_count(6)
    expect(page.locator(".gtitle", has_text="Recovery frontier")).to_be_visible()
    expect(page.locator(".gtitle", has_text="by position in the window")).to_be_visible()
    screenshot(page, shots, "learn")


STEPS = (model_page, influence_click_and_preset, calibrate_and_recover, compare, export, learn)  # in order
SHOTS = ("model", "influence", "recover", "compare", "export", "learn")  # the files the steps write


def run_flow(page, shots: Path) -> None:
    """Every step in order on one tab just opened on the app; the screenshots go to ``shots``."""
    for step in STEPS:
        step(page, shots)

"""A real browser against a real server: ``streamlit run app.py`` on a free loopback port, driven by
Debian's chromium through pytest-playwright (never ``playwright install``: it downloads browsers)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 15 * 60 * 1000  # a calibration or evaluation on a busy shared CPU
ACTION_TIMEOUT_MS = 60 * 1000  # a click or a fill


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


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_FLAGS}


@pytest.fixture(scope="session")
def app_url():
    """The app served headless by a subprocess for the whole session."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("GHOSTED_DEMO", None)
    env.pop("GHOSTED_DEPLOY", None)
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
           f"--server.port={port}", "--server.address=127.0.0.1", "--browser.gatherUsageStats=false",
           "--server.fileWatcherType=none"]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


@pytest.fixture(scope="module")
def app_page(browser, app_url):
    """One browser tab kept for a whole module (the flow's state lives in the session)."""
    context = browser.new_context(viewport={"width": 1280, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(ACTION_TIMEOUT_MS)
    expect.set_options(timeout=ACTION_TIMEOUT_MS)  # results of a run: RUN_TIMEOUT_MS, explicitly
    page.goto(app_url)
    wait_idle(page)
    yield page
    context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Remember each phase's outcome on the test item (for the screenshot on failure)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _screenshot_on_failure(request):
    """A failing browser test leaves test-results/<test>.png showing what the page looked like."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed and "app_page" in request.fixturenames:
        out = ROOT / "test-results"
        out.mkdir(exist_ok=True)
        request.getfixturevalue("app_page").screenshot(path=str(out / f"{request.node.name}.png"))


def wait_idle(page) -> None:
    """Wait until the connected app has finished its script run."""
    page.wait_for_selector("[data-testid='stApp'][data-test-connection-state='CONNECTED']"
                           "[data-test-script-state='notRunning']", timeout=RUN_TIMEOUT_MS)


def screenshot(page, name: str) -> Path:
    """Save docs/screenshots/<name>.png of the whole page.

    Streamlit scrolls an inner container, so a full-page screenshot only holds the viewport: the
    viewport is stretched to the content's height for the shot, then restored.
    """
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    size = page.viewport_size
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": size["width"], "height": min(max(size["height"], height + 40), 8000)})
    page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)
    return path

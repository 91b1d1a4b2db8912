"""A real browser against a real server: ``streamlit run app.py`` on a free loopback port, driven by
Debian's chromium through pytest-playwright (never ``playwright install``: it downloads browsers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.flow import (ACTION_TIMEOUT_MS, CHROMIUM, CHROMIUM_FLAGS, RUN_TIMEOUT_MS, _free_port,  # noqa: F401
                            _wait_healthy, open_app, served_app, stop, wait_idle)

ROOT = Path(__file__).resolve().parents[2]


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
    with served_app() as url:
        yield url


@pytest.fixture(scope="module")
def app_page(browser, app_url):
    """One browser tab kept for a whole module (the flow's state lives in the session)."""
    context, page = open_app(browser, app_url)
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

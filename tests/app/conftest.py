"""AppTest fixtures: the app from its entrypoint, with caches cleared between tests.

Streamlit caches are process-global, so without clearing them a model or result cached by one test
would leak into the next one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import streamlit as st
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["model", "influence", "recover", "compare", "export", "learn"]
TIMEOUT = 600  # seconds per script run: the CPU is shared, calibration and evaluation are real


def serve_navigation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run pages the way a running server does once app.py has called ``st.navigation``.

    AppTest re-detects the ``pages/`` folder on every run and would start each run in Streamlit's
    legacy pages mode, the mode of only the very first request after a server start (covered by
    the tests marked ``legacy_pages``).
    """
    original = PagesManager.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", init)


@pytest.fixture(autouse=True)
def _served_navigation(request, monkeypatch):
    if not request.node.get_closest_marker("legacy_pages"):
        serve_navigation(monkeypatch)


@pytest.fixture(autouse=True)
def _clear_caches():
    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def app(monkeypatch):
    """A fresh app session on a workstation deployment (no demo environment inherited)."""
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.delenv("GHOSTED_DEPLOY", raising=False)
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()


def open_page(at: AppTest, name: str) -> AppTest:
    return at.switch_page(f"pages/{name}.py").run()


def figures(at: AppTest) -> list[dict]:
    """The Plotly figures on the page, as JSON (AppTest does not model charts)."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def calibrate(at: AppTest, layers: list[int], methods: list[str], n: int = 4, length: int = 64,
              heldout: int = 2) -> AppTest:
    """Select ``layers`` and run a small calibration on the Calibrate & recover page."""
    at.session_state["ghosted.selection"] = layers
    open_page(at, "recover")
    at.number_input(key="calib_n").set_value(n)
    at.number_input(key="calib_len").set_value(length)
    at.number_input(key="calib_heldout").set_value(heldout)
    at.multiselect(key="calib_methods").set_value(methods)
    return at.button(key="calibrate_run").click().run()


def pytest_configure(config):
    config.addinivalue_line("markers", "legacy_pages: run AppTest in Streamlit's first-request pages mode")

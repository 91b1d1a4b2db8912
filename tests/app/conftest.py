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

from ghosted.service.jobs import JobQueue

ROOT = Path(__file__).resolve().parents[2]
QUEUED_SUBMIT = JobQueue.submit  # the queue's own submit (returns at once)
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
def _clear_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("GHOSTED_RESULTS", str(tmp_path / "results"))  # each test's own shared store on disk
    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture(autouse=True, scope="package")
def _jobs_end_before_the_page_draws():
    """Queue a job and wait for it in the same script run, so a test reads its result on the next
    element (the browser instead polls). For the whole of tests/app (and only there: the unit tests of
    the queue see it as it is), so module-scoped flows get it too; tests marked
    ``async_jobs`` see the queue as it is (``_async_jobs``)."""
    def submit_and_wait(self, key, kind, work, owner, **options):
        status = QUEUED_SUBMIT(self, key, kind, work, owner, **options)
        return status if status.finished else self.wait(key)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JobQueue, "submit", submit_and_wait)
        yield


@pytest.fixture(autouse=True, scope="module")
def _fresh_backend_per_module():
    """Each test module starts with an empty job queue and result store (a module's tests share them)."""
    from pages import _ui

    _ui._BACKEND = None
    yield
    _ui._BACKEND = None


@pytest.fixture
def fresh_backend():
    """An empty job queue and result store for this test alone."""
    from pages import _ui

    _ui._BACKEND = None
    yield
    _ui._BACKEND = None


@pytest.fixture(autouse=True)
def _async_jobs(request, monkeypatch):
    if request.node.get_closest_marker("async_jobs"):
        monkeypatch.setattr(JobQueue, "submit", QUEUED_SUBMIT)


def run_of(at: AppTest):
    """The session's fitted run with its measurements, as its pages see it (None before a run)."""
    from pages import _ui

    fit = at.session_state[_ui.RUN] if _ui.RUN in at.session_state else None
    fitted = _ui.backend().store.get(fit.key()) if fit is not None else None
    if fitted is None:
        return None
    measured = {field: _ui.backend().store.get(at.session_state[name].key()) for name, field in _ui.MEASURED.items()
                if name in at.session_state and at.session_state[name] is not None
                and at.session_state[name].fit == fit}
    return fitted.with_results(**{k: v for k, v in measured.items() if v is not None})


def influence_of(at: AppTest):
    """The session's influence result (report and protocol), or None."""
    from pages import _ui

    request = at.session_state[_ui.INFLUENCE] if _ui.INFLUENCE in at.session_state else None
    return None if request is None else _ui.backend().store.get(request.key())


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
    at.number_input(key="calib_seqs").set_value(n)
    at.number_input(key="seq_len").set_value(length)
    at.number_input(key="heldout_seqs").set_value(heldout)
    at.multiselect(key="methods").set_value(methods)
    return at.button(key="calibrate_run").click().run()


def pytest_configure(config):
    config.addinivalue_line("markers", "legacy_pages: run AppTest in Streamlit's first-request pages mode")
    config.addinivalue_line("markers", "async_jobs: jobs run in the queue's workers while the page draws")

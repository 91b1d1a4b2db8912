"""Every page renders without an exception, before and without any run."""

import pytest

from streamlit.testing.v1 import AppTest

from tests.app.conftest import PAGES, ROOT, TIMEOUT, no_exception, open_page


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(app, page):
    open_page(app, page)
    no_exception(app)
    assert app.title, f"{page} rendered no title"
    badge = " ".join(s.value for s in app.sidebar.success)
    assert "SmolLM2-135M-Instruct" in badge and "cpu" in badge and "30 layers" in badge


@pytest.mark.parametrize("page", ["compare", "export", "learn"])
def test_pages_without_run_point_to_calibration(app, page):
    open_page(app, page)
    assert any("calibrat" in i.value.lower() for i in app.info)


@pytest.mark.legacy_pages
@pytest.mark.parametrize("page", ["influence", "compare"])
def test_deep_link_on_a_fresh_server_runs_inside_the_frame(monkeypatch, page):
    """The first request after a start may name a page: it still gets app.py's navigation and badge."""
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.switch_page(f"pages/{page}.py").run()
    no_exception(at)
    assert at.title[0].value.lower().startswith(page)
    assert any("SmolLM2-135M-Instruct" in s.value for s in at.sidebar.success)


def test_the_loaded_model_is_out_of_the_collectors_sight(app):
    """Once the shared model is loaded its objects are frozen (ghosted.core.heap), so the collections of
    many waiting pages stay cheap; releasing the model (the fixture clears the cache) thaws them."""
    import gc

    open_page(app, "model")
    no_exception(app)
    assert gc.get_freeze_count() > 100_000  # the model and its libraries: hundreds of thousands of objects


def test_each_page_run_is_in_the_operators_page_log(app, monkeypatch, tmp_path):
    """With $GHOSTED_PAGE_LOG set, every page run is one JSON line with the page and the server's seconds."""
    import json

    log = tmp_path / "pages.jsonl"
    monkeypatch.setenv("GHOSTED_PAGE_LOG", str(log))
    open_page(app, "model")
    no_exception(app)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and lines[-1]["page"] == "Model" and lines[-1]["seconds"] >= 0

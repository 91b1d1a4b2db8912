"""Every page renders without an exception, before and without any run."""

import pytest

from tests.app.conftest import PAGES, no_exception, open_page


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(app, page):
    open_page(app, page)
    no_exception(app)
    assert app.title, f"{page} rendered no title"
    badge = app.session_state["ghosted.model_info"]  # what the sidebar badge shows (see tests/e2e)
    assert "SmolLM2-135M-Instruct" in badge["name"] and badge["device"] == "cpu" and badge["layers"] == 30


@pytest.mark.parametrize("page", ["compare", "export", "learn"])
def test_pages_without_run_point_to_calibration(app, page):
    open_page(app, page)
    assert any("calibrat" in i.value.lower() for i in app.info)

"""The default flow by clicking, in chromium: every page works, in one test that needs no other.

The steps (``tests/e2e/flow.py``) run in order on one tab opened for this test; each page's
screenshot goes to a temporary folder (``scripts/screenshots.py`` makes the documentation's copies).
"""

from tests.e2e.flow import SHOTS, run_flow


def test_default_flow_on_every_page(app_page, tmp_path):
    run_flow(app_page, tmp_path)
    for name in SHOTS:
        shot = tmp_path / f"{name}.png"
        assert shot.stat().st_size > 0, f"no screenshot of the {name} page"

"""Two browser sessions at once on one server: the second gets the first's run from the shared store.

Both open the same link (a teacher's link: layers, methods and a small calibration in the query parameters)
at the same time. The run is computed once: both Calibrate & recover pages show the very same run, down to
its measured wall time and "statistics computed" (a second computation would show another time, or
statistics "reused" from the disk cache).
"""

import re

from playwright.sync_api import expect

from tests.e2e.conftest import ACTION_TIMEOUT_MS, RUN_TIMEOUT_MS, wait_idle

LINK = "?layers=20-21&methods=ghost&n=8&len=64&heldout=2"


def open_tab(browser, url: str):
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    page.set_default_timeout(ACTION_TIMEOUT_MS)
    page.goto(url)
    return context, page


def run_caption(page) -> str:
    page.get_by_role("link", name="Calibrate & recover", exact=True).first.click()
    expect(page.get_by_text(re.compile(r"^Run: layers 20-21 dropped"))).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    return page.get_by_text(re.compile(r"^Fitted on 8 x 64 tokens")).inner_text()


def test_two_sessions_share_one_run(browser, app_url):
    tabs = [open_tab(browser, app_url + LINK) for _ in range(2)]  # both ask before either has an answer
    try:
        captions = [run_caption(page) for _, page in tabs]
        assert captions[0] == captions[1], captions  # the same run object: one computation
        assert re.search(r"\d+\.\d s in all", captions[0]) and "reused" not in captions[0]
        for _, page in tabs:
            expect(page.get_by_test_id("stSidebar")).to_contain_text("Layers to drop: 20-21")
            expect(page.get_by_test_id("stException")).to_have_count(0)
    finally:
        for context, _ in tabs:
            context.close()

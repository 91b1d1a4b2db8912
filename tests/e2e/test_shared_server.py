"""A real demo server (``GHOSTED_DEMO=1``, ``streamlit run app.py``, one worker) whose results folder cannot be
written, as in a read-only image: a link asking for windows beyond the model's positions is refused at once with
the server's memory where it was, and runs keep being served after a result could not be saved (a worker that
died on the write would leave the second run waiting for ever)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import ACTION_TIMEOUT_MS, RUN_TIMEOUT_MS, served_app, wait_idle

REFUSED = "?layers=20-21&tokens=8192&window=32768"  # windows four times the model's 8,192 positions
RUNS = ["?layers=20-21&methods=ghost&n=4&len=64&heldout=2&tokens=256&window=128",  # a run and its evaluation
        "?layers=9-10&methods=ghost&n=4&len=64&heldout=2"]  # queued behind them on the one worker


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    blocked = tmp_path_factory.mktemp("results") / "not-a-folder"
    blocked.write_text("every write of the store fails here")
    no_warm_up = blocked.with_name("plan.json")
    no_warm_up.write_text("[]")  # an empty list: nothing to warm (the warm-up's fits would hold the one worker)
    pids: list[int] = []
    with served_app({"GHOSTED_DEMO": "1", "GHOSTED_RESULTS": str(blocked), "GHOSTED_JOB_WORKERS": "1",
                     "GHOSTED_PRECOMPUTE_LIST": str(no_warm_up)}, pids) as url:
        yield url, pids[0]


def open_tab(browser, url: str):
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    page.set_default_timeout(ACTION_TIMEOUT_MS)
    page.goto(url)
    return context, page


def test_the_link_beyond_the_positions_is_refused_at_once(browser, demo_server):
    url, pid = demo_server
    context, page = open_tab(browser, url)
    try:
        wait_idle(page)  # the model is loaded
        before = resident_mib(pid)
        page.goto(url + REFUSED)
        wait_idle(page)
        expect(page.get_by_text(re.compile("This link could not be opened.*longer than this model's 8192 "
                                           "positions"))).to_be_visible()
        expect(page.get_by_test_id("stException")).to_have_count(0)
        page.wait_for_timeout(3000)  # nothing was queued: the server's memory stays where it was
        assert resident_mib(pid) < before + 200
    finally:
        context.close()


def test_a_store_that_cannot_write_keeps_serving_runs(browser, demo_server):
    url, _ = demo_server
    for link in RUNS:
        context, page = open_tab(browser, url + link)
        try:
            page.get_by_role("link", name="Calibrate & recover", exact=True).first.click()
            layers = re.search(r"layers=([\d-]+)", link).group(1)
            expect(page.get_by_text(re.compile(rf"^Run: layers {layers} dropped"))).to_be_visible(
                timeout=RUN_TIMEOUT_MS)
            expect(page.get_by_test_id("stException")).to_have_count(0)
        finally:
            context.close()

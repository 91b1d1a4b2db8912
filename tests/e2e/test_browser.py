"""The default flow by clicking, in chromium: every page works and gets a screenshot for the README.

Settings are small for a shared CPU (influence on 8 x 64 tokens, the default 32 x 128 calibration
tokens, 1024 evaluation tokens); the tests run in order on one browser tab, as a user would.
"""

import re

from playwright.sync_api import expect

from tests.e2e.conftest import RUN_TIMEOUT_MS, screenshot, wait_idle


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


def test_model_page(app_page):
    page = app_page
    expect(page.locator("h1").first).to_have_text("Model")
    expect(page.get_by_test_id("stMetric").filter(has_text="Layers")).to_contain_text("30")
    expect(sidebar(page)).to_contain_text("SmolLM2-135M-Instruct")
    expect(sidebar(page)).to_contain_text("cpu")
    screenshot(page, "model")


def test_influence_click_and_preset(app_page):
    page = app_page
    go(page, "Influence")
    fill(page, "influence_seqs", 8)
    fill(page, "influence_len", 64)
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
    screenshot(page, "influence")


def test_calibrate_and_recover(app_page):
    page = app_page
    go(page, "Calibrate & recover")
    click(page, "calibrate_run")  # the defaults: 32 x 128 tokens (+4 held-out), ghost-auto, ghost, replaceme-ls
    expect(page.get_by_text(re.compile(r"^Run: layers"))).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    expect(page.get_by_test_id("stDataFrame")).to_be_visible()
    expect(sidebar(page)).to_contain_text("Recovered: pruned, ghost-auto, ghost, replaceme-ls")
    screenshot(page, "recover")


def test_compare(app_page):
    page = app_page
    go(page, "Compare")
    fill(page, "eval_tokens", 1024)
    fill(page, "eval_window", 256)
    click(page, "evaluate_run")
    expect(page.get_by_text("Protocol")).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    fill(page, "new_tokens", 12)
    click(page, "generate_run")
    expect(page.get_by_text("The capital of France is", exact=True).last).to_be_visible(timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    for title in ("Perplexity (lower is better)", "removed (1 = perfect", "Singular values of the discrepancy"):
        expect(page.locator(".gtitle", has_text=title).first).to_be_visible()
    screenshot(page, "compare")


def test_export(app_page):
    page = app_page
    go(page, "Export")
    expect(page.get_by_role("button", name="Recipe (JSON)")).to_be_visible()
    expect(page.get_by_role("button", name="Download the model (zip)")).to_be_visible()
    screenshot(page, "export")


def test_learn(app_page):
    page = app_page
    go(page, "Learn")
    expect(page.get_by_text(re.compile("perplexity goes from"))).to_be_visible()
    expect(page.get_by_text(re.compile("the attention sink"))).to_be_visible()
    # layers, spectra, removed, frontier (the Compare page evaluated the run), positions, sink spectra
    expect(page.locator(".js-plotly-plot")).to_have_count(6)
    expect(page.locator(".gtitle", has_text="Recovery frontier")).to_be_visible()
    expect(page.locator(".gtitle", has_text="by position in the window")).to_be_visible()
    screenshot(page, "learn")

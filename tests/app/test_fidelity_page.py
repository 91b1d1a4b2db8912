"""What the cut did to each token, and the logit lens, on the Compare and Learn pages.

One session: a 4 x 64-token calibration of the paper's fit, then a short text with HTML in it and a prompt,
read on the Compare page and shown again on the Learn page; the demo refuses an over-long text. The render
functions are also checked on their own with tokens made to break out of the page.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from ghosted.evaluation.lens import TokenLosses
from ghosted.service.probes import LensView, TokenView
from pages import _fidelity
from tests.app.conftest import ROOT, TIMEOUT, calibrate, errors, no_exception, open_page, serve_navigation

LAYERS = [20, 21, 22, 23]
METHODS = ["ghost"]
TEXT = 'Tags <script>alert("x")</script> & *stars* $x$ stay text. The cat sat on the mat.'
PROMPT = "The capital of France is"
TOKENS = 24


@pytest.fixture(scope="module")
def read():
    """Load, calibrate small, score ``TEXT`` and read ``PROMPT`` on the Compare page."""
    st.cache_resource.clear()
    with pytest.MonkeyPatch.context() as patch:
        serve_navigation(patch)
        patch.delenv("GHOSTED_DEMO", raising=False)
        patch.delenv("GHOSTED_DEPLOY", raising=False)
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
        at.button(key="model_load").click().run()
        calibrate(at, LAYERS, METHODS)
        open_page(at, "compare")
        at.text_area(key="compare_tokens_text").set_value(TEXT)
        at.number_input(key="compare_tokens_max").set_value(TOKENS)
        at.button(key="compare_tokens_run").click().run()
        at.text_input(key="compare_lens_text").set_value(PROMPT)
        at.button(key="compare_lens_run").click().run()
        yield at


def stored(at: AppTest, name: str):
    from pages import _ui

    return _ui.backend().store.get(at.session_state[name].key())


def html_of(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith(("<div", "<table"))]


def test_token_view_draws_every_variant_from_the_librarys_numbers(read):
    no_exception(read)
    assert not errors(read)
    view = stored(read, _fidelity.TOKENS)
    assert view.variants == ("pruned", "ghost") and len(view.frame) == TOKENS - 1
    from ghosted.evaluation.lens import token_losses
    from pages._ui import MODEL, load_cached

    lm = load_cached(**read.session_state[MODEL])
    run = stored(read, "ghosted.run").run
    models = {"dense": lm.model, "pruned": run.results["none"].model, "ghost": run.results["ghost"].model}
    again = token_losses(models, lm.tokenizer, TEXT, max_tokens=TOKENS).frame
    pd.testing.assert_frame_equal(view.frame, again)  # the page's numbers, computed independently
    rows = [m.value for m in read.markdown if "mean change" in m.value]
    assert [r.split("**")[1] for r in rows] == ["pruned", "ghost"]
    assert f"{again['pruned Δ'].mean():+.3f} nats over {TOKENS - 1} tokens" in rows[0]
    shown = html_of(read)
    assert len(shown) >= 2 and all(s.count("<span") == TOKENS - 1 for s in shown[:2])
    hurt = next(d.value for d in read.dataframe if "pruned Δ" in d.value.columns)
    assert hurt["pruned Δ"].tolist() == pytest.approx(sorted(again["pruned Δ"], reverse=True)[:_fidelity.probes.SHOWN])
    repaired = next(d.value for d in read.dataframe if "repaired" in d.value.columns)
    assert repaired.repaired.iloc[0] == pytest.approx((again["pruned"] - again["ghost"]).max())


def test_the_users_html_reaches_the_page_as_text(read):
    page = " ".join(html_of(read))
    assert "<script" not in page and "</script" not in page and "&#60;" in page
    assert set(re.findall(r"<(\w+)", page)) <= {"div", "span", "table", "tr", "th", "td", "b"}


def test_lens_grid_marks_the_cut_and_ends_on_each_models_answer(read):
    view = stored(read, _fidelity.LENS)
    assert view.variants == ("dense", "pruned", "ghost") and view.removed == tuple(LAYERS)
    from ghosted.evaluation.lens import logit_lens
    from pages._ui import MODEL, load_cached

    lm = load_cached(**read.session_state[MODEL])
    run = stored(read, "ghosted.run").run
    direct = logit_lens({"dense": lm.model, "pruned": run.results["none"].model, "ghost": run.results["ghost"].model},
                        lm.tokenizer, PROMPT)
    pd.testing.assert_frame_equal(view.frame, direct)
    (table,) = [h for h in html_of(read) if h.startswith("<table")]
    assert table.count("<tr") == 1 + len(direct) == 1 + view.depth + 1
    assert all(f"&#9986; {layer} &#183; into removed layer {layer}" in table for layer in LAYERS)
    assert table.count("color:gray") == 2 * len(LAYERS)  # neither cut model has a stream entering the removed layers
    answer = direct.loc[direct.boundary == view.depth, "dense"].iloc[0]
    assert f"<b>{_fidelity.escape(answer)}</b>" in table


def test_learn_page_shows_the_same_views_in_step_7(read):
    open_page(read, "learn")
    no_exception(read)
    assert any(h.value == "7 · Where the cut hurts, token by token" for h in read.header)
    assert any("mean change" in m.value for m in read.markdown)
    assert any(h.startswith("<table") for h in html_of(read))
    assert read.text_area(key="learn_tokens_text").value == _fidelity.probes.default_passage()


def test_the_demo_refuses_an_over_long_text(monkeypatch):
    monkeypatch.setenv("GHOSTED_DEMO", "1")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    calibrate(at, LAYERS, METHODS)  # the module's run: answered from the shared store
    open_page(at, "compare")
    at.text_area(key="compare_tokens_text").set_value("word " * 5000)
    at.button(key="compare_tokens_run").click().run()
    no_exception(at)
    assert any("characters" in e and "demo deployment" in e for e in errors(at))
    assert _fidelity.TOKENS not in at.session_state


def test_render_functions_escape_every_token():
    hostile = ['<img src=x onerror="alert(1)">', '" onmouseover="x', "a\n\nb", "*b* `c` $d$ [e](f)", "&amp;"]
    frame = pd.DataFrame({"position": range(1, 6), "token": hostile, "dense": [1.0] * 5, "pruned": [3.0, 0.0, 1, 1, 9],
                          "pruned Δ": [2.0, -1.0, 0.0, 0.0, 8.0]})
    html = _fidelity.token_html(frame, "pruned")
    assert "\n" not in html and "<img" not in html and "onerror=\"" not in html and "*b*" not in html
    assert set(re.findall(r"<(\w+)", html)) == {"div", "span"} and html.count('"') == 2 + 4 * 5
    assert "rgba(220,38,38,0.850)" in html and "rgba(22,163,74,0.425)" in html
    view = TokenView(TokenLosses(frame, "dense"), "pruned", ())
    assert view.hurt(1).token.tolist() == ["&amp;"]
    lens = LensView(pd.DataFrame({"boundary": [0, 1, 2], "dense": ["<b>", "x", "</td>"], "dense p": [0.1, 0.5, 0.9],
                                  "pruned": ["a", None, "<i>"], "pruned p": [0.2, None, 0.4]}),
                    ("dense", "pruned"), (1,), ("<p>",), 2)
    table = _fidelity.lens_html(lens)
    assert set(re.findall(r"<(\w+)", table)) == {"table", "tr", "th", "td", "b"}
    assert "<b>&#60;&#47;td&#62;</b>" in table and "&#60;i&#62;" in table

"""The zero-shot section of the Compare page and its use on the Learn page, on a small run.

One session: a 4 x 64-token calibration of two methods, then bundled-lastword on 6 examples.
"""

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app.conftest import (ROOT, TIMEOUT, calibrate, errors, figures, no_exception, open_page, run_of,
                                serve_navigation)

LAYERS = [20, 21, 22, 23]
METHODS = ["ghost-auto"]
EXAMPLES = 6


@pytest.fixture(scope="module")
def scored():
    """Load, calibrate small, look at Learn before scoring, then score zero-shot accuracy on Compare."""
    st.cache_resource.clear()
    with pytest.MonkeyPatch.context() as patch:
        serve_navigation(patch)
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
        at.button(key="model_load").click().run()
        calibrate(at, LAYERS, METHODS)
        learn_before = " ".join(c.value for c in open_page(at, "learn").caption)
        open_page(at, "compare")
        at.number_input(key="zeroshot_limit").set_value(EXAMPLES)
        at.button(key="zeroshot_run").click().run()
        yield at, learn_before


def test_accuracy_of_every_variant_is_stored_and_right(scored):
    at, _ = scored
    no_exception(at)
    assert not errors(at)
    result = run_of(at).zeroshot
    acc = result.frame[result.frame.metric == "acc"]
    assert list(acc.model) == ["dense", "pruned", *METHODS] and set(acc.task) == {"bundled-lastword"}
    assert result.protocols["bundled-lastword"]["examples"] == EXAMPLES
    from ghosted.evaluation.lastword import score_lastword
    from pages._ui import MODEL, load_cached

    lm = load_cached(**at.session_state[MODEL])
    run = run_of(at).run
    models = {"dense": lm.model, "pruned": run.results["none"].model, "ghost-auto": run.results["ghost-auto"].model}
    again = score_lastword(models, lm.tokenizer, limit=EXAMPLES, share=False)
    assert list(acc.value) == [again[m].acc for m in models]  # the page's numbers, computed independently


def test_bar_chart_has_error_bars_and_the_table_matches(scored):
    at, _ = scored
    open_page(at, "compare")
    frame = run_of(at).zeroshot.frame
    acc = frame[frame.metric == "acc"]
    chart = next(f for f in figures(at) if "Zero-shot accuracy" in f["layout"]["title"]["text"])
    (bars,) = chart["data"]  # one task: no average bar
    assert bars["x"] == ["dense", "pruned", *METHODS]
    assert bars["y"] == pytest.approx(list(100 * acc.value))
    assert bars["error_y"]["array"] == pytest.approx(list(100 * (acc.high - acc.value)))  # the 95 % interval
    assert bars["error_y"]["arrayminus"] == pytest.approx(list(100 * (acc.value - acc.low)))
    assert ((acc.low <= acc.value) & (acc.value <= acc.high)).all()
    table = next(d.value for d in at.dataframe if "bundled-lastword" in d.value.columns)
    assert list(table["bundled-lastword"]) == pytest.approx(list((100 * acc.value).round(2)))
    assert list(table["bundled-lastword 95 %"]) == [f"[{100 * lo:,.2f}, {100 * hi:,.2f}]"
                                                    for lo, hi in zip(acc.low, acc.high)]
    text = " ".join(m.value for m in at.markdown)
    assert f"bundled-lastword v1: {EXAMPLES} examples, 0-shot" in text


def test_learn_page_uses_the_accuracy_once_scored(scored):
    at, learn_before = scored
    assert "Score zero-shot accuracy on the Compare page" in learn_before
    open_page(at, "learn")
    no_exception(at)
    frame = run_of(at).zeroshot.frame
    acc = frame[frame.metric == "acc"].set_index("model").value * 100
    text = " ".join(m.value for m in at.markdown)
    assert (f"accuracy goes from **{acc['dense']:.1f} %** (dense) to **{acc['pruned']:.1f} %** (pruned)" in text)
    assert f"ghost-auto **{acc['ghost-auto']:.1f} %**" in text


def test_no_task_chosen_is_a_clear_error(scored):
    at, _ = scored
    open_page(at, "compare")
    at.checkbox(key="zeroshot_bundled").uncheck()
    at.button(key="zeroshot_run").click().run()
    assert any("Choose at least one task" in e for e in errors(at))
    at.checkbox(key="zeroshot_bundled").check().run()


def test_an_lm_eval_task_offline_is_skipped_with_a_note(scored):
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install -r requirements-eval.txt")
    at, _ = scored
    open_page(at, "compare")
    at.checkbox(key="zeroshot_bundled").uncheck()
    at.text_input(key="zeroshot_harness").input("arc_easy")
    at.button(key="zeroshot_run").click().run()
    no_exception(at)
    result = run_of(at).zeroshot
    assert result.frame.empty and list(result.skipped) == ["arc_easy"]
    assert any("skipping arc_easy" in i.value for i in at.info)

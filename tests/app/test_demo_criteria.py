"""Demo mode refuses the costly influence criteria (removal perplexity, Taylor+, SLEB), in the library and the app."""

import pytest
from streamlit.testing.v1 import AppTest

from ghosted.service.deploy import CLASSROOM, DEMO, LOCAL, DeployRefusal, criterion_cost
from ghosted.selection.criteria import CRITERIA, SINGLE_PASS
from tests.app.conftest import ROOT, TIMEOUT, errors, no_exception, open_page

COSTLY = ["ppl_single", "taylor", "sleb"]


def test_the_costly_criteria_are_the_per_layer_and_gradient_ones():
    assert sorted(m for m in CRITERIA if criterion_cost(m) in ("per-layer", "gradient")) == sorted(COSTLY)
    assert criterion_cost(" SLEB ") == "per-layer" and criterion_cost("no-such-criterion") is None


@pytest.mark.parametrize("metric", COSTLY)
def test_demo_refuses_each_costly_criterion_naming_it(metric):
    with pytest.raises(DeployRefusal, match=rf"demo deployment does not compute {metric} \(") as caught:
        DEMO.check_criteria(["block_influence", metric])
    assert "pass per layer or a backward pass" in str(caught.value)
    assert "recoverability" in str(caught.value)  # says what can be chosen instead


def test_demo_names_every_refused_criterion_at_once():
    with pytest.raises(DeployRefusal) as caught:
        DEMO.check_criteria(COSTLY)
    assert all(f"{m} (" in str(caught.value) for m in COSTLY)
    assert "Taylor+" in str(caught.value) and "SLEB" in str(caught.value)


def test_single_pass_criteria_pass_everywhere_and_costly_ones_outside_the_demo():
    DEMO.check_criteria(SINGLE_PASS)
    LOCAL.check_criteria(COSTLY)
    CLASSROOM.check_criteria(COSTLY)


@pytest.fixture
def demo(monkeypatch):
    monkeypatch.setenv("GHOSTED_DEMO", "1")
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()


def test_demo_influence_page_refuses_taylor_before_any_work(demo):
    open_page(demo, "influence")
    assert any("does not compute the slow criteria" in c.value for c in demo.caption)
    demo.number_input(key="influence_calib_seqs").set_value(2)
    demo.number_input(key="influence_seq_len").set_value(32)
    demo.multiselect(key="influence_metrics").set_value(["block_influence", "taylor"])
    demo.button(key="influence_run").click().run()
    no_exception(demo)
    assert any("demo deployment does not compute taylor" in e for e in errors(demo))
    assert "ghosted.layer_influence" not in demo.session_state
    assert not demo.session_state["ghosted.busy"]  # the button is usable again

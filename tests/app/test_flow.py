"""The whole flow in one session: load, choose a block, calibrate, fit, compare, export, learn.

Small settings keep it cheap on a shared CPU: 4 x 64 calibration tokens (+2 held-out windows),
1024 evaluation tokens. The numbers are not meaningful at this size; the wiring is what is tested.
"""

import json
import re

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app.conftest import (ROOT, TIMEOUT, calibrate, errors, figures, no_exception, open_page, run_of,
                                serve_navigation)


METHODS = ["ghost-auto", "ghost", "replaceme-ls"]  # the default method, the paper's, a baseline
LAYERS = [20, 21, 22, 23]


@pytest.fixture(scope="module")
def flow():
    """One session taken through the whole flow (module-scoped: it is the expensive part)."""
    st.cache_resource.clear()
    with pytest.MonkeyPatch.context() as patch:
        serve_navigation(patch)
        yield _run_flow(AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT))


def _run_flow(at):
    """Load, choose a block, calibrate small, evaluate small: the flow every test below inspects."""
    at.run()
    at.button(key="model_load").click().run()  # the bundled model, as a first-time user would
    open_page(at, "influence")
    at.multiselect(key="influence_layers").set_value(LAYERS).run()
    calibrate(at, at.session_state["ghosted.selection"], METHODS)
    open_page(at, "compare")
    at.number_input(key="eval_tokens").set_value(1024)
    at.number_input(key="eval_seq_len").set_value(256)
    at.button(key="evaluate_run").click().run()
    return at


def test_selection_reaches_other_pages(flow):
    assert flow.session_state["ghosted.selection"] == LAYERS
    open_page(flow, "recover")
    assert any("20-23 (4 of 30 layers" in i.value for i in flow.info)


def test_calibration_kept_across_pages(flow):
    stored = run_of(flow)
    assert stored.methods == ["none", *METHODS]
    assert set(stored.run.results) == {"none", *METHODS}
    assert stored.protocol["n_windows"] == 4 and stored.heldout_protocol["n_windows"] == 2


def test_perplexity_table(flow):
    open_page(flow, "compare")
    no_exception(flow)
    assert not errors(flow)
    table = run_of(flow).evaluation.table.frame().set_index("label")
    assert list(table.index) == ["dense", "pruned", *METHODS]
    assert (table.ppl > 1).all()
    assert table.ppl["dense"] < table.ppl["pruned"]  # four layers gone always cost something
    assert table["tokens"].nunique() == 1
    assert table.loc["pruned", "parameters (M)"] < table.loc["dense", "parameters (M)"]
    shown = flow.dataframe[0].value
    assert list(shown.label) == list(table.index)


def test_perplexity_table_shows_intervals_paired_differences_and_fidelity(flow):
    from ghosted.service.comparison import span

    open_page(flow, "compare")
    table = run_of(flow).evaluation.table.frame()
    assert {"ppl_low", "ppl_high", "kl", "top1", "d_none", "d_none_significant", "d_ghost"} <= set(table)
    assert ((table.ppl_low <= table.ppl) & (table.ppl <= table.ppl_high)).all()
    shown = flow.dataframe[0].value
    assert list(shown.columns) == list(run_of(flow).evaluation.table.interval_rows().columns)
    rows = table.set_index("label")
    for _, cell in shown.iterrows():
        row = rows.loc[cell.label]
        assert cell["95 % interval"] == span(row.ppl_low, row.ppl_high)
        if cell.label != "pruned":
            assert cell["Δ vs pruned"].endswith(" ns") == (not row.d_none_significant)
    assert shown["KL from dense"].tolist() == pytest.approx(table.kl.tolist())
    assert shown["top-1 agreement %"].tolist() == pytest.approx((100 * table.top1).round(2).tolist())
    caption = " ".join(c.value for c in flow.caption)
    assert "bootstrap over the 4 evaluation windows" in caption and "paired" in caption


def test_perplexity_figure_matches_table(flow):
    open_page(flow, "compare")
    table = run_of(flow).evaluation.table.frame()
    bars = figures(flow)[0]
    assert bars["data"][0]["type"] == "bar"
    assert bars["data"][0]["x"] == list(table.label)
    assert bars["data"][0]["y"] == pytest.approx(list(table.ppl))
    assert bars["layout"]["yaxis"]["type"] == "log"
    assert bars["data"][0]["error_y"]["array"] == pytest.approx(list(table.ppl_high - table.ppl))


def test_frontier_figure_matches_the_evaluated_parameters(flow):
    open_page(flow, "compare")
    table = run_of(flow).evaluation.table.frame().set_index("label")
    frontier = next(f for f in figures(flow) if "frontier" in f["layout"]["title"]["text"])
    closed, trained = frontier["data"]
    assert (closed["name"], trained["name"]) == ("closed form", "trained")
    assert closed["text"] == METHODS and not trained.get("x")  # none of these methods is trained
    added = [int(table.parameters[m] - table.parameters["pruned"]) for m in METHODS]
    assert closed["x"] == added
    assert added[1] == 576 * 576  # ghost: one d x d operator for the one gap
    assert closed["y"] == pytest.approx([table.ppl[m] for m in METHODS])
    assert frontier["layout"]["shapes"][0]["y0"] == pytest.approx(table.ppl["pruned"])


def test_spectra_and_errors_figures(flow):
    open_page(flow, "compare")
    figs = figures(flow)
    removed = next(f for f in figs if "removed" in f["layout"]["title"]["text"])
    assert {t["name"] for t in removed["data"]} == {"fit", "heldout"}
    assert removed["data"][0]["x"] == METHODS
    spectra = next(f for f in figs if "Singular values" in f["layout"]["title"]["text"])
    assert [t["name"] for t in spectra["data"]] == ["pruned", *METHODS]
    assert spectra["layout"]["yaxis"]["type"] == "log"
    assert all(len(t["y"]) == 576 for t in spectra["data"])


def test_generation_prompts_default_to_the_assets_file(flow):
    """(Before the next test, which types its own prompt.)"""
    from pages import _assets

    open_page(flow, "compare")
    assert flow.text_area(key="prompts").value.splitlines() == _assets.prompts()


def test_generations_side_by_side(flow):
    open_page(flow, "compare")
    flow.text_area(key="prompts").set_value("The capital of France is")
    flow.number_input(key="new_tokens").set_value(4)
    flow.button(key="generate_run").click().run()
    no_exception(flow)
    shown = run_of(flow).generations
    assert list(shown.outputs) == ["dense", "pruned", *METHODS]
    assert all(len(texts) == 1 for texts in shown.outputs.values())
    assert set(shown.departures) == {"pruned", *METHODS}
    captions = [c.value for c in flow.caption]
    for name in ("pruned", *METHODS):
        at = shown.departures[name][0]
        assert (f"{name} · same as dense" if at is None else f"{name} · departs from dense at token {at}") in captions


def test_export_downloads(flow):
    open_page(flow, "export")
    no_exception(flow)
    labels = [b.proto.label for b in flow.get("download_button")]
    assert "Download the model (zip)" in labels and "Recipe (JSON)" in labels
    recipe = json.loads(flow.json[0].proto.body)  # the recipe shown under "Recipe contents"
    assert recipe["dropped_layers"] == LAYERS and recipe["methods"] == ["none", *METHODS]
    assert recipe["calibration"]["n_windows"] == 4 and "transformers" in recipe["versions"]
    assert "--drop 20-23" in recipe["command"]
    assert recipe["format"] == "ghosted-recipe" and "settings" in recipe  # a saved model's recipe format
    assert recipe["format"] == "ghosted-recipe" and "settings" in recipe  # a saved model's recipe format
    from ghosted.experiments.spec import ExperimentSpec  # the spec, in the format of `run --out` and `export`

    spec = ExperimentSpec.from_dict(recipe["spec"])
    assert (spec.layers.drop, spec.calibration.calib_seqs, spec.methods) == ("20-23", 4, ["dense", "none", *METHODS])


def test_learn_uses_the_run(flow):
    open_page(flow, "learn")
    no_exception(flow)
    text = " ".join(m.value for m in flow.markdown)
    assert "20-23" in text and "perplexity goes from" in text
    assert len(figures(flow)) >= 2


def test_learn_fills_its_texts_with_the_runs_numbers(flow):
    """Every text of the Learn page comes from assets/learn/, filled: no placeholder reaches the user."""
    from pages import _assets

    open_page(flow, "learn")
    no_exception(flow)
    shown = [e.value for kind in ("markdown", "caption", "info", "warning") for e in flow.get(kind)]
    assert not [text for text in shown if re.search(r"\{[A-Za-z_]\w*(:[^}]*)?\}", text)]
    table = run_of(flow).evaluation.table.frame().set_index("label")
    expected = [_assets.learn("stream", "intro", width=576, layers=30),
                _assets.learn("pruning", "missing", layers="20-23", gap="20-23", end=24),
                _assets.learn("pruning", "perplexity", dense=table.ppl["dense"],
                              pruned=table.ppl["pruned"])]
    assert all(text in shown for text in expected)
    assert "**20-23**" in expected[1] and f"**{table.ppl['dense']:.2f}** (dense)" in expected[2]


def test_learn_shows_the_frontier_of_the_run(flow):
    open_page(flow, "learn")
    table = run_of(flow).evaluation.table.frame().set_index("label")
    frontier = next(f for f in figures(flow) if "frontier" in f["layout"]["title"]["text"])
    closed, trained = frontier["data"]
    assert closed["text"] == METHODS and not trained.get("x")
    added = {m: int(table.parameters[m] - table.parameters["pruned"]) for m in METHODS}
    assert closed["x"] == [added[m] for m in METHODS]
    best = min(METHODS, key=lambda m: table.ppl[m])  # the best closed-form fit, named in the text
    text = " ".join(m.value for m in flow.markdown)
    assert f"**{best}**: perplexity **{table.ppl[best]:.2f}** for **{added[best]:,}** added" in text
    assert "None of your methods is trained" in text
    assert f"d² = **{576 * 576:,}**" in text


def test_learn_explains_the_sink_with_the_runs_numbers(flow):
    open_page(flow, "learn")
    no_exception(flow)
    shares = run_of(flow).frames["token_shares"].set_index("tokens")
    text = " ".join(m.value for m in flow.markdown)
    assert "attention sink" in text and f"{shares.loc['sink', 'delta_share']:.1%}" in text
    figs = figures(flow)
    positions = next(f for f in figs if "by position" in f["layout"]["title"]["text"])
    assert positions["data"][0]["x"][0] == 0
    assert positions["data"][0]["y"][0] == pytest.approx(shares.loc["sink", "delta_share"])
    spectra = next(f for f in figs if "with and without the sink" in f["layout"]["title"]["text"])
    assert [t["name"] for t in spectra["data"]] == ["all tokens", "without sinks", "sinks only"]
    assert spectra["layout"]["yaxis"]["type"] == "log"


def test_compare_shows_the_sink_report(flow):
    open_page(flow, "compare")
    report = run_of(flow).frames["sinks"]
    assert list(report.gap) == ["20-23"]  # the gap in the drop notation, as --drop takes it
    assert any("share of ‖Δ‖² %" in d.value.columns for d in flow.dataframe)


def test_the_cached_model_is_left_as_it_was_loaded(flow):
    """Every page shares the cached model with every other session: the flow must not change it."""
    from ghosted.models.architecture import layers_of
    from pages._ui import MODEL, load_cached

    model = load_cached(**flow.session_state[MODEL]).model
    layers = layers_of(model)
    assert len(layers) == 30 and model.config.num_hidden_layers == 30
    assert [layer.self_attn.layer_idx for layer in layers] == list(range(30))
    assert not any(layer._forward_hooks or layer._forward_pre_hooks for layer in layers)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_sink_aware_fit_below_zero_is_explained_on_the_recover_page(monkeypatch):
    """Layers 14-15 on 32 x 128 tokens: ghost-auto keeps the sink-robust fit (lower held-out loss), whose share
    of ‖Δ‖² is far below 0 because of the sink tokens; the page says why, next to the number."""
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.button(key="model_load").click().run()
    calibrate(at, [14, 15], ["ghost-auto", "ghost"], n=32, length=128, heldout=4)
    no_exception(at)
    shares = run_of(at).frames["errors"]
    assert (shares[shares.method == "ghost-auto"].removed_fraction < 0).all()
    assert (shares[shares.method == "ghost"].removed_fraction > 0).all()
    (said,) = [i.value for i in at.info if "attention-sink" in i.value]
    assert said.startswith("ghost-auto: below 0") and "Compare page" in said

"""Influence page: criteria on a little text, charts, presets and the shared selection."""

import pytest

from tests.app.conftest import errors, figures, influence_of, no_exception, open_page


@pytest.fixture
def measured(app):
    open_page(app, "influence")
    app.number_input(key="influence_calib_seqs").set_value(4)
    app.number_input(key="influence_seq_len").set_value(64)
    app.multiselect(key="influence_rec_n").set_value([4])
    app.button(key="influence_run").click().run()
    no_exception(app)
    return app


def test_charts_show_the_report(measured):
    report = influence_of(measured).report
    heat, bars = figures(measured)[:2]
    assert heat["data"][0]["type"] == "heatmap"
    streamline = report.blocks[report.blocks.metric == "streamline_cosine"]
    assert len(heat["data"][0]["x"]) == streamline.start.nunique()
    assert len(heat["data"][0]["y"]) == streamline.n.nunique() == 29  # every n in 1..L-1
    assert bars["data"][0]["type"] == "bar" and bars["data"][0]["x"] == list(range(30))
    bi = report.layers[report.layers.metric == "block_influence"].sort_values("layer").value
    assert bars["data"][0]["y"] == pytest.approx(list(bi))


@pytest.mark.parametrize("preset", ["most recoverable block of n", "Streamline block of n"])
def test_block_presets_select_a_contiguous_block(measured, preset):
    measured.selectbox(key="influence_preset").set_value(preset)
    measured.number_input(key="influence_n").set_value(4)
    measured.button(key="influence_apply").click().run()
    layers = measured.session_state["ghosted.selection"]
    assert len(layers) == 4 and layers == list(range(layers[0], layers[0] + 4))
    assert any("block [" in s.value for s in measured.success)
    bars = figures(measured)[1]  # the selection is drawn in red on the per-layer chart
    red = [x for x, c in zip(bars["data"][0]["x"], bars["data"][0]["marker"]["color"]) if c == "#d62728"]
    assert red == layers


def test_shortgpt_preset_and_manual_choice(measured):
    measured.selectbox(key="influence_preset").set_value("ShortGPT n")
    measured.number_input(key="influence_n").set_value(3)
    measured.button(key="influence_apply").click().run()
    chosen = measured.session_state["ghosted.selection"]
    assert len(chosen) == 3
    assert measured.multiselect(key="influence_layers").value == chosen  # one list, two widgets
    measured.multiselect(key="influence_layers").set_value([5, 7]).run()
    assert measured.session_state["ghosted.selection"] == [5, 7]


def test_preset_without_its_values_explains_what_to_do(measured):
    measured.selectbox(key="influence_preset").set_value("most recoverable block of n")
    measured.number_input(key="influence_n").set_value(7)
    measured.button(key="influence_apply").click().run()
    no_exception(measured)
    assert any("Add 7 to 'Block sizes n for recoverability'" in e for e in errors(measured))
    assert measured.session_state["ghosted.selection"] == []


def test_the_criteria_offered_are_the_librarys_table(app):
    from ghosted.selection.criteria import CRITERIA

    open_page(app, "influence")
    box = app.multiselect(key="influence_metrics")
    assert len(box.options) == len(CRITERIA)
    assert [option.split(" (")[0] for option in box.options] == list(CRITERIA)
    assert set(box.value) <= set(CRITERIA)


def test_every_criterion_comes_from_one_influence_call_with_recoverability_token(app):
    """recoverability_token once asked for every block size (5 GB of sums) and failed; now its Gram sums,
    like every recoverability criterion's, cover the chosen n only, and all criteria come from one call."""
    from ghosted.selection.criteria import InfluenceConfig, influence
    from ghosted.data.windows import split_calibration
    from ghosted.data.windows import calibration_windows
    from pages._ui import MODEL, load_cached

    chosen = ["streamline_cosine", "block_influence", "recoverability_token", "recoverability_heldout"]
    open_page(app, "influence")
    app.number_input(key="influence_calib_seqs").set_value(4)
    app.number_input(key="influence_seq_len").set_value(64)
    app.multiselect(key="influence_rec_n").set_value([4])
    app.multiselect(key="influence_metrics").set_value(chosen)
    app.button(key="influence_run").click().run()
    no_exception(app)
    assert not errors(app)
    report = influence_of(app).report
    assert report.meta["metrics"] == chosen and report.meta["recoverability_n_values"] == [4]  # one call
    blocks = report.blocks
    assert blocks[blocks.metric == "streamline_cosine"].n.nunique() == 29  # similarities: every n
    for metric in ("recoverability_token", "recoverability_heldout"):
        assert set(blocks[blocks.metric == metric].n) == {4} and len(blocks[blocks.metric == metric]) == 27

    lm = load_cached(**app.session_state[MODEL])  # the same numbers from the library, called directly
    fit, held = split_calibration(calibration_windows(lm.tokenizer, "bundled:news", 4 + 4, 64, seed=0), 4)
    config = InfluenceConfig(metrics=["recoverability_token"], n_values=[4])
    direct = influence(lm.model, fit, config).matrix("recoverability_token")
    assert report.matrix("recoverability_token").to_numpy() == pytest.approx(direct.to_numpy(), rel=1e-6)

"""Influence page: criteria on a little text, charts, presets and the shared selection."""

import pytest

from tests.app.conftest import errors, figures, no_exception, open_page


@pytest.fixture
def measured(app):
    open_page(app, "influence")
    app.number_input(key="influence_seqs").set_value(4)
    app.number_input(key="influence_len").set_value(64)
    app.multiselect(key="influence_rec_n").set_value([4])
    app.button(key="influence_run").click().run()
    no_exception(app)
    return app


def test_charts_show_the_report(measured):
    report = measured.session_state["ghosted.layer_influence"]["report"]
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

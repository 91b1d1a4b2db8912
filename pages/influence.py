"""Influence page: how much each layer and block changes the stream, and which layers to drop."""

import streamlit as st

from ghosted.arch import num_layers
from ghosted.text import calibration_windows
from pages import _charts, _ui

try:
    from ghosted import influence
except ImportError:  # the library without layer-selection criteria: manual choice only
    influence = None

REASON, PRESET_ERROR = _ui.REASON, "ghosted.preset_error"
PRESETS = {  # preset -> (criterion, what it means)
    "Streamline block of n": ("streamline", "the contiguous block whose input and output are most alike"),
    "ShortGPT n": ("shortgpt", "the n layers with the lowest block influence, anywhere"),
    "most recoverable block of n": ("recoverable", "the contiguous block a ghost operator restores best"),
}


def influence_form(cfg, n_layers: int) -> dict:
    with st.form("influence_form"):
        text = _ui.text_source_inputs(cfg, "bundled:news", "influence")
        cols = st.columns(3)
        n_seqs = cols[0].number_input("Sequences", 1, 1024, 8)
        seq_len = cols[1].number_input("Sequence length", 8, 8192, 128, step=64)
        max_n = cols[2].number_input("Largest block (n)", 1, n_layers - 1, min(12, n_layers - 1))
        st.form_submit_button("Compute influence", type="primary", disabled=_ui.busy(),
                              on_click=_ui.start_job, args=("influence",))
    return {"text": text, "n_seqs": int(n_seqs), "seq_len": int(seq_len), "max_n": int(max_n)}


def compute(lm, form: dict, progress) -> dict:
    _ui.deployment().check_calibration(form["n_seqs"], form["seq_len"])
    progress("tokenising", 0, 1)
    windows = calibration_windows(lm.tokenizer, form["text"](), form["n_seqs"], form["seq_len"], seed=0)
    report = influence.compute_influence(lm.model, windows, n_values=list(range(1, form["max_n"] + 1)),
                                         progress=progress)
    return {"model": _ui.current_key(), "report": report, "protocol": windows.protocol}


def on_bar_click() -> None:
    """Chart callback: the clicked bars become the selection (shift-click adds more)."""
    points = st.session_state["influence.bars"].selection.points
    if points:
        _ui.set_selection([int(p["x"]) for p in points])
        st.session_state.pop(REASON, None)


def on_multiselect() -> None:
    _ui.set_selection(st.session_state["influence.layers"])
    st.session_state.pop(REASON, None)


def on_preset(report) -> None:
    """Button callback: the preset's layers become the selection, with the reason shown."""
    metric = PRESETS[st.session_state["influence.preset"]][0]
    try:
        layers, reason = influence.select(report, metric, int(st.session_state["influence.n"]))
    except _ui.USER_ERRORS as err:
        st.session_state[PRESET_ERROR] = str(err)
        return
    _ui.set_selection(layers)
    st.session_state[REASON] = reason


def charts(report) -> None:
    """Heatmap of a block criterion (display only) and bars of a per-layer one (clickable)."""
    left, right = st.columns(2)
    block_metrics = list(dict.fromkeys(report.blocks.metric))
    if block_metrics:
        metric = left.selectbox("Block criterion", block_metrics, key="influence.block_metric")
        left.plotly_chart(_charts.heatmap(report.blocks, metric), key="influence.heatmap")
    layer_metrics = list(dict.fromkeys(report.layers.metric))
    if layer_metrics:
        metric = right.selectbox("Per-layer criterion", layer_metrics, key="influence.layer_metric")
        right.plotly_chart(_charts.layer_bars(report.layers, metric, _ui.selection()), key="influence.bars",
                           on_select=on_bar_click, selection_mode="points")


def pickers(model, report) -> None:
    """Presets (need a report) and a multiselect holding the same list of layers."""
    n_layers = num_layers(model)
    if report is not None:
        cols = st.columns([3, 1, 1])
        cols[0].selectbox("Preset", list(PRESETS), key="influence.preset",
                          help="\n".join(f"- **{k}**: {v[1]}" for k, v in PRESETS.items()))
        cols[1].number_input("n", 1, n_layers - 1, min(6, n_layers - 1), key="influence.n")
        cols[2].button("Apply preset", on_click=on_preset, args=(report,), width="stretch")
        if error := st.session_state.pop(PRESET_ERROR, None):
            st.error(error, icon=":material/error:")
    st.session_state["influence.layers"] = _ui.selection()
    st.multiselect("Layers to drop", list(range(n_layers)), key="influence.layers",
                   on_change=on_multiselect)
    layers = _ui.selection()
    if len(layers) == n_layers:
        st.error("That drops every layer: keep at least one.", icon=":material/error:")
    elif layers:
        reason = st.session_state.get(REASON)
        st.success(f"Selected: **{_ui.selection_text(model, layers)}**" + (f"  \n{reason}" if reason else ""))
        st.page_link("pages/recover.py", label="Next: calibrate and recover", icon=":material/arrow_forward:")


st.title("Influence")
st.write("Which layers change the residual stream least? Compute the criteria on a little text, then "
         "click bars, use a preset or pick layers by hand.")
lm = _ui.require_model()
report = None
if influence is None:
    st.warning("Layer-selection criteria are not available in this install; pick layers by hand.")
else:
    form = influence_form(_ui.deployment(), num_layers(lm.model))
    result = _ui.run_job("influence", "Measuring layer influence", lambda progress: compute(lm, form, progress))
    if result:
        st.session_state[_ui.INFLUENCE] = result
        st.rerun()
    stored = _ui.stored(_ui.INFLUENCE)
    report = stored["report"] if stored else None
    if report is not None:
        charts(report)
pickers(lm.model, report)

"""Influence page: how much each layer and block changes the stream, and which layers to drop."""

import streamlit as st

from ghosted.service.frontend import CRITERIA, RECOVERABILITY, num_layers, offered_range, workbench as wb
from pages import _charts, _text, _ui

REASON, PRESET_ERROR = _ui.REASON, "ghosted.preset_error"
DEFAULTS = wb.InfluenceRequest()  # the page's defaults: what the precompute script stores
PRESETS = wb.PRESETS


def criterion_label(name: str) -> str:
    """A criterion with who defined it and, when it is slow, why."""
    c = CRITERIA[name]
    cost = {"pass": "", "heldout": ", + held-out pass", "per-layer": ", slow: a pass per layer",
            "gradient": ", slow: a backward pass"}[c.cost]
    return f"{name} ({c.origin}{cost})"


def influence_form(cfg, n_layers: int) -> None:
    """Text, size and criteria of the measurement; a click queues it (``request``)."""
    kind = _text.text_kind(cfg, "bundled:news", "influence", "Text to measure on")
    with st.form("influence_form"):
        text = _text.text_inputs(cfg, kind, "influence")
        cols = st.columns(3)
        calib_seqs = cols[0].number_input("Sequences", *offered_range("calib_seqs"), DEFAULTS.calib_seqs,
                                          key="influence_calib_seqs")
        seq_len = cols[1].number_input("Sequence length", *offered_range("seq_len"), DEFAULTS.seq_len, step=64,
                                       key="influence_seq_len")
        rec_n = cols[2].multiselect("Block sizes n for recoverability", list(range(1, n_layers)),
                                    key="influence_rec_n", default=[min(DEFAULTS.rec_n[0], n_layers - 1)],
                                    help="a ghost fit per block: each n adds memory and time")
        metrics = st.multiselect("Criteria", list(CRITERIA), default=list(DEFAULTS.metrics),
                                 key="influence_metrics", format_func=criterion_label)
        if not cfg.allow_costly_criteria:
            st.caption(f"The {cfg.name} deployment does not compute the slow criteria (removal perplexity, "
                       "Taylor+, SLEB).")
        st.form_submit_button("Compute influence", type="primary", key="influence_run",
                              disabled=_ui.busy(_ui.INFLUENCE), on_click=_ui.start_job, args=("influence",))
    _ui.queue_clicked("influence", _ui.INFLUENCE,
                      lambda: request(cfg, text(), calib_seqs, seq_len, rec_n, metrics))


def request(cfg, text, calib_seqs: int, seq_len: int, rec_n, metrics) -> wb.InfluenceRequest:
    """The measurement asked for, checked against the deployment."""
    asked = wb.InfluenceRequest(model=_ui.current_key(), text=text, calib_seqs=int(calib_seqs), seq_len=int(seq_len),
                                rec_n=tuple(sorted(int(n) for n in rec_n)), metrics=tuple(metrics))
    asked.check(cfg)
    return asked


def on_bar_click() -> None:
    """Chart callback: the clicked bars become the selection (shift-click adds more)."""
    points = st.session_state["influence_bars"].selection.points
    if points:
        _ui.set_selection([int(p["x"]) for p in points])
        st.session_state.pop(REASON, None)


def on_multiselect() -> None:
    """Multiselect callback: its list is the selection."""
    _ui.set_selection(st.session_state["influence_layers"])
    st.session_state.pop(REASON, None)


def on_preset(report) -> None:
    """Button callback: the preset's layers become the selection, with the reason shown."""
    metric, n = PRESETS[st.session_state["influence_preset"]][0], int(st.session_state["influence_n"])
    try:
        layers, reason = wb.apply_preset(report, st.session_state["influence_preset"], n)
    except _ui.USER_ERRORS as err:
        missing = metric in RECOVERABILITY and f"n = {n}" in str(err)
        hint = f" Add {n} to 'Block sizes n for recoverability' and compute again." if missing else ""
        st.session_state[PRESET_ERROR] = f"{err}{hint}"
        return
    _ui.set_selection(layers)
    st.session_state[REASON] = reason


def charts(report) -> None:
    """Heatmap of a block criterion (display only) and bars of a per-layer one (clickable)."""
    left, right = st.columns(2)
    block_metrics = list(dict.fromkeys(report.blocks.metric))
    if block_metrics:
        metric = left.selectbox("Block criterion", block_metrics, key="influence_block_metric")
        left.plotly_chart(_charts.heatmap(report.blocks, metric, CRITERIA[metric].prune), key="influence_heatmap")
        left.caption(CRITERIA[metric].label)
    layer_metrics = list(dict.fromkeys(report.layers.metric))
    if layer_metrics:
        metric = right.selectbox("Per-layer criterion", layer_metrics, key="influence_layer_metric")
        prune = CRITERIA[metric].prune if metric in CRITERIA else ""
        right.plotly_chart(_charts.layer_bars(report.layers, metric, _ui.selection(), prune), key="influence_bars",
                           on_select=on_bar_click, selection_mode="points")
        right.caption((CRITERIA[metric].label if metric in CRITERIA else metric)
                      + ". Click a bar to select its layer, shift-click to add more; red = selected.")


def pickers(model, report) -> None:
    """Presets (need a report) and a multiselect holding the same list of layers."""
    n_layers = num_layers(model)
    if report is not None:
        cols = st.columns([3, 1, 1])
        cols[0].selectbox("Preset", list(PRESETS), key="influence_preset",
                          help="\n".join(f"- **{k}**: {v[1]}" for k, v in PRESETS.items()))
        cols[1].number_input("n", 1, n_layers - 1, min(6, n_layers - 1), key="influence_n")
        cols[2].button("Apply preset", key="influence_apply", on_click=on_preset, args=(report,), width="stretch")
        if error := st.session_state.pop(PRESET_ERROR, None):
            st.error(error, icon=":material/error:")
    st.session_state["influence_layers"] = _ui.selection()
    st.multiselect("Layers to drop", list(range(n_layers)), key="influence_layers",
                   on_change=on_multiselect)
    layers = _ui.selection()
    if len(layers) == n_layers:
        st.error("That drops every layer: keep at least one.", icon=":material/error:")
    elif layers:
        reason = st.session_state.get(REASON)
        st.success(f"Selected: **{_ui.selection_text(model, layers)}**" + (f"  \n{reason}" if reason else ""))
        st.page_link("pages/recover.py", label="Next: calibrate and recover", icon=":material/arrow_forward:")


_ui.require_frame(__file__)
st.title("Influence")
st.write("Which layers change the residual stream least? Compute the criteria on a little text, then "
         "click bars, use a preset or pick layers by hand.")
lm = _ui.require_model()
influence_form(_ui.deployment(), num_layers(lm.model))
measured = _ui.answer(_ui.INFLUENCE, "Measuring layer influence")
report = measured.report if measured else None
if report is not None:
    charts(report)
pickers(lm.model, report)

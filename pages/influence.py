"""Influence page: how much each layer and block changes the stream, and which layers to drop."""

import streamlit as st

from ghosted.models.architecture import num_layers
from ghosted.experiments.spec import CalibrationSpec
from ghosted.selection.criteria import CRITERIA, RECOVERABILITY, InfluenceConfig, influence
from ghosted.selection.rules import select
from pages import _charts, _text, _ui

HELDOUT_WINDOWS = 4  # held-out windows drawn when a criterion needs them (cost "heldout")
DEFAULT_CRITERIA = ("streamline_cosine", "angular_all", "block_influence", "recoverability")
REASON, PRESET_ERROR = _ui.REASON, "ghosted.preset_error"
PRESETS = {  # preset -> (criterion, what it picks)
    "Streamline block of n": ("streamline_cosine", "the contiguous block whose input and output are most alike"),
    "ShortGPT n": ("block_influence", "the n layers with the lowest Block Influence, anywhere"),
    "most recoverable block of n": ("recoverability", "the contiguous block a ghost operator restores best"),
}


def criterion_label(name: str) -> str:
    """A criterion with who defined it and, when it is slow, why."""
    c = CRITERIA[name]
    cost = {"pass": "", "heldout": ", + held-out pass", "per-layer": ", slow: a pass per layer",
            "gradient": ", slow: a backward pass"}[c.cost]
    return f"{name} ({c.origin}{cost})"


def influence_form(cfg, n_layers: int) -> dict:
    """Text, size and criteria of the measurement; the job runs on the rerun after submit."""
    kind = _text.text_kind(cfg, "bundled:news", "influence", "Text to measure on")
    with st.form("influence_form"):
        text = _text.text_inputs(cfg, kind, "influence")
        cols = st.columns(3)
        n_seqs = cols[0].number_input("Sequences", 1, 1024, 16, key="influence_seqs")
        seq_len = cols[1].number_input("Sequence length", 8, 8192, 128, step=64, key="influence_len")
        rec_n = cols[2].multiselect("Block sizes n for recoverability", list(range(1, n_layers)),
                                    key="influence_rec_n", default=[min(6, n_layers - 1)],
                                    help="a ghost fit per block: each n adds memory and time")
        metrics = st.multiselect("Criteria", list(CRITERIA), default=list(DEFAULT_CRITERIA),
                                 key="influence_metrics", format_func=criterion_label)
        if not cfg.allow_costly_criteria:
            st.caption(f"The {cfg.name} deployment does not compute the slow criteria (removal perplexity, "
                       "Taylor+, SLEB).")
        st.form_submit_button("Compute influence", type="primary", key="influence_run", disabled=_ui.busy(),
                              on_click=_ui.start_job, args=("influence",))
    return {"text": text, "n_seqs": int(n_seqs), "seq_len": int(seq_len), "rec_n": rec_n, "metrics": metrics}


def compute(lm, form: dict, progress) -> dict:
    """Every chosen criterion from one influence call: similarities for every n, recoverability (the
    criteria whose Gram blocks grow with n) for the chosen n only."""
    if not form["metrics"]:
        raise ValueError("Choose at least one criterion.")
    if set(form["metrics"]) & RECOVERABILITY and not form["rec_n"]:
        raise ValueError("Recoverability needs at least one block size n.")
    heldout = HELDOUT_WINDOWS if any(CRITERIA[m].cost == "heldout" for m in form["metrics"]) else 0
    _ui.deployment().check_criteria(form["metrics"])  # demo: no pass per layer, no backward pass
    _ui.deployment().check_calibration(form["n_seqs"], form["seq_len"], heldout)
    progress("tokenising", 0, 1)
    text = form["text"]()
    calibration = CalibrationSpec(source=_text.source_name(text), count=form["n_seqs"], length=form["seq_len"],
                                  heldout=heldout, seed=0)
    fit, held = calibration.windows(lm.tokenizer, text=text)
    config = InfluenceConfig(metrics=list(form["metrics"]), recoverability_n_values=sorted(form["rec_n"]) or None)
    report = influence(lm.model, fit, config, heldout=held, progress=progress)
    return {"model": _ui.current_key(), "report": report, "protocol": fit.protocol}


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
        layers, reason = select(report, metric, n)
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

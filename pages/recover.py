"""Calibrate & recover page: gather statistics once, fit every chosen method, keep the run."""

import streamlit as st

from ghosted.service.frontend import (METHODS, RECOVERY, format_layers, help_text, lessons, num_layers,
                                          offered_range, setting_choices, with_role, workbench as wb)
from pages import _restore, _text, _ui

DEFAULTS = wb.FitRequest()  # the page's defaults: what the precompute script stores
METHOD_HELP = help_text(with_role(METHODS, RECOVERY))  # from the registry, ghosted.recovery.methods
AUTO_NOTE = ("**ghost-auto** is the default: per gap it keeps the paper's fit (**ghost**), the sink-robust one "
             "(**ghost-robust**) or no operator, whichever predicts the held-out calibration windows better "
             "(next-token loss), so it is never worse there than plain pruning. "
             "On the reproduction grid it was never worse than the paper's fit beyond noise, and far better where "
             "an attention sink is born inside the removed block (see the Learn page).")


def settings_form(cfg, model, layers: list[int]) -> None:
    """Calibration settings; a click queues the run (``request``)."""
    fittable = with_role(METHODS, RECOVERY)
    _restore.place(_restore.CALIBRATION_KEYS)  # an opened link's settings
    kind = _text.text_kind(cfg, "bundled:news", "calib", "Calibration text")
    with st.form("calibrate_form"):
        text = _text.text_inputs(cfg, kind, "calib")
        cols = st.columns(4)
        calib_seqs = cols[0].number_input("Sequences", *offered_range("calib_seqs"), DEFAULTS.calib_seqs,
                                          key="calib_seqs", help="windows the operators are fitted on")
        seq_len = cols[1].number_input("Sequence length", *offered_range("seq_len"), DEFAULTS.seq_len, step=64,
                                       key="seq_len")
        heldout_seqs = cols[2].number_input("Held-out sequences", *offered_range("heldout_seqs"), DEFAULTS.heldout_seqs,
                                            key="heldout_seqs", help="extra windows never fitted: the held-out errors")
        seed = cols[3].number_input("Seed", *offered_range("seed"), DEFAULTS.seed, key="seed",
                                    help="which windows are drawn")
        if cfg.max_calib_tokens:
            st.caption(f"This deployment allows at most {cfg.max_calib_tokens:,} calibration tokens.")
        st.markdown(AUTO_NOTE)
        methods = st.multiselect("Methods to fit (the plainly pruned model is always included)", fittable,
                                 key="methods", help=METHOD_HELP,
                                 default=[m for m in DEFAULTS.methods if m in fittable])
        ghost_mode = st.radio("Ghost mode", setting_choices("ghost_mode"), horizontal=True, key="ghost_mode",
                              help="independent: every gap fitted on the dense model (paper); sequential: "
                                   "each gap fitted on the model already pruned and patched upstream")
        with st.expander("Advanced"):
            batch_size = st.number_input("Batch size (windows per forward pass)", *offered_range("batch_size"),
                                         DEFAULTS.batch_size, key="batch_size")
            granularity = st.radio("Operators", setting_choices("granularity"), horizontal=True, key="granularity",
                                   help="one per contiguous block, or one per removed layer")
        st.form_submit_button("Calibrate and fit", type="primary", key="calibrate_run", disabled=_ui.busy(_ui.RUN),
                              on_click=_ui.start_job, args=("calibrate",))
    choices = dict(calib_seqs=int(calib_seqs), seq_len=int(seq_len), heldout_seqs=int(heldout_seqs), seed=int(seed),
                   methods=tuple(methods), ghost_mode=ghost_mode, batch_size=int(batch_size), granularity=granularity)
    _ui.queue_clicked("calibrate", _ui.RUN, lambda: request(cfg, model, layers, text(), choices))


def request(cfg, model, layers: list[int], text, choices: dict) -> wb.FitRequest:
    """The run asked for, checked against the model and the deployment."""
    asked = wb.FitRequest(model=_ui.current_key(), text=text, layers=tuple(layers), **choices)
    asked.check(cfg, num_layers(model))
    return asked


def summary(stored: wb.FittedRun) -> None:
    """What the last run fitted, how well, and how long it took."""
    run, proto = stored.run, stored.protocol
    st.subheader(f"Run: layers {format_layers(stored.layers)} dropped")
    st.caption(f"Fitted on {proto['n_windows']} x {proto['seq_len']} tokens of {proto['source']} "
               f"({proto['part']} part, seed {proto.get('seed')}); {stored.seconds:.1f} s in all"
               + "".join(f"; {name} statistics {how}" for name, how in getattr(run, "statistics", {}).items())
               + ".")
    told = lessons.fit_summary(stored)
    st.dataframe(told.errors, hide_index=True)
    st.caption("Share of the discrepancy ‖Δ‖² each operator removes on the fitted windows and on the "
               "held-out ones (100 % = the removed layers fully restored, 0 % = plain pruning, below 0 = worse).")
    if told.sinks_below_zero:
        st.info(f"{', '.join(told.sinks_below_zero)}: below 0 because they treat the attention-sink tokens apart "
                "(each window's first token, whose stream is far larger than the rest) and map them to a constant, "
                "which leaves more of ‖Δ‖² on those few tokens than plain pruning. ‖Δ‖² is not what they optimise "
                "(ghost-auto keeps a fit only when it lowers the next-token loss on held-out windows): judge them "
                "by perplexity on the Compare page.", icon=":material/info:")
    for message in run.warnings:  # ill-conditioned fits, one per gap
        st.warning(message, icon=":material/warning:")
    if told.overfits and not run.warnings:
        st.warning(f"Only {told.tokens:,} calibration tokens for a {told.width}-wide stream: the {told.width} x "
                   f"{told.width} operators overfit (good on the fitted windows, poor on held-out ones). Use at "
                   f"least {told.wanted:,} tokens, e.g. more sequences.", icon=":material/warning:")
    st.page_link("pages/compare.py", label="Next: compare perplexity, spectra and generations",
                 icon=":material/arrow_forward:")


_ui.require_frame(__file__)
st.title("Calibrate & recover")
lm = _ui.require_model()
layers = _ui.selection()
if layers:
    st.info(f"Layers to drop: **{_ui.selection_text(lm.model, layers)}**", icon=":material/content_cut:")
else:
    st.warning("No layers selected yet. Pick them on the Influence page first.", icon=":material/content_cut:")
    st.page_link("pages/influence.py", label="Choose layers", icon=":material/insights:")
settings_form(_ui.deployment(), lm.model, layers)
if (_ui.answer(_ui.RUN, "Calibrating and fitting")) and (stored := _ui.current_run()):
    summary(stored)

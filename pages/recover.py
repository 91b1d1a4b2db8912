"""Calibrate & recover page: gather statistics once, fit every chosen method, keep the run."""

import time

import streamlit as st

from ghosted.models.architecture import hidden_size
from ghosted.recovery.methods import RECOVERY, help_text, with_role
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.pruning import format_layers
from ghosted.experiments.run import fit_spec
from ghosted.recovery.fitting import METHODS
from pages import _charts, _text, _ui

DEFAULT_METHODS = ("ghost-auto", "ghost", "replaceme-ls")  # the default, the paper's fit, its closest baseline
METHOD_HELP = help_text(with_role(METHODS, RECOVERY))  # from the registry, ghosted.recovery.methods
AUTO_NOTE = ("**ghost-auto** is the default: per gap it keeps the paper's fit (**ghost**), the sink-robust one "
             "(**ghost-robust**) or no operator, whichever predicts the held-out calibration windows better "
             "(next-token loss), so it is never worse there than plain pruning. "
             "On the reproduction grid it was never worse than the paper's fit beyond noise, and far better where "
             "an attention sink is born inside the removed block (see the Learn page).")


def settings_form(cfg) -> dict | None:
    """Calibration settings; returns them (with a text resolver) when the form is submitted."""
    fittable = with_role(METHODS, RECOVERY)
    kind = _text.text_kind(cfg, "bundled:news", "calib", "Calibration text")
    with st.form("calibrate_form"):
        text = _text.text_inputs(cfg, kind, "calib")
        cols = st.columns(4)
        n_seqs = cols[0].number_input("Sequences", 1, 4096, 32, key="calib_n",
                                      help="windows the operators are fitted on")
        seq_len = cols[1].number_input("Sequence length", 8, 8192, 128, step=64, key="calib_len")
        heldout = cols[2].number_input("Held-out sequences", 0, 1024, 4, key="calib_heldout",
                                       help="extra windows never fitted: the held-out errors")
        seed = cols[3].number_input("Seed", 0, 2**31 - 1, 0, key="calib_seed", help="which windows are drawn")
        if cfg.max_calib_tokens:
            st.caption(f"This deployment allows at most {cfg.max_calib_tokens:,} calibration tokens.")
        st.markdown(AUTO_NOTE)
        methods = st.multiselect("Methods to fit (the plainly pruned model is always included)", fittable,
                                 key="calib_methods", help=METHOD_HELP,
                                 default=[m for m in DEFAULT_METHODS if m in fittable])
        mode = st.radio("Ghost mode", ["independent", "sequential"], horizontal=True,
                        help="independent: every gap fitted on the dense model (paper); sequential: "
                             "each gap fitted on the model already pruned and patched upstream")
        with st.expander("Advanced"):
            batch = st.number_input("Batch size (windows per forward pass)", 1, 256, 4)
            granularity = st.radio("Operators", ["auto", "block", "layer"], horizontal=True,
                                   help="one per contiguous block, or one per removed layer")
        st.form_submit_button("Calibrate and fit", type="primary", key="calibrate_run", disabled=_ui.busy(),
                              on_click=_ui.start_job, args=("calibrate",))
    return dict(text=text, n_seqs=int(n_seqs), seq_len=int(seq_len), heldout=int(heldout), seed=int(seed),
                methods=list(methods), mode=mode, batch=int(batch), granularity=granularity)


def calibrate(lm, layers: list[int], form: dict, progress) -> _ui.StoredRun:
    """Windows, statistics and every method's operator; plain frames for display."""
    cfg = _ui.deployment()
    _ui.check_selection(lm.model, layers)
    cfg.check_calibration(form["n_seqs"], form["seq_len"], form["heldout"])
    source = form["text"]()
    started = time.perf_counter()
    methods = ["none", *form["methods"]]
    spec = ExperimentSpec().with_options(  # the same spec `python -m ghosted run` builds from its flags
        model=lm.source, calib=_text.source_name(source), calib_seqs=form["n_seqs"], seq_len=form["seq_len"],
        heldout_seqs=form["heldout"], seed=form["seed"], drop=format_layers(layers), methods=["dense", *methods],
        ghost_mode=form["mode"], granularity=form["granularity"], batch_size=form["batch"], device=lm.device,
        dtype=lm.dtype, cache=cfg.allow_local_paths)  # a public demo writes nothing to disk
    progress("tokenising", 0, 1)
    windows = {}
    run = fit_spec(spec, lm, layers, progress, text=source,
                   on_windows=lambda fit, held: windows.update(fit=fit, held=held))
    fit, held = windows["fit"], windows["held"]
    progress("spectra and errors", 0, 1)
    frames = {"errors": run.errors(), "spectra": run.spectra(), "asymmetry": run.asymmetry(),
              "sinks": run.sinks, "token_shares": run.token_shares(), "sink_spectra": run.sink_spectra(),
              "positions": run.position_shares(), "choices": run.choices()}
    return _ui.StoredRun(model=_ui.current_key(), run=run, config=spec, methods=methods, layers=layers,
                         frames=frames, protocol=fit.protocol, heldout_protocol=held.protocol if held else None,
                         seconds=time.perf_counter() - started)


def summary(stored: _ui.StoredRun) -> None:
    """What the last run fitted, how well, and how long it took."""
    run, proto = stored.run, stored.protocol
    st.subheader(f"Run: layers {format_layers(stored.layers)} dropped")
    st.caption(f"Fitted on {proto['n_windows']} x {proto['seq_len']} tokens of {proto['source']} "
               f"({proto['part']} part, seed {proto.get('seed')}); {stored.seconds:.1f} s in all"
               + "".join(f"; {name} statistics {how}" for name, how in getattr(run, "statistics", {}).items())
               + ".")
    st.dataframe(_charts.error_table(stored.frames["errors"], run), hide_index=True)
    st.caption("Share of the discrepancy ‖Δ‖² each operator removes on the fitted windows and on the "
               "held-out ones (100 % = the removed layers fully restored, 0 % = plain pruning, below 0 = worse).")
    tokens, width = proto["n_windows"] * proto["seq_len"], hidden_size(run.results["none"].model)
    for message in run.warnings:  # ill-conditioned fits, one per gap
        st.warning(message, icon=":material/warning:")
    if tokens < 4 * width and not run.warnings:
        st.warning(f"Only {tokens:,} calibration tokens for a {width}-wide stream: the {width} x {width} "
                   "operators overfit (good on the fitted windows, poor on held-out ones). Use at least "
                   f"{4 * width:,} tokens, e.g. more sequences.", icon=":material/warning:")
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
form = settings_form(_ui.deployment())
result = _ui.run_job("calibrate", "Calibrating and fitting",
                     lambda progress: calibrate(lm, layers, form, progress))
if result:
    _ui.store_run(result)
    st.rerun()
if stored := _ui.current_run():
    summary(stored)

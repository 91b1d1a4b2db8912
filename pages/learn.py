"""Learn page: the method step by step, each step shown with the user's own run."""

import streamlit as st

from ghosted.models.architecture import hidden_size, num_layers
from ghosted.models.pruning import format_layers
from pages import _charts, _ui


def step_stream(lm, influence: dict | None) -> None:
    """What flows between layers, with the user's per-layer influence when computed."""
    st.header("1 · The residual stream")
    n, d = num_layers(lm.model), hidden_size(lm.model)
    st.markdown(f"Each token travels through the model as a vector of **{d}** numbers, the *residual "
                f"stream*. Each of the **{n}** layers reads it and adds an update (attention, then MLP):")
    st.latex(r"h_{\ell+1} = h_\ell + f_\ell(h_\ell)")
    st.markdown("So a layer that adds little can be removed, and its neighbours still read a stream "
                "of the same shape.")
    report = influence["report"] if influence else None
    if report is not None and len(report.layers):
        metrics = list(dict.fromkeys(report.layers.metric))
        metric = "block_influence" if "block_influence" in metrics else metrics[0]
        st.plotly_chart(_charts.layer_bars(report.layers, metric, _ui.selection()), key="learn_layers")
        st.caption(f"Your model: {metric} per layer (Influence page). Low bars change the stream least.")
    else:
        st.caption("Compute the influence of each layer on the Influence page to see it for your model.")


def step_pruning(lm, stored: dict, evaluated: dict | None) -> None:
    """The discrepancy Δ a gap leaves, sized on the user's tokens and perplexities."""
    st.header("2 · What pruning breaks")
    errors, spectra = stored["frames"]["errors"], stored["frames"]["spectra"]
    boundary = spectra.boundary.iloc[0]
    start, end = (int(i) for i in boundary.split("-"))
    fit = errors[errors.split == "fit"]
    tokens = int(fit.tokens.iloc[0]) if "tokens" in fit else stored["protocol"]["tokens"]
    gaps = errors.boundary.nunique()
    where = f" (the first of your {gaps} gaps)" if gaps > 1 else ""
    st.markdown(f"You removed layers **{format_layers(stored['layers'])}**. Layer {end} used to receive "
                f"the stream *Y* after layers {start}-{end - 1}{where}; now it receives *X*, the stream "
                "before them. What it misses is the discrepancy")
    st.latex(r"\Delta = Y - X \qquad (%d \text{ tokens} \times %d \text{ numbers on your calibration text})"  # noqa: UP031
             % (tokens, hidden_size(lm.model)))
    if evaluated:
        ppl = evaluated["table"].set_index("variant").perplexity
        st.markdown(f"Without Δ, perplexity goes from **{ppl['dense']:.2f}** (dense) to "
                    f"**{ppl['pruned']:.2f}** (pruned) on your evaluation text.")
    else:
        st.caption("Evaluate perplexity on the Compare page to see what this costs in perplexity.")
    accuracy_cost(stored)
    delta = spectra[(spectra.boundary == boundary) & (spectra.method == "pruned")].singular_value
    energy = (delta**2).cumsum() / (delta**2).sum()
    top = int((energy < 0.9).sum()) + 1
    spread = "spread over many directions" if top > len(delta) // 10 else "concentrated in a few directions"
    st.markdown(f"On your tokens Δ is {spread}: **{top}** of its {len(delta)} directions carry 90 % of "
                "‖Δ‖² (the grey curve in step 3).")


def accuracy_cost(stored: dict) -> None:
    """What pruning (and each recovery) costs in zero-shot answers, from the user's own scores."""
    scored = _charts.zeroshot_of(st.session_state, stored)
    if not scored or scored["frame"].empty:
        st.caption("Score zero-shot accuracy on the Compare page (bundled-lastword works offline) to see what "
                   "this costs in answers, not only in perplexity.")
        return
    table = _charts.accuracy_table(scored["frame"]).set_index("variant")
    column = "average" if "average" in table else table.columns[0]
    what = "averaged over your tasks" if column == "average" else f"on {column}"
    acc = table[column]
    if "dense" not in acc or "pruned" not in acc:
        return
    recovered = [v for v in acc.index if v not in ("dense", "pruned")]
    text = (f"In answers, {what}: accuracy goes from **{acc['dense']:.1f} %** (dense) to "
            f"**{acc['pruned']:.1f} %** (pruned)")
    text += ("; recovered: " + ", ".join(f"{v} **{acc[v]:.1f} %**" for v in recovered)) if recovered else ""
    st.markdown(text + ".")


def step_least_squares(stored: dict) -> None:
    """The normal equations and what their solution did on the user's run."""
    st.header("3 · The least-squares problem and its closed form")
    st.markdown("Look for a linear map that puts Δ back from what the next layer still sees, X:")
    st.latex(r"\min_M \|XM - \Delta\|_F^2 + \varepsilon\|M\|_F^2 \;\Rightarrow\; (X^\top X + \varepsilon I)\,M "
             r"= X^\top \Delta, \qquad W = I + M")
    st.markdown("Only the d x d matrices XᵀX and XᵀΔ are needed, accumulated over every calibration "
                "token in float64, then one linear solve: no gradient, no training.")
    table = _charts.removed_table(stored["frames"]["errors"]).set_index("method")
    if "ghost" in table.index:
        row, solve = table.loc["ghost"], stored["run"].results["ghost"].solve_seconds
        held = f" and **{row['heldout']:.1%}** on held-out tokens" if "heldout" in row else ""
        st.markdown(f"On your run the solve took **{solve:.2f} s** and W removes **{row['fit']:.1%}** of "
                    f"‖Δ‖² on the tokens it was fitted on{held}.")
    else:
        st.warning("Your run has no ghost operator: add 'ghost' to the methods on Calibrate & recover.")
    spectra = stored["frames"]["spectra"]
    st.plotly_chart(_charts.spectra_lines(spectra, spectra.boundary.iloc[0]), key="learn_spectra")
    st.caption("Singular values of Δ (pruned) and of what each method leaves over, on your calibration tokens.")


def step_restricted(stored: dict) -> None:
    """Why smaller families of maps (LinearPatch, ReplaceMe) leave more of Δ behind."""
    st.header("4 · Why restricted operators do worse")
    st.markdown("Other training-free methods search a smaller family of maps: LinearPatch scales "
                "channels (a diagonal, possibly in a Hadamard basis: a symmetric map); ReplaceMe changes "
                "only one layer's MLP output. The closed form above is the best of *all* linear maps "
                "on the stream, so on the fitted tokens a smaller family can only do as well or worse.")
    st.caption("Smaller families also cost fewer parameters: the Compare page's recovery frontier plots, for "
               "every method you fitted, parameters added against perplexity (closed form and trained apart).")
    errors = stored["frames"]["errors"]
    methods = set(errors.method) - {"pruned"}
    if len(methods) > 1:
        st.plotly_chart(_charts.removed_bars(errors), key="learn_removed")
    else:
        st.warning("Fit a baseline too (e.g. replaceme-ls or linearpatch-rotate) to compare it here.")
    asym = stored["frames"]["asymmetry"]
    ghost = asym[asym.method == "ghost"] if len(asym) else asym
    if len(ghost):
        share = float(ghost.energy_ratio.iloc[0])
        st.markdown(f"Part of the reason: **{share:.0%}** of the energy of your M = W − I is anti-symmetric "
                    "(a rotation-like part, M ≠ Mᵀ). A diagonal or symmetric operator cannot express it.")


def step_sinks(stored: dict, evaluated: dict | None) -> None:
    """The attention sink: one token that can carry most of Δ, and what the robust fit does about it."""
    st.header("5 · One token can carry the whole mismatch: the attention sink")
    frames = stored["frames"]
    shares, positions, spectra = frames.get("token_shares"), frames.get("positions"), frames.get("sink_spectra")
    if shares is None or not len(shares):
        st.caption("Run a calibration again to see the sink analysis of your run.")
        return
    boundary = shares.boundary.iloc[0]
    sink = shares[(shares.boundary == boundary) & (shares.tokens == "sink")].iloc[0]
    other = shares[(shares.boundary == boundary) & (shares.tokens == "other")].iloc[0]
    st.markdown("Many models park a huge activation on the first token of every text, an *attention "
                "sink* that other tokens attend to when they have nothing better to do. Its residual "
                "stream can be a hundred times longer than any other token's.")
    report = frames.get("sinks")
    if report is not None and len(report):
        row = report[report.boundary == boundary].iloc[0]
        st.markdown(f"On your calibration text at boundary {boundary}, the sink tokens (position 0) have an RMS "
                    f"norm of **{row.sink_rms_norm_x:,.0f}** before the removed layers and "
                    f"**{row.sink_rms_norm_y:,.0f}** after them; the other tokens **{row.other_rms_norm_x:,.0f}** "
                    f"and **{row.other_rms_norm_y:,.0f}**.")
    ratio = sink.per_token_share / max(other.per_token_share, 1e-300)
    times = f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.1f}"
    st.markdown(f"The **{int(sink['count'])}** sink tokens ({sink['count'] / (sink['count'] + other['count']):.1%} "
                f"of the tokens) carry **{sink.delta_share:.1%}** of ‖Δ‖²: each one **{times}** times as much as "
                "an ordinary token.")
    if positions is not None and len(positions):
        st.plotly_chart(_charts.position_share_bars(positions, boundary), key="learn_positions")
    if spectra is not None and len(spectra):
        st.plotly_chart(_charts.sink_spectra_lines(spectra, boundary), key="learn_sink_spectra")
        st.caption("If the red curve (sinks only) sits on top of the grey one (all tokens), the largest "
                   "directions of Δ belong to the sink: a least-squares fit over all tokens spends itself "
                   "on them.")
    if sink.delta_share > 0.5:
        st.markdown("Least squares minimises the *sum* of squared errors, so here it mostly fits the sink: "
                    "W bends to move one vector and every ordinary token pays for it. **ghost-robust** fits W "
                    "on the ordinary tokens only and gives the sink its own map (the mean of its target, "
                    "which barely changes between texts); **ghost-auto** picks, per gap, the paper's fit, the "
                    "robust one or no operator at all, whichever has the lower next-token loss on held-out "
                    "calibration windows, so it is never worse than plain pruning there.")
    else:
        st.markdown("Here the sink carries a modest share of Δ, so the paper's fit is not dominated by it; "
                    "the robust fit and the paper's should give similar results.")
    fitted = [m for m in ("ghost", "ghost-robust", "ghost-auto") if m in stored["methods"]]
    if evaluated and len(fitted) > 1:
        ppl = evaluated["table"].set_index("variant").perplexity
        st.markdown("Your perplexities: " + ", ".join(f"{m} **{ppl[m]:.2f}**" for m in fitted if m in ppl) + ".")
    elif "ghost-robust" not in fitted and "ghost-auto" not in fitted:
        st.info("Fit ghost-robust or ghost-auto next to ghost on Calibrate & recover to compare them.")
    choices = frames.get("choices")
    if choices is not None and len(choices) and "chosen" in choices:
        st.dataframe(choices[choices.method == "ghost-auto"][["boundary", "chosen", "reason"]], hide_index=True)


_ui.require_frame(__file__)
st.title("Learn: how ghost layers work")
lm = _ui.require_model()
stored = _ui.stored(_ui.RUN)
step_stream(lm, _ui.stored(_ui.INFLUENCE))
if not stored:
    st.info("The next steps use your own numbers: pick layers to drop and run a calibration first "
            "(a small one takes seconds).", icon=":material/healing:")
    st.page_link("pages/recover.py", label="Calibrate & recover", icon=":material/arrow_forward:")
    st.stop()
evaluated = _ui.evaluation_of(stored)
step_pruning(lm, stored, evaluated)
step_least_squares(stored)
step_restricted(stored)
step_sinks(stored, evaluated)

"""Learn page: the method step by step, each step shown with the user's own run.

The explanations are Markdown files in ``assets/learn/`` (one per step); this page picks the parts that
apply and fills them with the numbers of the stored run (``pages/_assets.learn``).
"""

import streamlit as st

from ghosted.experiments.frontend import (directions_holding, format_layers, hidden_size, num_layers, parse_layers,
                                         removed_shares, workbench as wb)
from pages import _assets, _charts, _fidelity, _ui

ENERGY_SHARE = 0.9  # "k directions carry 90 % of ‖Δ‖²"


def say(step: str, part: str, **numbers) -> str:
    """A part of a Learn step filled with the user's numbers (``assets/learn/<step>.md``)."""
    return _assets.learn(step, part, **numbers)


def step_stream(lm, influence: wb.Influence | None) -> None:
    """What flows between layers, with the user's per-layer influence when computed."""
    st.header("1 · The residual stream")
    st.markdown(say("stream", "intro", width=hidden_size(lm.model), layers=num_layers(lm.model)))
    st.latex(r"h_{\ell+1} = h_\ell + f_\ell(h_\ell)")
    st.markdown(say("stream", "consequence"))
    report = influence.report if influence else None
    if report is not None and len(report.layers):
        metrics = list(dict.fromkeys(report.layers.metric))
        metric = "block_influence" if "block_influence" in metrics else metrics[0]
        st.plotly_chart(_charts.layer_bars(report.layers, metric, _ui.selection()), key="learn_layers")
        st.caption(say("stream", "influence", metric=metric))
    else:
        st.caption(say("stream", "no_influence"))


def step_pruning(lm, stored: wb.FittedRun) -> None:
    """The discrepancy Δ a gap leaves, sized on the user's tokens and perplexities."""
    st.header("2 · What pruning breaks")
    errors, spectra = stored.frames["errors"], stored.frames["spectra"]
    gap = spectra.gap.iloc[0]  # the first gap, in the drop notation ("12-18")
    fit = errors[errors.split == "fit"]
    tokens = int(fit.tokens.iloc[0]) if "tokens" in fit else stored.protocol["tokens"]
    st.markdown(say("pruning", "missing", layers=format_layers(stored.layers), gap=gap,
                    end=parse_layers(gap)[-1] + 1))
    st.latex(r"\Delta = Y - X \qquad (%d \text{ tokens} \times %d \text{ numbers on your calibration text})"  # noqa: UP031
             % (tokens, hidden_size(lm.model)))
    if (gaps := errors.gap.nunique()) > 1:
        st.markdown(say("pruning", "gaps", gaps=gaps))
    if stored.evaluation:
        ppl = stored.evaluation.table.set_index("label").ppl
        st.markdown(say("pruning", "perplexity", dense=ppl["dense"], pruned=ppl["pruned"]))
    else:
        st.caption(say("pruning", "no_perplexity"))
    accuracy_cost(stored)
    delta = spectra[(spectra.gap == gap) & (spectra.method == "pruned")].singular_value
    top = directions_holding(delta, ENERGY_SHARE)
    st.markdown(say("pruning", "spread" if top > len(delta) // 10 else "concentrated", top=top,
                    directions=len(delta), share=ENERGY_SHARE))


def accuracy_cost(stored: wb.FittedRun) -> None:
    """What pruning (and each recovery) costs in zero-shot answers, from the user's own scores."""
    scored = stored.zeroshot
    if not scored or scored.frame.empty:
        st.caption(say("pruning", "no_accuracy"))
        return
    table = _charts.accuracy_table(scored.frame).set_index("label")
    column = "average" if "average" in table else table.columns[0]
    acc = table[column]
    if "dense" not in acc or "pruned" not in acc:
        return
    scope = "averaged over your tasks" if column == "average" else column
    text = say("pruning", "accuracy", scope=scope, dense=acc["dense"], pruned=acc["pruned"])
    recovered = [v for v in acc.index if v not in ("dense", "pruned")]
    if recovered:
        listing = ", ".join(f"{v} **{acc[v]:.1f} %**" for v in recovered)
        text += " " + say("pruning", "accuracy_recovered", recovered=listing)
    st.markdown(text)


def step_least_squares(stored: wb.FittedRun) -> None:
    """The normal equations and what their solution did on the user's run."""
    st.header("3 · The least-squares problem and its closed form")
    st.markdown(say("least_squares", "intro"))
    st.latex(r"\min_M \|XM - \Delta\|_F^2 + \varepsilon\|M\|_F^2 \;\Rightarrow\; (X^\top X + \varepsilon I)\,M "
             r"= X^\top \Delta, \qquad W = I + M")
    width = hidden_size(stored.run.results["none"].model)
    st.markdown(say("least_squares", "statistics", width=width))
    table = removed_shares(stored.frames["errors"]).set_index("method")
    if "ghost" in table.index:
        row, solve = table.loc["ghost"], stored.run.results["ghost"].solve_seconds
        text = say("least_squares", "ghost", solve=solve, fit=row["fit"])
        if "heldout" in row:
            text += " " + say("least_squares", "ghost_heldout", heldout=row["heldout"])
        st.markdown(text)
    else:
        st.warning(say("least_squares", "no_ghost"))
    spectra = stored.frames["spectra"]
    st.plotly_chart(_charts.spectra_lines(spectra, spectra.gap.iloc[0]), key="learn_spectra")
    st.caption(say("least_squares", "spectra"))


def step_restricted(stored: wb.FittedRun) -> None:
    """Why smaller families of maps (LinearPatch, ReplaceMe) leave more of Δ behind."""
    st.header("4 · Why restricted operators do worse")
    st.markdown(say("restricted", "intro"))
    errors = stored.frames["errors"]
    if len(set(errors.method) - {"pruned"}) > 1:
        st.plotly_chart(_charts.removed_bars(errors), key="learn_removed")
    else:
        st.warning(say("restricted", "one_method"))
    asym = stored.frames["asymmetry"]
    ghost = asym[asym.method == "ghost"] if len(asym) else asym
    if len(ghost):
        st.markdown(say("restricted", "asymmetry", share=float(ghost.energy_ratio.iloc[0])))


def step_frontier(stored: wb.FittedRun) -> None:
    """Parameters added against perplexity for every fitted method, closed form and trained apart."""
    st.header("5 · The recovery frontier: what each recovery costs in size")
    width = hidden_size(stored.run.results["none"].model)
    st.markdown(say("frontier", "intro", full=width * width, width=width))
    fitted = [m for m in stored.methods if m != "none"]
    table = stored.evaluation.table if stored.evaluation else None
    if len(fitted) < 2:
        st.info(say("frontier", "one_method"), icon=":material/scatter_plot:")
        return
    if table is None or "parameters" not in table:
        st.caption(say("frontier", "not_evaluated", count=len(fitted)))
        return
    st.plotly_chart(_charts.frontier_scatter(table), key="learn_frontier")
    st.caption(say("frontier", "caption"))
    points = _charts.frontier_points(table)
    pruned = float(table.set_index("label").ppl["pruned"])
    closed, trained = (points[points.fit == fit].nsmallest(1, "ppl") for fit in ("closed form", "trained"))
    text = [say("frontier", "closed_form", pruned=pruned, **best_of(closed))] if len(closed) else []
    text.append(say("frontier", "trained", **best_of(trained)) if len(trained) else say("frontier", "no_trained"))
    st.markdown(" ".join(text))


def best_of(points) -> dict:
    """The numbers of a frontier point (a one-row frame of ``frontier_points``) for its sentence."""
    row = points.iloc[0]
    return {"method": row.label, "perplexity": float(row.ppl), "added": int(row["parameters added"])}


def step_sinks(stored: wb.FittedRun) -> None:
    """The attention sink: one token that can carry most of Δ, and what the robust fit does about it."""
    st.header("6 · One token can carry the whole mismatch: the attention sink")
    frames = stored.frames
    shares, positions, spectra = frames.get("token_shares"), frames.get("positions"), frames.get("sink_spectra")
    if shares is None or not len(shares):
        st.caption(say("sinks", "no_report"))
        return
    gap = shares.gap.iloc[0]
    sink = shares[(shares.gap == gap) & (shares.tokens == "sink")].iloc[0]
    other = shares[(shares.gap == gap) & (shares.tokens == "other")].iloc[0]
    st.markdown(say("sinks", "intro"))
    report = frames.get("sinks")
    if report is not None and len(report):
        row = report[report.gap == gap].iloc[0]
        st.markdown(say("sinks", "norms", gap=gap, sink_x=row.sink_rms_norm_x, sink_y=row.sink_rms_norm_y,
                        other_x=row.other_rms_norm_x, other_y=row.other_rms_norm_y))
    ratio = sink.per_token_share / max(other.per_token_share, 1e-300)
    st.markdown(say("sinks", "shares", count=int(sink["count"]), share=sink.delta_share,
                    fraction=sink["count"] / (sink["count"] + other["count"]),
                    times=f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.1f}"))
    if positions is not None and len(positions):
        st.plotly_chart(_charts.position_share_bars(positions, gap), key="learn_positions")
    if spectra is not None and len(spectra):
        st.plotly_chart(_charts.sink_spectra_lines(spectra, gap), key="learn_sink_spectra")
        st.caption(say("sinks", "spectra"))
    st.markdown(say("sinks", "dominated" if sink.delta_share > 0.5 else "modest"))
    robust_perplexities(stored)
    choices = frames.get("choices")
    if choices is not None and len(choices) and "chosen" in choices:
        st.dataframe(choices[choices.method == "ghost-auto"][["gap", "chosen", "reason"]], hide_index=True)


def robust_perplexities(stored: wb.FittedRun) -> None:
    """The user's perplexities of the paper's fit and the sink-aware ones, or what to fit to see them."""
    fitted = [m for m in ("ghost", "ghost-robust", "ghost-auto") if m in stored.methods]
    if stored.evaluation and len(fitted) > 1:
        ppl = stored.evaluation.table.set_index("method").ppl
        listing = ", ".join(f"{m} **{ppl[m]:.2f}**" for m in fitted if m in ppl)
        st.markdown(say("sinks", "perplexities", listing=listing))
    elif "ghost-robust" not in fitted and "ghost-auto" not in fitted:
        st.info(say("sinks", "try_robust"))


def step_fidelity() -> None:
    """Where the cut hurts, token by token, and what each layer boundary reads, on the user's run."""
    st.header("7 · Where the cut hurts, token by token")
    st.markdown(say("fidelity", "intro"))
    _fidelity.token_section("learn")
    _fidelity.lens_section("learn")


_ui.require_frame(__file__)
st.title("Learn: how ghost layers work")
lm = _ui.require_model()
step_stream(lm, _ui.result(_ui.INFLUENCE))
run = _ui.require_run("The next steps use your own numbers")
step_pruning(lm, run)
step_least_squares(run)
step_restricted(run)
step_frontier(run)
step_sinks(run)
step_fidelity()

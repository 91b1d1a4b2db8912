"""Learn page: the method step by step, each step shown with the user's own run.

The explanations are Markdown files in ``assets/learn/`` (one per step); this page picks the parts that
apply and fills them with the numbers of the stored run (``pages/_assets.learn``).
"""

import streamlit as st

from ghosted.service.frontend import comparison, hidden_size, lessons, num_layers, workbench as wb
from pages import _assets, _charts, _fidelity, _ui


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
    if metric := lessons.stream_metric(report):
        st.plotly_chart(_charts.layer_bars(report.layers, metric, _ui.selection()), key="learn_layers")
        st.caption(say("stream", "influence", metric=metric))
    else:
        st.caption(say("stream", "no_influence"))


def step_pruning(lm, stored: wb.FittedRun) -> None:
    """The discrepancy Δ a gap leaves, sized on the user's tokens and perplexities."""
    st.header("2 · What pruning breaks")
    told = lessons.pruning(stored)
    st.markdown(say("pruning", "missing", layers=told.layers, gap=told.gap, end=told.end))
    st.latex(r"\Delta = Y - X \qquad (%d \text{ tokens} \times %d \text{ numbers on your calibration text})"  # noqa: UP031
             % (told.tokens, hidden_size(lm.model)))
    if told.gaps > 1:
        st.markdown(say("pruning", "gaps", gaps=told.gaps))
    if told.dense_ppl is not None:
        st.markdown(say("pruning", "perplexity", dense=told.dense_ppl, pruned=told.pruned_ppl))
    else:
        st.caption(say("pruning", "no_perplexity"))
    accuracy_cost(stored)
    st.markdown(say("pruning", "spread" if told.spread else "concentrated", top=told.top,
                    directions=told.directions, share=told.share))


def accuracy_cost(stored: wb.FittedRun) -> None:
    """What pruning (and each recovery) costs in zero-shot answers, from the user's own scores."""
    scored = stored.zeroshot
    if not scored or scored.frame.empty:
        st.caption(say("pruning", "no_accuracy"))
        return
    cost = lessons.accuracy_cost(scored)
    if cost is None:
        return
    text = say("pruning", "accuracy", scope=cost.scope, dense=cost.dense, pruned=cost.pruned)
    if cost.recovered:
        listing = ", ".join(f"{v} **{acc:.1f} %**" for v, acc in cost.recovered.items())
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
    if ghost := lessons.ghost_fit(stored):
        text = say("least_squares", "ghost", solve=ghost.solve, fit=ghost.fit)
        if ghost.heldout is not None:
            text += " " + say("least_squares", "ghost_heldout", heldout=ghost.heldout)
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
    if lessons.several_fits(stored):
        st.plotly_chart(_charts.removed_bars(stored.frames["errors"]), key="learn_removed")
    else:
        st.warning(say("restricted", "one_method"))
    if (share := lessons.ghost_asymmetry(stored)) is not None:
        st.markdown(say("restricted", "asymmetry", share=share))


def step_frontier(stored: wb.FittedRun) -> None:
    """Parameters added against perplexity for every fitted method, closed form and trained apart."""
    st.header("5 · The recovery frontier: what each recovery costs in size")
    width = hidden_size(stored.run.results["none"].model)
    st.markdown(say("frontier", "intro", full=width * width, width=width))
    told = lessons.frontier(stored)
    if told.fitted < 2:
        st.info(say("frontier", "one_method"), icon=":material/scatter_plot:")
        return
    if not told.evaluated:
        st.caption(say("frontier", "not_evaluated", count=told.fitted))
        return
    st.plotly_chart(_charts.frontier_scatter(stored.evaluation.table), key="learn_frontier")
    st.caption(say("frontier", "caption"))
    text = [say("frontier", "closed_form", pruned=told.pruned_ppl, **best_of(told.closed))] if told.closed else []
    text.append(say("frontier", "trained", **best_of(told.trained)) if told.trained else say("frontier", "no_trained"))
    st.markdown(" ".join(text))


def best_of(point: comparison.FrontierPoint) -> dict:
    """The numbers of a frontier point for its sentence."""
    return {"method": point.label, "perplexity": point.ppl, "added": point.added}


def step_sinks(stored: wb.FittedRun) -> None:
    """The attention sink: one token that can carry most of Δ, and what the robust fit does about it."""
    st.header("6 · One token can carry the whole mismatch: the attention sink")
    told = lessons.sinks(stored)
    if told is None:
        st.caption(say("sinks", "no_report"))
        return
    st.markdown(say("sinks", "intro"))
    if told.norms:
        st.markdown(say("sinks", "norms", gap=told.gap, sink_x=told.norms["sink_x"], sink_y=told.norms["sink_y"],
                        other_x=told.norms["other_x"], other_y=told.norms["other_y"]))
    st.markdown(say("sinks", "shares", count=told.count, share=told.share, fraction=told.fraction,
                    times=told.times))
    positions, spectra = stored.frames.get("positions"), stored.frames.get("sink_spectra")
    if positions is not None and len(positions):
        st.plotly_chart(_charts.position_share_bars(positions, told.gap), key="learn_positions")
    if spectra is not None and len(spectra):
        st.plotly_chart(_charts.sink_spectra_lines(spectra, told.gap), key="learn_sink_spectra")
        st.caption(say("sinks", "spectra"))
    st.markdown(say("sinks", "dominated" if told.dominated else "modest"))
    robust_perplexities(stored)
    choices = lessons.auto_choices(stored)
    if choices is not None:
        st.dataframe(choices, hide_index=True)


def robust_perplexities(stored: wb.FittedRun) -> None:
    """The user's perplexities of the paper's fit and the sink-aware ones, or what to fit to see them."""
    ppl = lessons.sink_aware_perplexities(stored)
    if ppl is not None:
        listing = ", ".join(f"{m} **{v:.2f}**" for m, v in ppl.items())
        st.markdown(say("sinks", "perplexities", listing=listing))
    elif lessons.needs_sink_aware(stored):
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

"""Plotly figures and display tables of the app, built from the library's tidy frames.

Nothing here computes model quantities: every number comes from ``ghosted`` (influence reports,
``RecoveryRun`` frames, perplexity results); this module only shapes and draws them.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ghosted.experiments.frontend import BASELINE_METHOD, METHODS, TRAINED_METHODS, label_of, removed_shares

PRUNED = label_of(BASELINE_METHOD)  # "pruned": the plainly pruned model's label
PALETTE = ["#1f77b4", "#ff7f0e", "#d62728", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]  # baselines
LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=360, legend=dict(orientation="h", y=-0.2))


def method_label(method: str) -> str:
    """The label users read for a method (from the registry)."""
    return label_of(method)


def heatmap(blocks: pd.DataFrame, metric: str, prune: str = "") -> go.Figure:
    """(start x n) heatmap of one block criterion: a cell is the block of n layers from ``start``."""
    grid = blocks[blocks.metric == metric].pivot_table(index="n", columns="start", values="value")
    fig = go.Figure(go.Heatmap(z=grid.values, x=list(grid.columns), y=list(grid.index), colorscale="Viridis",
                               reversescale=prune == "lowest",
                               hovertemplate="start %{x}, n %{y}: %{z:.4g}<extra></extra>"))
    hint = f" ({prune} values: drop first)" if prune else ""
    fig.update_layout(title=f"{metric}{hint}", xaxis_title="first removed layer (start)",
                      yaxis_title="layers removed (n)", **LAYOUT)
    return fig


def layer_bars(layers: pd.DataFrame, metric: str, selected: list[int], prune: str = "") -> go.Figure:
    """Per-layer criterion as bars (clickable on the Influence page); selected layers in red."""
    rows = layers[layers.metric == metric].sort_values("layer")
    colors = ["#d62728" if int(i) in selected else "#6C4AB6" for i in rows.layer]
    fig = go.Figure(go.Bar(x=rows.layer.tolist(), y=rows.value.tolist(), marker_color=colors,
                           hovertemplate="layer %{x}: %{y:.4g}<extra></extra>"))
    values = rows.value.dropna()
    wide = len(values) and values.min() > 0 and values.max() / values.min() > 20
    hint = f" ({prune} values: drop first)" if prune else ""
    fig.update_layout(title=f"{metric} per layer{hint}",
                      xaxis_title="layer", yaxis_title=metric, yaxis_type="log" if wide else "linear",
                      yaxis_dtick=1 if wide else None,
                      clickmode="event+select", **LAYOUT)
    return fig


def perplexity_bars(table: pd.DataFrame) -> go.Figure:
    """Perplexity of each variant on a log axis (pruning can raise it a hundredfold)."""
    bars = {}
    if {"ppl_low", "ppl_high"} <= set(table):  # the 95 % interval as error bars (none where unknown)
        bars["error_y"] = dict(type="data", symmetric=False, visible=True,
                               array=(table.ppl_high - table.ppl).fillna(0).tolist(),
                               arrayminus=(table.ppl - table.ppl_low).fillna(0).tolist())
    fig = go.Figure(go.Bar(x=table.label.tolist(), y=table.ppl.tolist(),
                           text=[f"{v:,.2f}" for v in table.ppl], textposition="outside",
                           marker_color=[_color(v) for v in table.label], **bars))
    fig.update_layout(title="Perplexity (lower is better; bars: 95 % interval)", yaxis_type="log",
                      yaxis_title="perplexity", **LAYOUT)
    return fig


def span(low, high, digits: int = 2) -> str:
    """An interval as "[low, high]"; "" when it is not known."""
    known = not any(v is None or pd.isna(v) for v in (low, high))
    return f"[{low:,.{digits}f}, {high:,.{digits}f}]" if known else ""


def difference_cell(row, base: str) -> str:
    """The paired Δppl from ``base`` with its interval, "ns" where the interval holds zero; "" if not measured."""
    value = row.get(f"d_{base}")
    if value is None or pd.isna(value):
        return ""
    significant = row.get(f"d_{base}_significant")
    mark = " ns" if significant is False or significant == 0 else ""  # a stored False may read back as 0
    return f"{value:+,.2f} {span(row.get(f'd_{base}_low'), row.get(f'd_{base}_high'))}{mark}".strip()


def interval_table(table: pd.DataFrame) -> pd.DataFrame:
    """The Compare page's perplexity table: perplexity with its 95 % interval, the paired differences
    from the pruned model and from ghost ("ns": not significant), KL from dense and top-1 agreement."""
    rows = [row for _, row in table.iterrows()]
    out = pd.DataFrame({"label": table.label.tolist(), "ppl": table.ppl.tolist(),
                        "95 % interval": [span(r.get("ppl_low"), r.get("ppl_high")) for r in rows],
                        f"Δ vs {PRUNED}": [difference_cell(r, BASELINE_METHOD) for r in rows],
                        "Δ vs ghost": [difference_cell(r, "ghost") for r in rows]})
    if "kl" in table:
        out["KL from dense"] = table.kl.tolist()
        out["top-1 agreement %"] = (100 * table.top1).round(2).tolist()
    out["nll"] = table.nll.tolist()
    return out if (out["Δ vs ghost"] != "").any() else out.drop(columns="Δ vs ghost")


TRAINED = TRAINED_METHODS  # fitted by gradient steps, not in closed form (the registry's closed_form)


def frontier_points(table: pd.DataFrame) -> pd.DataFrame:
    """Each fitted method's parameters added (over the pruned model) and perplexity, and how it was fitted.

    ``table``: the Compare page's evaluation table (``method``, ``label``, ``ppl``, ``parameters``).
    """
    base = table.set_index("label").loc[PRUNED, "parameters"]
    fitted = table[~table.label.isin(["dense", PRUNED])]
    return pd.DataFrame({"label": fitted.label.tolist(),
                         "parameters added": [int(n - base) for n in fitted.parameters],
                         "ppl": fitted.ppl.tolist(),
                         "fit": ["trained" if m in TRAINED else "closed form" for m in fitted.method]})


def frontier_scatter(table: pd.DataFrame) -> go.Figure:
    """The recovery frontier: parameters added against perplexity, closed-form fits and trained ones apart,
    the pruned model as the reference line (no parameters added)."""
    points = frontier_points(table)
    fig = go.Figure()
    for fit, symbol in (("closed form", "circle"), ("trained", "diamond")):
        part = points[points.fit == fit]
        fig.add_trace(go.Scatter(x=part["parameters added"].tolist(), y=part.ppl.tolist(), name=fit,
                                 mode="markers+text", text=part.label.tolist(), textposition="top center",
                                 marker=dict(symbol=symbol, size=11, color=[_color(v) for v in part.label]),
                                 hovertemplate="%{text}: %{x:,} parameters, perplexity %{y:.2f}<extra></extra>"))
    pruned = float(table.set_index("label").loc[PRUNED, "ppl"])
    fig.add_hline(y=pruned, line_dash="dot", line_color=_color(PRUNED), annotation_text="pruned, no recovery")
    fig.update_layout(title="Recovery frontier: parameters added against perplexity (lower left is better)",
                      xaxis_title="parameters added to the pruned model", yaxis_title="perplexity", **LAYOUT)
    return fig


def accuracy_table(frame: pd.DataFrame, intervals: bool = False) -> pd.DataFrame:
    """Accuracy per variant (rows, ``label``) and task (columns), in %, plus "average" over tasks when there
    are several; ``intervals``: each task's 95 % interval beside it ("<task> 95 %").

    ``frame`` is a ``ghosted.evaluation.zeroshot.TaskRun.frame``: model, task, metric, value, stderr, low,
    high (fractions).
    """
    acc = frame[frame.metric == "acc"]
    models, tasks = list(dict.fromkeys(acc.model)), list(dict.fromkeys(acc.task))
    table = acc.pivot_table(index="model", columns="task", values="value", sort=False) * 100
    table = table.reindex(index=models, columns=tasks)
    average = table.mean(axis=1)
    table = table.round(2)
    if intervals and {"low", "high"} <= set(acc):
        for task in tasks:
            rows = acc[acc.task == task].set_index("model")
            cells = [span(100 * rows.low.get(m), 100 * rows.high.get(m)) if m in rows.index else "" for m in models]
            table.insert(table.columns.get_loc(task) + 1, f"{task} 95 %", cells)
    if len(tasks) > 1:
        table["average"] = average.round(2)
    return table.rename_axis(index="label", columns=None).reset_index()


def accuracy_bars(frame: pd.DataFrame) -> go.Figure:
    """Accuracy of each variant, one group of bars per task (and the average), stderr as error bars."""
    acc = frame[frame.metric == "acc"]
    fig = go.Figure()
    tasks = list(dict.fromkeys(acc.task))
    for task in tasks:
        rows = acc[acc.task == task]
        fig.add_trace(go.Bar(x=rows.model.tolist(), y=(100 * rows.value).tolist(), name=task,
                             error_y=_accuracy_bars(rows),
                             hovertemplate="%{x}: %{y:.1f} %<extra>" + task + "</extra>"))
    if len(tasks) > 1:
        mean = acc.groupby("model", sort=False).value.mean()
        fig.add_trace(go.Bar(x=list(mean.index), y=(100 * mean).tolist(), name="average",
                             marker_color="#444", hovertemplate="%{x}: %{y:.1f} %<extra>average</extra>"))
    fig.update_layout(title="Zero-shot accuracy (higher is better; bars: 95 % interval)", barmode="group",
                      yaxis_title="accuracy (%)", yaxis_range=[0, 100], **LAYOUT)
    return fig


def _accuracy_bars(rows: pd.DataFrame) -> dict:
    """Error bars of one task's accuracies (in %): the 95 % interval; ±1.96·stderr where none is stored."""
    if {"low", "high"} <= set(rows):
        low, high = rows.low.fillna(rows.value - 1.96 * rows.stderr), rows.high.fillna(rows.value + 1.96 * rows.stderr)
    else:  # a result stored before the intervals
        low, high = rows.value - 1.96 * rows.stderr, rows.value + 1.96 * rows.stderr
    return dict(type="data", symmetric=False, visible=True, array=(100 * (high - rows.value)).fillna(0).tolist(),
                arrayminus=(100 * (rows.value - low)).fillna(0).tolist())


def spectra_lines(spectra: pd.DataFrame, gap: str) -> go.Figure:
    """Singular values of Δ (pruned) and of each method's residual at one gap (its text, ``12-18``), log scale."""
    fig = go.Figure()
    rows = spectra[spectra.gap == gap]
    for method, part in rows.groupby("method", sort=False):
        fig.add_trace(go.Scatter(x=part["index"].tolist(), y=part.singular_value.clip(lower=1e-12).tolist(),
                                 mode="lines", name=method_label(method), line=dict(color=_color(method))))
    fig.update_layout(title=f"Singular values of the discrepancy across layers {gap}",
                      xaxis_title="index", yaxis_title="singular value", yaxis_type="log", yaxis_dtick=1,
                      yaxis_exponentformat="power", **LAYOUT)
    return fig


def position_share_bars(positions: pd.DataFrame, gap: str, first: int = 64) -> go.Figure:
    """Share of ‖Δ‖² at each window position (the first ``first`` positions), log scale."""
    rows = positions[(positions.gap == gap) & (positions.position < first)]
    uniform = 1.0 / max(len(positions[positions.gap == gap]), 1)
    fig = go.Figure(go.Bar(x=rows.position.tolist(), y=rows.delta_share.clip(lower=1e-9).tolist(),
                           marker_color=["#d62728" if v > 10 * uniform else "#6C4AB6" for v in rows.delta_share],
                           hovertemplate="position %{x}: %{y:.3%} of ‖Δ‖²<extra></extra>"))
    fig.add_hline(y=uniform, line_dash="dot", annotation_text="equal share", annotation_position="top right")
    fig.update_layout(title=f"Share of ‖Δ‖² by position in the window, layers {gap}",
                      xaxis_title="position", yaxis_title="share of ‖Δ‖²", yaxis_type="log",
                      yaxis_exponentformat="power", **LAYOUT)
    return fig


def sink_spectra_lines(spectra: pd.DataFrame, gap: str) -> go.Figure:
    """Singular values of Δ over all tokens, without the sink tokens, and over the sinks alone."""
    colors = {"all tokens": "#7f7f7f", "without sinks": "#6C4AB6", "sinks only": "#d62728"}
    fig = go.Figure()
    for tokens, part in spectra[spectra.gap == gap].groupby("tokens", sort=False):
        part = part[part.singular_value > 1e-7 * part.singular_value.max()]  # drop the numerical zeros
        # (the sinks' Δ has rank at most their count)
        fig.add_trace(go.Scatter(x=part["index"].tolist(), y=part.singular_value.clip(lower=1e-12).tolist(),
                                 mode="lines", name=tokens, line=dict(color=colors.get(tokens))))
    fig.update_layout(title=f"Singular values of Δ with and without the sink, layers {gap}",
                      xaxis_title="index", yaxis_title="singular value", yaxis_type="log", yaxis_dtick=1,
                      yaxis_exponentformat="power", **LAYOUT)
    return fig


def removed_bars(errors: pd.DataFrame) -> go.Figure:
    """Share of ‖Δ‖² each method removes, on fit and held-out tokens."""
    table = removed_shares(errors)
    fig = go.Figure()
    for split in [c for c in ("fit", "heldout") if c in table]:
        fig.add_trace(go.Bar(x=table.method.tolist(), y=table[split].tolist(), name=split,
                             text=[f"{v:.1%}" for v in table[split]], textposition="outside"))
    fig.update_layout(title="Share of ‖Δ‖² removed (1 = perfect, 0 = plain pruning)", barmode="group",
                      yaxis_tickformat=".0%", **LAYOUT)
    return fig


def error_table(errors: pd.DataFrame, run) -> pd.DataFrame:
    """One row per fitted method: % of ‖Δ‖² removed (fit, held-out) and solve time."""
    table = removed_shares(errors).rename(columns={"fit": "removed (fit) %", "heldout": "removed (held-out) %"})
    for column in ("removed (fit) %", "removed (held-out) %"):
        if column in table:
            table[column] = (100 * table[column]).round(1)
    table["solve s"] = [round(run.results[m].solve_seconds, 3) for m in table.method]
    return table


def _color(variant: str) -> str:
    """One stable colour per variant across every chart (methods in ``METHODS`` order)."""
    fixed = {"dense": "#2ca02c", PRUNED: "#7f7f7f", "none": "#7f7f7f", "ghost": "#6C4AB6"}
    if variant in fixed:
        return fixed[variant]
    others = [m for m in METHODS if m not in fixed]
    index = others.index(variant) if variant in others else len(others)
    return PALETTE[index % len(PALETTE)]

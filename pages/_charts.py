"""Plotly figures and display tables of the app, built from the library's typed results and tidy frames.

Nothing here computes: every number comes from ``ghosted`` (influence reports, ``RecoveryRun`` frames, the
evaluation's ``VariantTable``, zero-shot's ``ZeroShot``); this module only draws them.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ghosted.service.frontend import METHODS, comparison, label_of, removed_shares, workbench as wb

PRUNED = comparison.PRUNED  # "pruned": the plainly pruned model's label
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


def perplexity_bars(table: comparison.VariantTable) -> go.Figure:
    """Perplexity of each variant on a log axis (pruning can raise it a hundredfold), 95 % intervals as bars."""
    bars, errors = {}, table.ppl_error_bars()
    if errors is not None:  # none where no interval was drawn
        bars["error_y"] = dict(type="data", symmetric=False, visible=True, array=errors[0], arrayminus=errors[1])
    ppl = [r.ppl for r in table.rows]
    fig = go.Figure(go.Bar(x=table.labels, y=ppl, text=[f"{v:,.2f}" for v in ppl], textposition="outside",
                           marker_color=[_color(v) for v in table.labels], **bars))
    fig.update_layout(title="Perplexity (lower is better; bars: 95 % interval)", yaxis_type="log",
                      yaxis_title="perplexity", **LAYOUT)
    return fig


def frontier_scatter(table: comparison.VariantTable) -> go.Figure:
    """The recovery frontier: parameters added against perplexity, closed-form fits and trained ones apart,
    the pruned model as the reference line (no parameters added)."""
    points = table.frontier()
    fig = go.Figure()
    for fit, symbol in (("closed form", "circle"), ("trained", "diamond")):
        part = [p for p in points if p.fit == fit]
        labels = [p.label for p in part]
        fig.add_trace(go.Scatter(x=[p.added for p in part], y=[p.ppl for p in part], name=fit,
                                 mode="markers+text", text=labels, textposition="top center",
                                 marker=dict(symbol=symbol, size=11, color=[_color(v) for v in labels]),
                                 hovertemplate="%{text}: %{x:,} parameters, perplexity %{y:.2f}<extra></extra>"))
    fig.add_hline(y=table.row(PRUNED).ppl, line_dash="dot", line_color=_color(PRUNED),
                  annotation_text="pruned, no recovery")
    fig.update_layout(title="Recovery frontier: parameters added against perplexity (lower left is better)",
                      xaxis_title="parameters added to the pruned model", yaxis_title="perplexity", **LAYOUT)
    return fig


def accuracy_bars(scored: wb.ZeroShot) -> go.Figure:
    """Accuracy of each variant, one group of bars per task (and the average), 95 % intervals as bars."""
    fig = go.Figure()
    for group in scored.bars():
        if group.above is None:  # the average over tasks
            fig.add_trace(go.Bar(x=group.labels, y=group.values, name=group.name, marker_color="#444",
                                 hovertemplate="%{x}: %{y:.1f} %<extra>average</extra>"))
            continue
        fig.add_trace(go.Bar(x=group.labels, y=group.values, name=group.name,
                             error_y=dict(type="data", symmetric=False, visible=True, array=group.above,
                                          arrayminus=group.below),
                             hovertemplate="%{x}: %{y:.1f} %<extra>" + group.name + "</extra>"))
    fig.update_layout(title="Zero-shot accuracy (higher is better; bars: 95 % interval)", barmode="group",
                      yaxis_title="accuracy (%)", yaxis_range=[0, 100], **LAYOUT)
    return fig


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


def _color(variant: str) -> str:
    """One stable colour per variant across every chart (methods in ``METHODS`` order)."""
    fixed = {"dense": "#2ca02c", PRUNED: "#7f7f7f", "none": "#7f7f7f", "ghost": "#6C4AB6"}
    if variant in fixed:
        return fixed[variant]
    others = [m for m in METHODS if m not in fixed]
    index = others.index(variant) if variant in others else len(others)
    return PALETTE[index % len(PALETTE)]

"""Choose layers to remove from an influence report, with each criterion's published rule.

Block criteria pick one contiguous block [start, start+n); layer criteria pick n layers, possibly
apart. Rules beyond "best value" are those of the code that defined the criterion:
- ``seqcos_streamline``: starts 1..L-n-1 only (never layer 0, never a block touching the last layer);
- ``seqcos_shortgpt``: the last layer is never chosen;
- ``taylor``: layers 0-3 and the last two are never chosen (Shortened-LLaMA's "+");
- ``sleb``: the first n layers of SLEB's greedy order.
Ties go to the lower start or layer index.
"""

from __future__ import annotations

import math
import numbers

import pandas as pd

from ghosted.selection.criteria import (CRITERIA, ITERATIVE, InfluenceConfig, InfluenceReport, influence,
                                        resolve_criterion)
from ghosted.models.pruning import format_layers

_TAYLOR_PLUS_FIRST, _TAYLOR_PLUS_LAST = 4, 2  # Shortened-LLaMA keeps layers 0-3 and the last two


def block_candidates(metric: str, n: int, total: int) -> list[int]:
    """Starts a block criterion may choose for n removed layers."""
    if metric == "seqcos_streamline":
        return list(range(1, total - n))
    return list(range(0, total - n + 1))


def layer_candidates(metric: str, total: int) -> list[int]:
    """Layers a layer criterion may choose."""
    if metric == "seqcos_shortgpt":
        return list(range(total - 1))
    if metric == "taylor":
        return list(range(_TAYLOR_PLUS_FIRST, total - _TAYLOR_PLUS_LAST))
    return list(range(total))


def select(source, metric: str, n: int, windows=None, heldout=None,
           config: InfluenceConfig | None = None) -> tuple[list[int], str]:
    """The n layers ``metric`` removes, and a sentence saying why.

    ``metric`` is a criterion of ``CRITERIA`` or an alias (``shortgpt``, ``bi``, ``streamline``, ``angular``,
    ``ppl``, ``taylor+``). ``source`` is an ``InfluenceReport``, or a model (``nn.Module`` with ``windows``, or a
    ``LoadedModel``, which defaults to 32 + 8 windows of 256 tokens of bundled news) on which only
    this criterion is computed.
    ``metric`` may also be ``"prunecomp:<criterion>"``: Prune&Comp's loop, n rounds of removing the one
    layer the criterion picks and compensating (``ghosted.selection.iterative.iterative_select``; needs a model).

    Example:
        >>> layers, reason = select(report, "recoverability", 7)
        >>> layers                                   # e.g. [20, 21, 22, 23, 24, 25, 26]
    """
    metric = resolve_criterion(metric, iterative=True)  # aliases: shortgpt, bi, streamline, angular, ppl, ...
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n (how many layers to remove) must be a whole number, not {n!r}.")
    if n < 1:  # before any forward pass on a model source
        raise ValueError(f"n (how many layers to remove) must be at least 1; got {n}.")
    if metric.startswith(ITERATIVE):  # Prune&Comp's iterative prune-and-compensate loop
        from ghosted.selection.iterative import iterative_select

        base = metric[len(ITERATIVE):]
        model, windows, heldout = _model_and_windows(source, windows, heldout, "prunecomp selection")
        return iterative_select(model, base, n, windows,
                                lambda current: select(current, base, 1, windows, heldout, config))
    report = source if isinstance(source, InfluenceReport) else _report_for(source, metric, n, windows,
                                                                              heldout, config)
    if not 1 <= n <= report.num_layers - 1:
        raise ValueError(f"n must be in 1..{report.num_layers - 1} for a {report.num_layers}-layer model; got {n}.")
    if CRITERIA[metric].kind == "block":
        return _select_block(report, metric, n)
    if metric == "sleb":
        return _select_sleb(report, n)
    return _select_layers(report, metric, n)


def _model_and_windows(source, windows, heldout, what: str):
    """(model, windows, held-out windows) of a model source, which must come with its windows (``what``
    names the caller in the error); ``ghosted.select`` draws the spec's windows for a ``LoadedModel``."""
    if windows is None:
        raise ValueError(f"{what} on a model needs calibration windows (windows=...).")
    return (source.model if hasattr(source, "tokenizer") else source), windows, heldout  # a LoadedModel or a module


def _report_for(source, metric: str, n: int, windows, heldout, config) -> InfluenceReport:
    model, windows, heldout = _model_and_windows(source, windows, heldout, "Selecting")
    base = config or InfluenceConfig()
    cfg = InfluenceConfig(**{**vars(base), "metrics": [metric], "n_values": [n], "recoverability_n_values": None,
                             "sleb_steps": n if metric == "sleb" else base.sleb_steps})
    return influence(model, windows, cfg, heldout=heldout)


def _direction(metric: str) -> tuple[bool, str]:
    """(sort descending?, word) for a criterion's prunable end."""
    highest = CRITERIA[metric].prune == "highest"
    return highest, "highest" if highest else "lowest"


def _select_block(report: InfluenceReport, metric: str, n: int) -> tuple[list[int], str]:
    rows = report.blocks[(report.blocks.metric == metric) & (report.blocks.n == n)]
    if rows.empty:
        raise ValueError(f"The report has no {metric} values for n = {n}; compute it with n_values "
                         f"including {n} (metrics=[{metric!r}]).")
    starts = block_candidates(metric, n, report.num_layers)
    rows = rows[rows.start.isin(starts) & rows.value.notna()]
    if rows.empty:
        raise ValueError(f"{metric} allows no block of {n} layers in a {report.num_layers}-layer model "
                         f"(starts 1..L-n-1 only: never layer 0, never the last layer).")
    descending, word = _direction(metric)
    ranked = rows.sort_values(["value", "start"], ascending=[not descending, True], kind="stable")
    best = ranked.iloc[0]
    start = int(best.start)
    layers = list(range(start, start + n))
    runner = (f"; next best [{int(ranked.iloc[1].start)}, {int(ranked.iloc[1].end)}) at "
              f"{ranked.iloc[1].value:.4g}") if len(ranked) > 1 else ""
    reason = (f"{metric} ({CRITERIA[metric].origin}): block [{start}, {start + n}) = layers "
              f"{format_layers(layers)} has the {word} value {best.value:.4g} among "
              f"{_count(len(ranked), 'allowed block')} of {_count(n, 'layer')}{runner}. "
              f"Value: {CRITERIA[metric].label}.{_caveat(report, metric)}")
    return layers, reason


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _caveat(report: InfluenceReport, metric: str) -> str:
    """A warning when the fit error is meaningless: fewer calibration tokens than hidden channels."""
    tokens, dim = report.meta.get("tokens"), report.meta.get("hidden_size")
    too_few = tokens is not None and dim is not None and tokens <= dim
    if metric in ("recoverability", "recoverability_token") and too_few:
        return (f" Caution: only {tokens} calibration tokens for {dim} channels, so the ghost operator "
                f"fits every block almost exactly; use more tokens or recoverability_heldout.")
    return ""


def _select_layers(report: InfluenceReport, metric: str, n: int) -> tuple[list[int], str]:
    values = _layer_series(report, metric)
    allowed = values[values.index.isin(layer_candidates(metric, report.num_layers)) & values.notna()]
    if len(allowed) < n:
        raise ValueError(f"{metric} can choose among {len(allowed)} layers of this model "
                         f"({format_layers(allowed.index) or 'none'}), fewer than n = {n}.")
    descending, word = _direction(metric)
    frame = pd.DataFrame({"layer": allowed.index, "value": allowed.values})
    chosen = frame.sort_values(["value", "layer"], ascending=[not descending, True], kind="stable").head(n)
    layers = sorted(int(i) for i in chosen.layer)
    listed = ", ".join(f"{int(r.layer)} ({r.value:.4g})" for r in chosen.itertuples())
    reason = (f"{metric} ({CRITERIA[metric].origin}): the {_count(n, 'layer')} with the {word} values, "
              f"{listed}; layers {format_layers(layers)}. Value: {CRITERIA[metric].label}.")
    return layers, reason


def _select_sleb(report: InfluenceReport, n: int) -> tuple[list[int], str]:
    steps = _layer_series(report, "sleb").dropna()
    if len(steps) < n:
        raise ValueError(f"The report holds {len(steps)} SLEB steps, fewer than n = {n}; "
                         f"compute it with sleb_steps >= {n}.")
    order = [int(layer) for layer in steps.sort_values().index[:n]]
    ppl = report.layer_values("sleb_ppl") if "sleb_ppl" in set(report.layers.metric) else pd.Series(dtype=float)
    listed = ", ".join(f"{layer} (PPL {ppl.get(layer, math.nan):.4g})" for layer in order)
    reason = (f"sleb (SLEB): greedy removal, each step dropping the layer whose removal gives the lowest "
              f"calibration NLL (first and last alive layers never candidates): {listed}; layers "
              f"{format_layers(order)}.")
    return sorted(order), reason


def _layer_series(report: InfluenceReport, metric: str) -> pd.Series:
    try:
        return report.layer_values(metric)
    except KeyError:
        raise ValueError(f"The report has no {metric} values; compute it first "
                         f"(metrics=[{metric!r}]).") from None


def selections(report: InfluenceReport, n_values: list[int]) -> pd.DataFrame:
    """Every criterion's choice for every n: (metric, n, layers, reason); skips what cannot be chosen."""
    rows = []
    for metric in [m for m in CRITERIA if m in report.metrics]:
        for n in n_values:
            try:
                layers, reason = select(report, metric, n)
            except ValueError as err:
                layers, reason = None, f"not available: {err}"
            rows.append({"metric": metric, "n": n, "layers": None if layers is None else format_layers(layers),
                         "reason": reason})
    return pd.DataFrame(rows, columns=["metric", "n", "layers", "reason"])

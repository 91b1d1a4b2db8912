"""What the pages tell of a fitted run, typed: the Learn page's facts, step by step, and the fit's tables.

The Learn page explains the method step by step with the user's fitted run (``results.FittedRun``) and
its measurements. Everything it says with a number comes from one function here (which gap, how many
directions hold most of Δ, what the ghost fit removed, the best point of the frontier, the sink's share,
...), so the page only fills its texts (``assets/learn/``) and draws; every rule deciding which sentence
applies (a spread or a concentrated Δ, a sink that dominates, too few tokens for the width) is a property
here. The Recover and Compare pages' tables of the fit (removed shares, sinks) come from here too.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ghosted.service.comparison import PRUNED, REFERENCE_LABEL, FrontierPoint
from ghosted.service.results import FittedRun, ZeroShot
from ghosted.models.architecture import hidden_size
from ghosted.models.pruning import format_layers, parse_layers
from ghosted.recovery.diagnostics import directions_holding, removed_shares
from ghosted.recovery.methods import RECOVERY, REGISTRY, with_role

ENERGY_SHARE = 0.9  # "k directions carry 90 % of ‖Δ‖²"
SPREAD_FRACTION = 10  # Δ is "spread" when more than 1/10 of the directions hold ENERGY_SHARE of it
DOMINANT_SHARE = 0.5  # a sink "dominates" when it carries more than half of ‖Δ‖²
SINK_AWARE = ("ghost", "ghost-robust", "ghost-auto")  # the paper's fit and the sink-aware ones
AUTO = "ghost-auto"  # the method that chooses a fit per gap
TOKENS_PER_WIDTH = 4  # fewer calibration tokens than this many times the width: a d x d operator overfits


@dataclass(frozen=True)
class FitSummary:
    """The Recover page's summary of a run: what each method removed, and whether the tokens were enough."""

    errors: pd.DataFrame  # one row per fitted method: % of ‖Δ‖² removed (fit, held-out), solve seconds
    tokens: int  # calibration tokens fitted on
    width: int  # the residual stream's width d

    @property
    def wanted(self) -> int:
        """The fewest calibration tokens a d x d operator wants (TOKENS_PER_WIDTH x d)."""
        return TOKENS_PER_WIDTH * self.width

    @property
    def overfits(self) -> bool:
        """Whether the tokens are too few for the width (good on the fitted windows, poor on held-out ones)."""
        return self.tokens < self.wanted

    @property
    def sinks_below_zero(self) -> list[str]:
        """Methods that treat attention-sink tokens apart and show a share below 0: they map each sink to a
        constant, so the few sink tokens, whose streams have by far the largest norms, can leave more of
        ‖Δ‖² than plain pruning while the other tokens are fitted (and ghost-auto chose on next-token loss)."""
        shares = self.errors.filter(like="removed").min(axis=1)
        return [m for m, share in zip(self.errors.method, shares) if share < 0 and REGISTRY[m].uses_sinks]


def fit_summary(fitted: FittedRun) -> FitSummary:
    """The removed shares (in %, rounded) with each method's solve time, the tokens and the width."""
    table = removed_shares(fitted.frames["errors"]).rename(columns={"fit": "removed (fit) %",
                                                                    "heldout": "removed (held-out) %"})
    for column in ("removed (fit) %", "removed (held-out) %"):
        if column in table:
            table[column] = (100 * table[column]).round(1)
    table["solve s"] = [round(fitted.run.results[m].solve_seconds, 3) for m in table.method]
    proto = fitted.protocol
    return FitSummary(table, proto["n_windows"] * proto["seq_len"], hidden_size(fitted.run.results["none"].model))


def stream_metric(report) -> str | None:
    """The per-layer criterion step 1 draws (Block Influence when measured); None without per-layer values."""
    if report is None or not len(report.layers):
        return None
    metrics = list(dict.fromkeys(report.layers.metric))
    return "block_influence" if "block_influence" in metrics else metrics[0]


@dataclass(frozen=True)
class Pruning:
    """Step 2: the gap pruning leaves and how the discrepancy Δ across it is spread."""

    layers: str  # the dropped layers, in the drop notation ("20-23")
    gap: str  # the first gap
    end: int  # the first layer after that gap (the one reading its stream)
    tokens: int  # calibration tokens Δ is measured on
    gaps: int  # how many gaps the layers leave
    dense_ppl: float | None  # perplexities of the dense and pruned models (None: not evaluated)
    pruned_ppl: float | None
    top: int  # leading directions holding ENERGY_SHARE of ‖Δ‖² at the first gap
    directions: int  # the width: every direction
    share: float = ENERGY_SHARE  # the share ``top`` holds

    @property
    def spread(self) -> bool:
        """Whether Δ is spread over many directions (no low-rank fix would do)."""
        return self.top > self.directions // SPREAD_FRACTION


def pruning(fitted: FittedRun) -> Pruning:
    """Step 2's numbers: the first gap, its tokens, the perplexity cost and Δ's spectrum there."""
    errors, spectra = fitted.frames["errors"], fitted.frames["spectra"]
    gap = spectra.gap.iloc[0]  # the first gap, in the drop notation ("12-18")
    fit = errors[errors.split == "fit"]
    tokens = int(fit.tokens.iloc[0]) if "tokens" in fit else fitted.protocol["tokens"]
    delta = spectra[(spectra.gap == gap) & (spectra.method == PRUNED)].singular_value
    table = fitted.evaluation.table if fitted.evaluation else None
    return Pruning(layers=format_layers(fitted.layers), gap=gap, end=parse_layers(gap)[-1] + 1, tokens=tokens,
                   gaps=int(errors.gap.nunique()), dense_ppl=table.row(REFERENCE_LABEL).ppl if table else None,
                   pruned_ppl=table.row(PRUNED).ppl if table else None,
                   top=directions_holding(delta, ENERGY_SHARE), directions=len(delta))


@dataclass(frozen=True)
class AccuracyCost:
    """Step 2: what pruning and each recovery cost in zero-shot answers (accuracy in %)."""

    column: str  # "average" over several tasks, or the one task
    dense: float
    pruned: float
    recovered: dict  # label -> accuracy, each recovered model in the table's order

    @property
    def scope(self) -> str:
        """Where the accuracies come from, in words."""
        return "averaged over your tasks" if self.column == "average" else self.column


def accuracy_cost(scored: ZeroShot | None) -> AccuracyCost | None:
    """The dense, pruned and recovered accuracies; None without scores or without dense and pruned ones."""
    if not scored or scored.frame.empty:
        return None
    table = scored.table().set_index("label")
    column = "average" if "average" in table else table.columns[0]
    acc = table[column]
    if REFERENCE_LABEL not in acc or PRUNED not in acc:
        return None
    return AccuracyCost(column, acc[REFERENCE_LABEL], acc[PRUNED],
                        {v: acc[v] for v in acc.index if v not in (REFERENCE_LABEL, PRUNED)})


@dataclass(frozen=True)
class GhostFit:
    """Step 3: what the paper's closed form did on the user's run."""

    solve: float  # seconds of the solve
    fit: float  # share of ‖Δ‖² removed on the fitted tokens
    heldout: float | None  # on the held-out tokens (None: none held out)


def ghost_fit(fitted: FittedRun) -> GhostFit | None:
    """The ghost fit's solve time and removed shares; None when ghost was not fitted."""
    table = removed_shares(fitted.frames["errors"]).set_index("method")
    if "ghost" not in table.index:
        return None
    row = table.loc["ghost"]
    return GhostFit(fitted.run.results["ghost"].solve_seconds, row["fit"],
                    row["heldout"] if "heldout" in row else None)


def several_fits(fitted: FittedRun) -> bool:
    """Step 4: whether more than one method was fitted (a comparison of restricted operators to draw)."""
    return len(set(fitted.frames["errors"].method) - {PRUNED}) > 1


def ghost_asymmetry(fitted: FittedRun) -> float | None:
    """Step 4: the anti-symmetric share of ghost's M at the first gap; None when ghost was not fitted."""
    asym = fitted.frames["asymmetry"]
    ghost = asym[asym.method == "ghost"] if len(asym) else asym
    return float(ghost.energy_ratio.iloc[0]) if len(ghost) else None


@dataclass(frozen=True)
class Frontier:
    """Step 5: the recovery frontier of the user's methods."""

    fitted: int  # methods fitted besides plain pruning
    evaluated: bool  # whether their perplexities (and sizes) are known
    pruned_ppl: float | None  # the pruned model's perplexity (None: not evaluated)
    closed: FrontierPoint | None  # the best point fitted in closed form, and the best trained one
    trained: FrontierPoint | None


def frontier(fitted: FittedRun) -> Frontier:
    """Step 5's numbers: how many methods, and the best closed-form and trained points once evaluated."""
    count = len(with_role(fitted.methods, RECOVERY))
    table = fitted.evaluation.table if fitted.evaluation else None
    if table is None or not table.has_frontier:
        return Frontier(count, False, None, None, None)
    return Frontier(count, True, table.row(PRUNED).ppl, table.best_on_frontier(trained=False),
                    table.best_on_frontier(trained=True))


@dataclass(frozen=True)
class Sinks:
    """Step 6: the attention sink at the first gap."""

    gap: str  # the first gap
    count: int  # sink tokens
    share: float  # their share of ‖Δ‖²
    fraction: float  # their share of the tokens
    ratio: float  # a sink token's share of ‖Δ‖² over another token's
    norms: dict | None  # RMS norms of X and Y at the sinks and elsewhere (sink_x, sink_y, other_x, other_y)

    @property
    def times(self) -> str:
        """The ratio as the text says it: whole above 10, one decimal below."""
        return f"{self.ratio:,.0f}" if self.ratio >= 10 else f"{self.ratio:.1f}"

    @property
    def dominated(self) -> bool:
        """Whether the sink carries most of Δ (the paper's fit then serves the sink first)."""
        return self.share > DOMINANT_SHARE


def sinks(fitted: FittedRun) -> Sinks | None:
    """Step 6's numbers from the run's sink report; None when the run has none."""
    shares = fitted.frames.get("token_shares")
    if shares is None or not len(shares):
        return None
    gap = shares.gap.iloc[0]
    sink = shares[(shares.gap == gap) & (shares.tokens == "sink")].iloc[0]
    other = shares[(shares.gap == gap) & (shares.tokens == "other")].iloc[0]
    report, norms = fitted.frames.get("sinks"), None
    if report is not None and len(report):
        row = report[report.gap == gap].iloc[0]
        norms = {"sink_x": row.sink_rms_norm_x, "sink_y": row.sink_rms_norm_y, "other_x": row.other_rms_norm_x,
                 "other_y": row.other_rms_norm_y}
    return Sinks(gap=gap, count=int(sink["count"]), share=sink.delta_share,
                 fraction=sink["count"] / (sink["count"] + other["count"]),
                 ratio=sink.per_token_share / max(other.per_token_share, 1e-300), norms=norms)


def auto_choices(fitted: FittedRun) -> pd.DataFrame | None:
    """ghost-auto's choice at each gap and why (gap, chosen, reason); None when it was not fitted."""
    choices = fitted.frames.get("choices")
    if choices is None or not len(choices) or "chosen" not in choices:
        return None
    return choices[choices.method == AUTO][["gap", "chosen", "reason"]]


def sink_aware_perplexities(fitted: FittedRun) -> dict | None:
    """Method -> perplexity of the paper's fit and the sink-aware ones evaluated; None unless at least two
    of them were fitted and the run was evaluated."""
    methods = [m for m in SINK_AWARE if m in fitted.methods]
    if not fitted.evaluation or len(methods) < 2:
        return None
    table = fitted.evaluation.table
    return {m: table.of_method(m).ppl for m in methods if table.of_method(m) is not None}


def needs_sink_aware(fitted: FittedRun) -> bool:
    """Whether no sink-aware fit (ghost-robust, ghost-auto) was fitted: the page suggests one."""
    return not {"ghost-robust", AUTO} & set(fitted.methods)


def sink_table(report: pd.DataFrame) -> pd.DataFrame:
    """The sink report as the Compare page shows it: shares of ‖Δ‖² and of XᵀX in %."""
    shown = report.assign(delta_share=(100 * report.delta_share).round(2), xtx_share=(100 * report.xtx_share).round(2))
    return shown.rename(columns={"delta_share": "share of ‖Δ‖² %", "xtx_share": "share of XᵀX %"})

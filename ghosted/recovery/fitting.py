"""Fit every recovery method from one calibration pass and build each recovered model.

Methods (all training-free, all behind one interface):
  * ``none``: plain pruning.
  * ``ghost``: the paper's method exactly: W = I + M on the residual stream,
    (XᵀX + εI)M = XᵀΔ in float64.
  * ``ghost-robust``: W fitted on non-sink tokens, sink tokens mapped apart (see ``sinks.py``).
  * ``ghost-auto``: per gap, ``ghost``, ``ghost-robust`` or no operator, chosen on held-out
    calibration windows (its search lives in ``ghosted.recovery.auto``).
  * ``replaceme-ls`` / ``replaceme-cos``: a map T on the MLP output of the last kept layer, folded
    into its output projection (least squares, or ReplaceMe's cosine objective with Adam);
    ``replaceme-ls-robust`` fits T on non-sink tokens and maps sinks apart, like ``ghost-robust``.
  * ``linearpatch-diag`` / ``linearpatch-rotate``: LinearPatch's channel scaling, plain or in a
    Hadamard basis.
  * ``ghost-lowrank`` (``-robust``), ``prunecomp``, ``streamline-ffn`` / ``streamline-layer``: the best rank-R ghost,
    Prune&Comp's fused magnitude scale and LLM-Streamline's trained replacements (``ghosted.recovery.frontier``).
Each method is an entry of ``ghosted.recovery.methods.REGISTRY`` that names its fit function; ``recover`` gathers
the statistics every chosen entry needs in one pass and dispatches from the entries (``FitContext``).
The input model is never modified; each method gets its own model object sharing the kept weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pandas as pd
from torch import nn

from ghosted.recovery import diagnostics, solvers as solve
from ghosted.recovery import methods as registry
from ghosted.recovery.methods import MethodResult
from ghosted.models.architecture import num_layers
from ghosted.operators.assembly import GapFit, assemble
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats, gap_text, gaps_of
from ghosted.core.progress import Progress
from ghosted.core.guards import check_eps
from ghosted.models.pruning import build_variant, parse_layers
from ghosted.recovery.gap_fits import (  # noqa: F401 (re-exported: callers import the per-gap fits from here)
    fit_ghost, fit_ghost_robust, fit_linearpatch_diag, fit_linearpatch_rotate, fit_replaceme_cos, fit_replaceme_ls,
    fit_replaceme_ls_robust)
from ghosted.calibration.sinks import SinkDetector, SinkRule, sink_report
from ghosted.calibration.stats import BoundaryStats
from ghosted.calibration.cache import collect_cached, model_identity, resolve_cache
from ghosted.recovery.streamline import StreamlineConfig

# The names, kinds and fits come from the registry (ghosted.recovery.methods); recover() dispatches from its entries.
BRANCH_METHODS = registry.names_of(registry.BRANCH)
METHODS = registry.FITTED  # "none" and every method recover() fits


@dataclass
class RecoveryConfig:
    """Settings of the recovery methods (defaults follow each method's paper and code)."""

    eps: float = 1e-6  # absolute ridge of the ghost solve, as in the paper's code
    solver: str = "solve"  # "solve" (normal equations) or "pinv" (exact minimum-norm, SVD cutoff)
    rcond: float = 1e-6  # singular-value cutoff (relative to the largest) for solver="pinv"
    ghost_mode: str = "independent"  # "independent" (paper: all fits on the dense model) or "sequential"
    granularity: str = "auto"  # "block": one operator per contiguous run; "layer": one per removed
    # layer (paper's non-contiguous mode); "auto": block for one contiguous run, layer otherwise
    replaceme_ridge: float = 0.0  # ReplaceMe's alpha (0 in its configs)
    fold: bool = True  # fold T into the output projection (plain checkpoint) when possible
    cos_epochs: int = 10  # ReplaceMe-cosine: Adam epochs over the token reservoir (its default)
    cos_lr: float = 1e-4  # ReplaceMe-cosine learning rate (its default)
    cos_batch_tokens: int = 1024  # ReplaceMe-cosine minibatch (its default)
    sink_position: bool = True  # robust methods: the first token of each sequence is a sink
    sink_norm_factor: float | None = None  # robust methods: also tokens with ‖x‖ > factor × median
    sink_map: str = "constant"  # what sinks become: "constant" (mean X_post) or "affine"
    choose_ridge: bool = True  # robust methods: pick the ridge on held-out calibration tokens
    rank: int | None = None  # ghost-lowrank: rank R of M = U·V (None: d/4)
    auto_layers: bool = False  # ghost-auto: also try layer-ls's solved replacement layers (same significance
    # rule); off by default: it costs the layer solve (several times ghost's fit) and puts layers back
    streamline: StreamlineConfig = field(default_factory=StreamlineConfig)  # streamline-* training
    report_sinks: bool = True  # keep sink sub-statistics for the sink report even when no robust
    # method is fitted (one more set of d x d sums; the plain fits do not change)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)

    def sink_rule(self) -> SinkRule:
        return SinkRule(position=self.sink_position, norm_factor=self.sink_norm_factor)


@dataclass
class RecoveryRun:
    """Everything one ``recover`` call produced, with tidy frames for display."""

    dropped: list[int]
    base_layers: int
    config: RecoveryConfig
    results: dict[str, MethodResult]
    calib_seconds: float
    protocol: dict = field(default_factory=dict)
    sinks: pd.DataFrame = field(default_factory=pd.DataFrame)  # sink report per gap (robust methods)
    statistics: dict = field(default_factory=dict)  # pass ("calibration", "held-out") -> "computed" / "reused"
    warnings: list[str] = field(default_factory=list)  # ill-conditioned fits, one message per gap
    spec: dict | None = None  # the experiment spec (to_dict()) of this fit when a session drew its windows;
    # every save writes it, so `run --recipe` reruns it (None: windows given by hand, no spec rebuilds them)

    def errors(self) -> pd.DataFrame:
        """Boundary error per gap (column ``gap``, its layers in the drop notation: ``12-18``, as every frame
        here names it), method (its label: "pruned" = no recovery) and split (fit / heldout)."""
        rows = []
        for name, r in self.results.items():
            label = registry.label_of(name)
            for split, stats in (("fit", r.stats), ("heldout", r.heldout or {})):
                rows += [diagnostics.error_rows(label, g, r.fits.get(g), s, split) for g, s in stats.items()]
        return pd.DataFrame(rows)

    def spectra(self) -> pd.DataFrame:
        """Singular values of Δ (the baseline's label, "pruned") and of each recovery's residual, per gap
        (fit tokens)."""
        frames, pruned = [], registry.label_of(registry.BASELINE_METHOD)
        for name, r in self.results.items():
            for g, s in r.stats.items():
                if registry.role_of(name) == registry.RECOVERY:
                    frames.append(diagnostics.spectrum_frame(name, g, r.fits.get(g), s))
                frames.append(diagnostics.spectrum_frame(pruned, g, None, s))
        frame = _concat(frames)
        return frame.drop_duplicates(["gap", "method", "index"]).reset_index(drop=True)

    def asymmetry(self) -> pd.DataFrame:
        """Antisymmetric share of M = W − I for every full-stream operator."""
        return pd.DataFrame([diagnostics.asymmetry_row(name, g, f.stream)
                             for name, r in self.results.items() for g, f in r.fits.items()
                             if f.stream is not None])

    def boundary_stats(self) -> list[BoundaryStats]:
        """The calibration statistics of each gap, once per gap (every method shares them)."""
        found = {(g.start, g.end): s for r in self.results.values() for g, s in r.stats.items()}
        return [found[k] for k in sorted(found)]

    def token_shares(self) -> pd.DataFrame:
        """Per gap: share of ‖Δ‖² carried by the sink tokens and by the others, in all and per token."""
        return _concat(diagnostics.token_share_frame(s) for s in self.boundary_stats())

    def sink_spectra(self) -> pd.DataFrame:
        """Per gap: singular values of Δ over all tokens, without the sinks, and over the sinks alone."""
        return _concat(diagnostics.sink_spectra_frame(s) for s in self.boundary_stats())

    def position_shares(self) -> pd.DataFrame:
        """Per gap and window position: share of ‖Δ‖² and RMS ‖Δ‖ (the sink shows as a spike)."""
        return _concat(diagnostics.position_share_frame(s) for s in self.boundary_stats())

    def choices(self) -> pd.DataFrame:
        """What ``ghost-auto`` and the robust ridge search chose, per gap, and why."""
        return pd.DataFrame([c for r in self.results.values() for c in r.choices])


def _concat(frames) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def resolve_gaps(dropped: list[int], granularity: str) -> list[Gap]:
    blocks = gaps_of(dropped, "block")
    if granularity == "auto":
        granularity = "block" if len(blocks) == 1 else "layer"
    if granularity not in ("block", "layer"):
        raise ValueError(f"Unknown granularity {granularity!r}; use auto, block or layer.")
    return gaps_of(dropped, granularity)


def check_methods(methods: list[str], dropped: list[int], has_heldout: bool = True) -> None:
    unknown = [m for m in methods if m not in METHODS and m not in registry.REGISTRY]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from dense, {', '.join(METHODS)}.")
    if any(m in BRANCH_METHODS for m in methods) and 0 in dropped:
        raise ValueError("ReplaceMe maps the MLP output of the layer before a removed block, so it "
                         "cannot recover a block that starts at layer 0. Keep layer 0 or drop ReplaceMe.")
    needs = registry.needing_heldout(methods)
    if needs and not has_heldout:
        raise ValueError(f"{', '.join(needs)} chooses on held-out calibration windows: give some (heldout_seqs > 0).")


@dataclass
class FitContext:
    """Everything a method's fit may read, gathered once by ``recover`` (see ``ghosted.recovery.methods``)."""

    model: nn.Module  # a view of the input model whose layer indices are its positions; never modified
    dropped: list[int]  # the removed layers
    stream_gaps: list[Gap]  # the gaps of stream operators (per cfg.granularity)
    block_gaps: list[Gap]  # one gap per contiguous removed block (branch, folded and trained methods)
    stats: dict[Gap, BoundaryStats]  # calibration statistics of every gap, on the unpruned model
    heldout: dict[Gap, BoundaryStats] | None  # the same on the held-out windows; None without them
    calib_windows: object  # TokenWindows the fits read
    heldout_windows: object | None  # TokenWindows kept apart for choices (ridge, ghost-auto)
    cfg: RecoveryConfig
    calib_cfg: CalibrationConfig  # the calibration settings ``stats`` were collected with
    rule: SinkRule
    progress: Progress | None  # every pass and every fit that has steps reports here (None: silent)
    calib_seconds: float  # time of the shared calibration passes
    shared: str  # "computed" or "reused" (the statistics came from the cache)

    def gaps_for(self, entry: registry.Method) -> list[Gap]:
        return self.block_gaps if entry.kind == registry.BRANCH else self.stream_gaps

    def pick(self, per_gap: dict | None, gaps: list[Gap]) -> dict | None:
        return None if per_gap is None else {g: per_gap[g] for g in gaps if g in per_gap}

    def stats_upstream(self, gap: Gap, upstream: dict[Gap, GapFit], label: str, sinks: bool):
        """Calibration and held-out statistics of ``gap`` read on the model with ``upstream``'s gaps
        removed and patched with their fits (sequential mode): (fit stats, held-out stats or None)."""
        layers = [i for g in upstream for i in g.layers]
        partial = assemble(self.model, layers, {g: f for g, f in upstream.items() if f is not None}, label,
                           rule=self.rule)
        seq_cfg = replace(self.calib_cfg, replaceme=False, reservoir_tokens=0)

        def pass_over(windows, label: str):
            return collect_stats(self.model, windows, [gap], seq_cfg, x_model=partial,
                                 sink_detector=SinkDetector(self.rule) if sinks else None, progress=self.progress,
                                 label=label)[gap]
        fit = pass_over(self.calib_windows, f"sequential fit of gap {gap}")
        return fit, (None if self.heldout_windows is None
                     else pass_over(self.heldout_windows, f"held-out statistics of gap {gap}"))


def fit_none(ctx: FitContext, name: str) -> MethodResult:
    """Plain pruning: the kept layers, no operator."""
    keep = [i for i in range(num_layers(ctx.model)) if i not in set(ctx.dropped)]
    return MethodResult(name, build_variant(ctx.model, keep), registry.RESULT_KINDS[registry.NONE], {},
                        ctx.pick(ctx.stats, ctx.stream_gaps), ctx.pick(ctx.heldout, ctx.stream_gaps), 0.0, 0.0,
                        statistics=ctx.shared)


def recover(model: nn.Module, drop, methods, calib_windows, heldout_windows=None,
            config: RecoveryConfig | None = None, progress: Progress | None = None,
            cache=None) -> RecoveryRun:
    """Prune ``drop`` from ``model`` and fit each method in ``methods`` on ``calib_windows``.

    ``cache`` (``True`` or a ``cache.StatsCache``) reuses calibration statistics saved by an
    earlier call with the same model, windows, gaps and settings, and saves new ones. Each method is
    fitted by the function its entry in ``ghosted.recovery.methods.REGISTRY`` names.

    Example:
        >>> run = recover(model, "20-26", ["none", "ghost", "replaceme-ls"], calib, heldout)
        >>> run.results["ghost"].model         # a new model; ``model`` is unchanged
        >>> run.errors()                       # boundary errors, fit and held-out
    """
    cfg = config or RecoveryConfig()
    check_eps(cfg.eps)  # before any work: a NaN ridge would only show as NaN operators
    cache = resolve_cache(cache)
    identity = model_identity(model) if cache else None  # before the view below hides the checkpoint
    total = num_layers(model)
    model = build_variant(model, list(range(total)))  # a view whose layer indices are its positions
    model.ghosted_layers = list(range(total))  # so a pruned input is treated as a new base model
    dropped = parse_layers(drop, total)
    if not dropped:
        raise ValueError("Choose at least one layer to drop.")
    methods = [m for m in dict.fromkeys(methods) if m not in registry.REGISTRY or registry.REGISTRY[m].fit]
    check_methods(methods, dropped, heldout_windows is not None)
    entries = [registry.REGISTRY[m] for m in methods]
    for entry in entries:  # before any pass: a method that cannot fit this model says so now
        registry.check_model(entry, model)
    stream_gaps = resolve_gaps(dropped, cfg.granularity)
    block_gaps = gaps_of(dropped, "block")
    wants_branch = any(e.kind == registry.BRANCH for e in entries)
    wants_sinks = cfg.report_sinks or any(e.uses_sinks for e in entries)
    calib_cfg = replace(cfg.calibration, replaceme=wants_branch,
                        reservoir_tokens=cfg.calibration.reservoir_tokens if any(e.reservoir for e in entries) else 0)
    all_gaps = sorted(set(stream_gaps) | (set(block_gaps) if wants_branch else set()),
                      key=lambda g: (g.start, g.end))
    rule = cfg.sink_rule()
    detector = SinkDetector(rule) if wants_sinks else None

    started = time.perf_counter()
    stats, passes = collect_cached(cache, identity, model, calib_windows, all_gaps, calib_cfg,
                                   sink_detector=detector, progress=progress)
    passes = {"calibration": passes}
    heldout = None
    if heldout_windows is not None:
        heldout, passes["held-out"] = collect_cached(
            cache, identity, model, heldout_windows, all_gaps, replace(calib_cfg, reservoir_tokens=0),
            sink_detector=SinkDetector(rule) if wants_sinks else None,
            progress=progress, label="held-out statistics")
    shared = "reused" if set(passes.values()) == {"reused"} else "computed"
    calib_seconds = time.perf_counter() - started
    fit_warnings = _conditioning_warnings(entries, stream_gaps, stats, cfg, calib_windows)
    ctx = FitContext(model, dropped, stream_gaps, block_gaps, stats, heldout, calib_windows, heldout_windows, cfg,
                     calib_cfg, rule, progress, calib_seconds, shared)
    results = {}
    for entry in entries:
        results[entry.name] = _fit_method(entry, ctx)
        if progress is not None:  # a step per method: a caller can stop the fits between two (the app's Cancel)
            progress(f"fitted {entry.name}", 1, 1)
    return RecoveryRun(dropped=dropped, base_layers=total, config=cfg, results=results,
                       calib_seconds=calib_seconds, protocol=dict(getattr(calib_windows, "protocol", {})),
                       sinks=sink_report(stats, detector) if wants_sinks else pd.DataFrame(),
                       statistics=passes,
                       warnings=fit_warnings)


def _fit_method(entry: registry.Method, ctx: FitContext) -> MethodResult:
    """One method's result, by its registry entry: a whole-cut fit, or one fit per gap (sequential
    when the mode asks for it and the method has that mode; otherwise its notes say it was not)."""
    fit = registry.fit_function(entry)
    sequential = ctx.cfg.ghost_mode == "sequential"
    if entry.scope == "run":
        result = fit(ctx, entry.name)
    elif sequential and entry.sequential:
        result = _sequential(ctx, entry, fit)
    else:
        result = _per_gap(ctx, entry, fit)
    if sequential and not entry.sequential:
        result.notes.append(f"{entry.name} has no sequential mode: --ghost-mode sequential does not change its "
                            "fit (each gap is fitted as in independent mode)")
    return result


def _per_gap(ctx: FitContext, entry: registry.Method, fit: Callable) -> MethodResult:
    """Fit every gap from the shared statistics (independent mode) and assemble the model."""
    t0 = time.perf_counter()
    gaps = ctx.gaps_for(entry)
    fits, choices = {}, []
    for g in gaps:
        fits[g], details = fit(ctx.stats[g], ctx.heldout[g] if ctx.heldout else None, ctx.cfg)
        if details:
            choices.append({"method": entry.name, "gap": gap_text(g), **details})
    return assembled_result(ctx, entry, fits, choices, time.perf_counter() - t0, ctx.pick(ctx.stats, gaps),
                      ctx.pick(ctx.heldout, gaps), ctx.calib_seconds, statistics=ctx.shared)


def assembled_result(ctx: FitContext, entry: registry.Method, fits: dict[Gap, GapFit], choices: list[dict],
               solve_seconds: float, stats, heldout, calib_seconds: float, **extra) -> MethodResult:
    """The model with ``fits`` at their gaps, as ``entry``'s result."""
    built = assemble(ctx.model, ctx.dropped, fits, entry.name, ctx.cfg.fold, ctx.rule)
    ops = {g: (f.branch if f.branch is not None else f.stream) for g, f in fits.items()}
    return MethodResult(entry.name, built, registry.RESULT_KINDS[entry.kind], ops, stats, heldout, solve_seconds,
                        calib_seconds, fits=fits, choices=choices, **extra)


def _conditioning_warnings(entries, gaps, stats, cfg: RecoveryConfig, calib_windows) -> list[str]:
    """Warn once per gap whose ghost fit is ill-conditioned (too few tokens, huge condition number)."""
    if not any(e.conditioning for e in entries):
        return []
    seq_len, messages = calib_windows.input_ids.size(1), []
    for gap in gaps:  # a plain loop: stacklevel 4 points at recover's caller on every Python
        message = solve.warn_if_ill_conditioned(stats[gap], cfg.eps, seq_len, stacklevel=4)
        if message:
            messages.append(message)
    return messages


@dataclass
class SequentialFits:
    """One sequential pass: per gap its fit, the statistics it was fitted on and the choice details."""

    fits: dict = field(default_factory=dict)  # Gap -> GapFit
    stats: dict = field(default_factory=dict)  # Gap -> BoundaryStats on the upstream-patched model
    heldout: dict = field(default_factory=dict)  # Gap -> held-out BoundaryStats (None without windows)
    details: dict = field(default_factory=dict)  # Gap -> the fit's details for the run's choices
    calib_seconds: float = 0.0  # collecting the statistics
    solve_seconds: float = 0.0  # fitting


def sequential_fits(ctx: FitContext, fit: Callable, label: str, sinks: bool) -> SequentialFits:
    """Fit each gap with ``fit`` on the stream of the model already pruned and patched upstream."""
    out = SequentialFits()
    for gap in ctx.stream_gaps:
        t0 = time.perf_counter()
        out.stats[gap], out.heldout[gap] = ctx.stats_upstream(gap, dict(out.fits), label, sinks)
        t1 = time.perf_counter()
        out.fits[gap], out.details[gap] = fit(out.stats[gap], out.heldout[gap], ctx.cfg)
        out.calib_seconds += t1 - t0
        out.solve_seconds += time.perf_counter() - t1
    return out


def _sequential(ctx: FitContext, entry: registry.Method, fit: Callable) -> MethodResult:
    """Fit each gap's operator on the stream of the model already pruned and patched upstream."""
    done = sequential_fits(ctx, fit, entry.name, entry.uses_sinks)
    choices = [{"method": entry.name, "gap": gap_text(g), **d} for g, d in done.details.items() if d]
    held = done.heldout if ctx.heldout_windows is not None else None
    return assembled_result(ctx, entry, done.fits, choices, done.solve_seconds, done.stats, held, done.calib_seconds,
                      notes=["sequential: each gap fitted on the upstream-patched model"])

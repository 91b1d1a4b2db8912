"""Fit every recovery method from one calibration pass and build each recovered model.

Methods (all training-free, all behind one interface):
  * ``none``: plain pruning.
  * ``ghost``: the paper's method exactly: W = I + M on the residual stream,
    (XᵀX + εI)M = XᵀΔ in float64.
  * ``ghost-robust``: W fitted on non-sink tokens, sink tokens mapped apart (see ``sinks.py``).
  * ``ghost-auto``: per gap, ``ghost``, ``ghost-robust`` or no operator, whichever has the lower
    next-token NLL on held-out calibration windows (so never worse there than plain pruning).
  * ``replaceme-ls`` / ``replaceme-cos``: a map T on the MLP output of the last kept layer, folded
    into its output projection (least squares, or ReplaceMe's cosine objective with Adam);
    ``replaceme-ls-robust`` fits T on non-sink tokens and maps sinks apart, like ``ghost-robust``.
  * ``linearpatch-diag`` / ``linearpatch-rotate``: LinearPatch's channel scaling, plain or in a
    Hadamard basis.
  * ``ghost-lowrank`` (``-robust``), ``prunecomp``, ``streamline-ffn`` / ``streamline-layer``: the best rank-R ghost,
    Prune&Comp's fused magnitude scale and LLM-Streamline's trained replacements (``ghosted.recovery.frontier``).
The input model is never modified; each method gets its own model object sharing the kept weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pandas as pd
import torch
from torch import nn

from ghosted.recovery import diagnostics, solvers as solve
from ghosted.recovery import methods as registry
from ghosted.recovery.methods import MethodResult
from ghosted.models.architecture import num_layers
from ghosted.operators.assembly import GapFit, assemble
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats, gaps_of
from ghosted.core.guards import check_eps
from ghosted.models.pruning import build_variant, parse_layers
from ghosted.recovery.robust import fit_robust
from ghosted.calibration.sinks import SinkDetector, SinkRule, sink_report
from ghosted.calibration.stats import BoundaryStats
from ghosted.calibration.cache import collect_cached, model_identity, resolve_cache
from ghosted.recovery.streamline import StreamlineConfig

# The names and kinds come from the registry (ghosted.recovery.methods); the fits are dispatched below.
STREAM_METHODS = registry.names_of(registry.STREAM)
BRANCH_METHODS = registry.names_of(registry.BRANCH)
FRONTIER_METHODS = registry.names_of(registry.WEIGHTS, registry.TRAINED)  # see ghosted.recovery.frontier
METHODS = registry.FITTED  # "none" and every method recover() fits
SINK_METHODS = ("ghost-robust", "ghost-auto", "replaceme-ls-robust", "ghost-lowrank-robust")
Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class RecoveryConfig:
    """Settings of the recovery methods (defaults follow each method's paper and code)."""

    eps: float = 1e-6  # absolute ridge of the ghost solve, as in the paper's code
    solver: str = "solve"  # "solve" (normal equations) or "pinv" (exact minimum-norm, SVD cutoff)
    rcond: float = 1e-6  # singular-value cutoff (relative to the largest) for solver="pinv"
    mode: str = "independent"  # "independent" (paper: all fits on the dense model) or "sequential"
    granularity: str = "auto"  # "block": one operator per contiguous run; "layer": one per removed
    # layer (paper's non-contiguous mode); "auto": block for one contiguous run, layer otherwise
    replaceme_ridge: float = 0.0  # ReplaceMe's alpha (0 in its configs)
    replaceme_fold: bool = True  # fold T into the output projection (plain checkpoint) when possible
    cos_epochs: int = 10  # ReplaceMe-cosine: Adam epochs over the token reservoir (its default)
    cos_lr: float = 1e-4  # ReplaceMe-cosine learning rate (its default)
    cos_batch_tokens: int = 1024  # ReplaceMe-cosine minibatch (its default)
    sink_position: bool = True  # robust methods: the first token of each sequence is a sink
    sink_norm_factor: float | None = None  # robust methods: also tokens with ‖x‖ > factor × median
    sink_map: str = "constant"  # what sinks become: "constant" (mean X_post) or "affine"
    choose_ridge: bool = True  # robust methods: pick the ridge on held-out calibration tokens
    rank: int | None = None  # ghost-lowrank: rank R of M = U·V (None: d/4)
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

    def errors(self) -> pd.DataFrame:
        """Boundary error per gap, method ("pruned" = no recovery) and split (fit / heldout)."""
        rows = []
        for name, r in self.results.items():
            label = "pruned" if name == "none" else name
            for split, stats in (("fit", r.stats), ("heldout", r.heldout or {})):
                rows += [diagnostics.error_rows(label, g, r.fits.get(g), s, split) for g, s in stats.items()]
        return pd.DataFrame(rows)

    def spectra(self) -> pd.DataFrame:
        """Singular values of Δ ("pruned") and of each method's residual, per gap (fit tokens)."""
        frames = []
        for name, r in self.results.items():
            for g, s in r.stats.items():
                frames.append(diagnostics.spectrum_frame(name, g, r.fits.get(g), s))
                frames.append(diagnostics.spectrum_frame("pruned", g, None, s))
        frame = _concat(frames)
        frame = frame[frame.method != "none"] if len(frame) else frame
        return frame.drop_duplicates(["boundary", "method", "index"]).reset_index(drop=True)

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
    unknown = [m for m in methods if m not in METHODS and m != "dense"]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from dense, {', '.join(METHODS)}.")
    if any(m in BRANCH_METHODS for m in methods) and 0 in dropped:
        raise ValueError("ReplaceMe maps the MLP output of the layer before a removed block, so it "
                         "cannot recover a block that starts at layer 0. Keep layer 0 or drop ReplaceMe.")
    if "ghost-auto" in methods and not has_heldout:
        raise ValueError("ghost-auto chooses on held-out calibration windows: give some (heldout_seqs > 0).")


def _fit_plain(method: str, stats: BoundaryStats, cfg: RecoveryConfig) -> GapFit:
    if method == "ghost":
        return GapFit(stream=solve.ghost_operator(stats, eps=cfg.eps, solver=cfg.solver, rcond=cfg.rcond))
    if method == "ghost-lowrank":
        from ghosted.recovery.frontier import fit_lowrank
        return fit_lowrank(stats, cfg)
    if method.startswith("linearpatch"):
        return GapFit(stream=solve.linearpatch_operator(stats, rotate=method.endswith("rotate")))
    if method == "replaceme-ls":
        return GapFit(branch=solve.replaceme_ls(stats, ridge=cfg.replaceme_ridge))
    if method == "replaceme-ls-robust":
        clean = stats.without_sink()
        return GapFit(branch=solve.replaceme_ls(clean, ridge=cfg.replaceme_ridge),
                      sink_map=fit_robust(stats, None, sink_kind=cfg.sink_map, choose_ridge=False).sink_map)
    if method == "replaceme-cos":
        sample = stats.replaceme_samples
        with torch.enable_grad():
            return GapFit(branch=solve.replaceme_cosine(
                sample.m, sample.target, epochs=cfg.cos_epochs, lr=cfg.cos_lr,
                batch_tokens=cfg.cos_batch_tokens, seed=cfg.calibration.seed))
    raise ValueError(f"Unknown method {method!r}; choose from {', '.join(METHODS)}.")


def _fit_robust(gap: Gap, stats, heldout, cfg: RecoveryConfig) -> tuple[GapFit, dict]:
    fit = fit_robust(stats, heldout, eps=cfg.eps, sink_kind=cfg.sink_map, choose_ridge=cfg.choose_ridge,
                     solver=cfg.solver)
    choice = {"method": "ghost-robust", "boundary": f"{gap.start}-{gap.end}", "ridge": fit.eps,
              "relative_ridge": fit.relative_ridge, "heldout_nonsink_error": fit.heldout_error,
              "sink_map": fit.sink_map.kind}
    return GapFit(stream=fit.weight, sink_map=fit.sink_map), choice


def recover(model: nn.Module, drop, methods, calib_windows, heldout_windows=None,
            config: RecoveryConfig | None = None, progress: Progress | None = None,
            show_tqdm: bool = True, cache=None) -> RecoveryRun:
    """Prune ``drop`` from ``model`` and fit each method in ``methods`` on ``calib_windows``.

    ``cache`` (``True`` or a ``cache.StatsCache``) reuses calibration statistics saved by an
    earlier call with the same model, windows, gaps and settings, and saves new ones.

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
    methods = [m for m in dict.fromkeys(methods) if m != "dense"]
    check_methods(methods, dropped, heldout_windows is not None)
    stream_gaps = resolve_gaps(dropped, cfg.granularity)
    block_gaps = gaps_of(dropped, "block")
    wants_branch = any(m in BRANCH_METHODS for m in methods)
    wants_sinks = cfg.report_sinks or any(m in SINK_METHODS for m in methods)
    calib_cfg = replace(cfg.calibration, replaceme=wants_branch,
                        reservoir_tokens=cfg.calibration.reservoir_tokens if "replaceme-cos" in methods else 0)
    all_gaps = sorted(set(stream_gaps) | (set(block_gaps) if wants_branch else set()),
                      key=lambda g: (g.start, g.end))
    rule = cfg.sink_rule()
    detector = SinkDetector(rule) if wants_sinks else None

    def stage(name):
        return (lambda done, n: progress(name, done, n)) if progress else None

    started = time.perf_counter()
    stats, passes = collect_cached(cache, identity, model, calib_windows, all_gaps, calib_cfg,
                                   sink_detector=detector, progress=stage("calibration"), show_tqdm=show_tqdm)
    passes = {"calibration": passes}
    heldout = None
    if heldout_windows is not None:
        heldout, passes["held-out"] = collect_cached(
            cache, identity, model, heldout_windows, all_gaps, replace(calib_cfg, reservoir_tokens=0),
            sink_detector=SinkDetector(rule) if wants_sinks else None,
            progress=stage("held-out statistics"), show_tqdm=show_tqdm)
    shared = "reused" if set(passes.values()) == {"reused"} else "computed"
    calib_seconds = time.perf_counter() - started
    fit_warnings = _conditioning_warnings(methods, stream_gaps, stats, cfg, calib_windows)
    keep = [i for i in range(total) if i not in set(dropped)]
    results: dict[str, MethodResult] = {}
    for method in methods:
        gaps = block_gaps if method in BRANCH_METHODS else stream_gaps
        pick = lambda d: None if d is None else {g: d[g] for g in gaps}  # noqa: E731
        if method == "none":
            results[method] = MethodResult("none", build_variant(model, keep), "none", {}, pick(stats),
                                           pick(heldout), 0.0, 0.0, statistics=shared)
            continue
        if method in ("ghost", "ghost-robust") and cfg.mode == "sequential":
            results[method] = _sequential(method, model, dropped, stream_gaps, calib_windows, heldout_windows,
                                          cfg, calib_cfg, rule, stage, show_tqdm)
            continue
        if method in FRONTIER_METHODS:
            from ghosted.recovery.frontier import fit_frontier
            results[method] = fit_frontier(method, model, dropped, stats, heldout, calib_windows, heldout_windows,
                                           cfg, stage, calib_seconds)
            continue
        t0 = time.perf_counter()
        choices: list[dict] = []
        if method == "ghost-auto":
            fits, choices = _auto(model, dropped, stream_gaps, stats, heldout, heldout_windows, cfg, rule,
                                  stage, show_tqdm, results)
        elif method == "ghost-robust":
            fits = {}
            for g in gaps:
                fits[g], choice = _fit_robust(g, stats[g], heldout[g] if heldout else None, cfg)
                choices.append(choice)
        elif method == "ghost-lowrank-robust":
            from ghosted.recovery.frontier import fit_lowrank_robust
            fits = {g: fit_lowrank_robust(stats[g], heldout[g] if heldout else None, cfg) for g in gaps}
        else:
            fits = {g: _fit_plain(method, stats[g], cfg) for g in gaps}
        solve_seconds = time.perf_counter() - t0
        built = assemble(model, dropped, fits, method, cfg.replaceme_fold, rule)
        kind = "branch" if method in BRANCH_METHODS else "stream"
        ops = {g: (f.branch if f.branch is not None else f.stream) for g, f in fits.items()}
        results[method] = MethodResult(method, built, kind, ops, pick(stats), pick(heldout),
                                       solve_seconds, calib_seconds, fits=fits, choices=choices,
                                       statistics=shared)
    return RecoveryRun(dropped=dropped, base_layers=total, config=cfg, results=results,
                       calib_seconds=calib_seconds, protocol=dict(getattr(calib_windows, "protocol", {})),
                       sinks=sink_report(stats, detector) if wants_sinks else pd.DataFrame(),
                       statistics=passes,
                       warnings=fit_warnings)


def _conditioning_warnings(methods, gaps, stats, cfg: RecoveryConfig, calib_windows) -> list[str]:
    """Warn once per gap whose ghost fit is ill-conditioned (too few tokens, huge condition number)."""
    if not any(m in ("ghost", "ghost-robust", "ghost-auto") for m in methods):
        return []
    seq_len, messages = calib_windows.input_ids.size(1), []
    for gap in gaps:  # a plain loop: stacklevel 4 points at recover's caller on every Python
        message = solve.warn_if_ill_conditioned(stats[gap], cfg.eps, seq_len, stacklevel=4)
        if message:
            messages.append(message)
    return messages


AUTO_CANDIDATES = ("paper", "robust", "none")  # ghost-auto's choices per gap; "none": no operator there


def _auto(model, dropped, gaps, stats, heldout, heldout_windows, cfg, rule, stage, show_tqdm, done):
    """Per gap, the paper's fit, the robust one or no operator, by held-out next-token NLL.

    Starts from the better of "paper everywhere" and "no operator anywhere", then tries every other
    candidate gap by gap and keeps what lowers the held-out NLL, so the result is never worse on the
    held-out windows than plain pruning, nor than the paper's fit. Each configuration is scored once.
    """
    from ghosted.evaluation.perplexity import perplexity

    paper = {g: (done["ghost"].fits[g] if "ghost" in done and g in done["ghost"].fits
                 else _fit_plain("ghost", stats[g], cfg)) for g in gaps}
    robust = {g: _fit_robust(g, stats[g], heldout[g], cfg)[0] for g in gaps}
    options = {"paper": paper, "robust": robust}
    scored: dict[tuple[str, ...], float] = {}

    def nll(picks: tuple[str, ...]) -> float:
        if picks not in scored:
            fits = {g: options[p][g] for g, p in zip(gaps, picks) if p != "none"}
            scored[picks] = perplexity(assemble(model, dropped, fits, "ghost-auto", rule=rule), heldout_windows,
                                       batch_size=cfg.calibration.batch_size, show_tqdm=False,
                                       label="ghost-auto held-out").nll
        return scored[picks]

    current = min((("paper",) * len(gaps), ("none",) * len(gaps)), key=nll)
    choices = []
    for i, g in enumerate(gaps):
        if stage("auto: choosing per gap"):
            stage("auto: choosing per gap")(i, len(gaps))
        trials = {c: nll(current[:i] + (c,) + current[i + 1:]) for c in AUTO_CANDIDATES}
        pick = min(AUTO_CANDIDATES, key=lambda c: (trials[c], c != current[i]))  # ties keep the current one
        current = current[:i] + (pick,) + current[i + 1:]
        choices.append({"method": "ghost-auto", "boundary": f"{g.start}-{g.end}", "chosen": pick,
                        **{f"nll_{c}": trials[c] for c in AUTO_CANDIDATES},
                        "reason": f"held-out NLL {trials['paper']:.4f} (paper), {trials['robust']:.4f} (robust), "
                                  f"{trials['none']:.4f} (no operator) on {heldout_windows.input_ids.numel()} "
                                  f"tokens; chose {_AUTO_LABEL[pick]}"})
    return {g: options[p][g] for g, p in zip(gaps, current) if p != "none"}, choices


_AUTO_LABEL = {"paper": "the paper's fit", "robust": "the robust fit",
               "none": "no operator (plain pruning is best here)"}


def _sequential(method, model, dropped, gaps, calib_windows, heldout_windows, cfg, calib_cfg, rule, stage,
                show_tqdm) -> MethodResult:
    """Fit each gap's operator on the stream of the model already pruned and patched upstream."""
    fits: dict[Gap, GapFit] = {}
    fit_stats, held_stats, choices = {}, {}, []
    calib_seconds = solve_seconds = 0.0
    seq_cfg = replace(calib_cfg, replaceme=False, reservoir_tokens=0)
    robust = method == "ghost-robust"
    for gap in gaps:
        upstream = [i for g in fits for i in g.layers]
        partial = assemble(model, upstream, fits, method, rule=rule)
        t0 = time.perf_counter()
        detector = (lambda: SinkDetector(rule)) if robust else (lambda: None)
        fit_stats[gap] = collect_stats(model, calib_windows, [gap], seq_cfg, x_model=partial,
                                       sink_detector=detector(), progress=stage(f"sequential fit of gap {gap}"),
                                       show_tqdm=show_tqdm)[gap]
        if heldout_windows is not None:
            held_stats[gap] = collect_stats(model, heldout_windows, [gap], seq_cfg, x_model=partial,
                                            sink_detector=detector(), show_tqdm=show_tqdm)[gap]
        t1 = time.perf_counter()
        if robust:
            fits[gap], choice = _fit_robust(gap, fit_stats[gap], held_stats.get(gap), cfg)
            choices.append(choice)
        else:
            fits[gap] = _fit_plain("ghost", fit_stats[gap], cfg)
        calib_seconds += t1 - t0
        solve_seconds += time.perf_counter() - t1
    built = assemble(model, dropped, fits, method, rule=rule)
    ops = {g: f.stream for g, f in fits.items()}
    return MethodResult(method, built, "stream", ops, fit_stats, held_stats or None, solve_seconds,
                        calib_seconds, notes=["sequential: each gap fitted on the upstream-patched model"],
                        fits=fits, choices=choices)

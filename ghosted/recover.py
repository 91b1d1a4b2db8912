"""Fit every recovery method from one calibration pass and build each recovered model.

Methods (all training-free, all behind one interface):
  * ``none``: plain pruning.
  * ``ghost``: the paper's W = I + M on the residual stream, (XᵀX + εI)M = XᵀΔ in float64.
  * ``replaceme-ls`` / ``replaceme-cos``: a map T on the MLP output of the last kept layer, folded
    into its output projection (least squares, or ReplaceMe's cosine objective with Adam).
  * ``linearpatch-diag`` / ``linearpatch-rotate``: LinearPatch's channel scaling, plain or in a
    Hadamard basis.
The input model is never modified; each method gets its own model object sharing the kept weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from ghosted import solve
from ghosted.analysis import antisymmetric_share, error_frame, spectra_frame
from ghosted.arch import num_layers
from ghosted.calibrate import CalibrationConfig, Gap, collect_stats, gaps_of
from ghosted.patch import (BranchOperator, StreamOperator, attach_branch_operator,
                           attach_stream_operators, fold_branch_operator, site_for_gap)
from ghosted.prune import build_variant, parse_layers
from ghosted.stats import BoundaryStats

STREAM_METHODS = ("ghost", "linearpatch-diag", "linearpatch-rotate")
BRANCH_METHODS = ("replaceme-ls", "replaceme-cos")
METHODS = ("none", *STREAM_METHODS, *BRANCH_METHODS)
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
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)


@dataclass
class MethodResult:
    """One recovered model and what produced it."""

    method: str
    model: nn.Module
    kind: str  # "stream", "branch" or "none"
    operators: dict[Gap, torch.Tensor]  # float64 W (stream) or T (branch) per gap
    stats: dict[Gap, BoundaryStats]  # the statistics it was fitted on
    heldout: dict[Gap, BoundaryStats] | None
    solve_seconds: float
    calib_seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass
class RecoveryRun:
    """Everything one ``recover`` call produced, with tidy frames for display."""

    dropped: list[int]
    base_layers: int
    config: RecoveryConfig
    results: dict[str, MethodResult]
    calib_seconds: float
    protocol: dict = field(default_factory=dict)

    def errors(self) -> pd.DataFrame:
        """Boundary error per gap, method and split (fit / heldout)."""
        frames = [error_frame(r.stats[g], (r.heldout or {}).get(g), {name: _as_op(r, g)},
                              include_pruned=False)
                  for name, r in self.results.items() if r.kind != "none" for g in r.operators]
        first = next(iter(self.results.values()))
        frames += [error_frame(first.stats[g], (first.heldout or {}).get(g), {}, include_pruned=True)
                   for g in first.stats]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def spectra(self) -> pd.DataFrame:
        """Singular values of Δ ("pruned") and of each method's residual, per gap."""
        frames = []
        for name, r in self.results.items():
            for g, stats in r.stats.items():
                ops = {name: _as_op(r, g)} if g in r.operators else {}
                frames.append(spectra_frame(stats, ops, include_pruned=name == "none" or not frames))
        return pd.concat(frames, ignore_index=True).drop_duplicates(["boundary", "method", "index"])

    def asymmetry(self) -> pd.DataFrame:
        """Antisymmetric share of M = W − I for every full-stream operator."""
        rows = []
        for name, r in self.results.items():
            for g, w in r.operators.items():
                if r.kind == "stream":
                    eye = torch.eye(w.shape[0], dtype=w.dtype, device=w.device)
                    rows.append({"method": name, "boundary": f"{g.start}-{g.end}",
                                 **antisymmetric_share(w - eye)})
        return pd.DataFrame(rows)


def _as_op(result: MethodResult, gap: Gap):
    return ("mlp" if result.kind == "branch" else "stream", result.operators[gap])


def resolve_gaps(dropped: list[int], granularity: str) -> list[Gap]:
    blocks = gaps_of(dropped, "block")
    if granularity == "auto":
        granularity = "block" if len(blocks) == 1 else "layer"
    if granularity not in ("block", "layer"):
        raise ValueError(f"Unknown granularity {granularity!r}; use auto, block or layer.")
    return gaps_of(dropped, granularity)


def stream_model(model: nn.Module, dropped: list[int], operators: dict[Gap, torch.Tensor],
                 method: str) -> nn.Module:
    """The pruned model with full-stream operators at their gaps (chained in gap order per site)."""
    keep = [i for i in range(num_layers(model)) if i not in set(dropped)]
    sites: dict = {}
    for gap in sorted(operators, key=lambda g: g.start):
        site = site_for_gap(keep, gap.start)
        sites.setdefault((site.index, site.before), (site, []))[1].append(
            StreamOperator(operators[gap], (gap.start, gap.end), method))
    new = build_variant(model, keep, clone=[keep[s.index] for s, _ in sites.values()])
    for site, ops in sites.values():
        attach_stream_operators(new, site, ops)
    return new


def branch_model(model: nn.Module, dropped: list[int], operators: dict[Gap, torch.Tensor],
                 method: str, fold: bool = True) -> nn.Module:
    """The pruned model with ReplaceMe maps on the MLP branch of the layer before each gap."""
    keep = [i for i in range(num_layers(model)) if i not in set(dropped)]
    targets = {gap: site_for_gap(keep, gap.start) for gap in operators}
    new = build_variant(model, keep, clone=[keep[s.index] for s in targets.values()])
    for gap, site in targets.items():
        if fold:
            fold_branch_operator(new, site.index, operators[gap])
        else:
            attach_branch_operator(new, site.index, BranchOperator(operators[gap], (gap.start, gap.end), method))
    return new


def _fit(method: str, stats: BoundaryStats, cfg: RecoveryConfig) -> torch.Tensor:
    if method == "ghost":
        return solve.ghost_operator(stats, eps=cfg.eps, solver=cfg.solver, rcond=cfg.rcond)
    if method.startswith("linearpatch"):
        return solve.linearpatch_operator(stats, rotate=method.endswith("rotate"))
    if method == "replaceme-ls":
        return solve.replaceme_ls(stats, ridge=cfg.replaceme_ridge)
    if method == "replaceme-cos":
        sample = stats.replaceme_samples
        with torch.enable_grad():
            return solve.replaceme_cosine(sample.m, sample.target, epochs=cfg.cos_epochs, lr=cfg.cos_lr,
                                          batch_tokens=cfg.cos_batch_tokens, seed=cfg.calibration.seed)
    raise ValueError(f"Unknown method {method!r}; choose from {', '.join(METHODS)}.")


def check_methods(methods: list[str], dropped: list[int]) -> None:
    unknown = [m for m in methods if m not in METHODS and m != "dense"]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from dense, {', '.join(METHODS)}.")
    if any(m in BRANCH_METHODS for m in methods) and 0 in dropped:
        raise ValueError("ReplaceMe maps the MLP output of the layer before a removed block, so it "
                         "cannot recover a block that starts at layer 0. Keep layer 0 or drop ReplaceMe.")


def recover(model: nn.Module, drop, methods, calib_windows, heldout_windows=None,
            config: RecoveryConfig | None = None, progress: Progress | None = None,
            show_tqdm: bool = True) -> RecoveryRun:
    """Prune ``drop`` from ``model`` and fit each method in ``methods`` on ``calib_windows``.

    Example:
        >>> run = recover(model, "20-26", ["none", "ghost", "replaceme-ls"], calib, heldout)
        >>> run.results["ghost"].model         # a new model; ``model`` is unchanged
        >>> run.errors()                       # boundary errors, fit and held-out
    """
    cfg = config or RecoveryConfig()
    total = num_layers(model)
    dropped = parse_layers(drop, total)
    if not dropped:
        raise ValueError("Choose at least one layer to drop.")
    methods = [m for m in dict.fromkeys(methods) if m != "dense"]
    check_methods(methods, dropped)
    stream_gaps = resolve_gaps(dropped, cfg.granularity)
    block_gaps = gaps_of(dropped, "block")
    wants_branch = any(m in BRANCH_METHODS for m in methods)
    calib_cfg = CalibrationConfig(**{**cfg.calibration.__dict__, "replaceme": wants_branch})
    all_gaps = sorted(set(stream_gaps) | (set(block_gaps) if wants_branch else set()),
                      key=lambda g: (g.start, g.end))

    def stage(name):
        return (lambda done, n: progress(name, done, n)) if progress else None

    started = time.perf_counter()
    stats = collect_stats(model, calib_windows, all_gaps, calib_cfg, progress=stage("calibration"),
                          show_tqdm=show_tqdm)
    heldout = None if heldout_windows is None else collect_stats(
        model, heldout_windows, all_gaps, CalibrationConfig(**{**calib_cfg.__dict__, "reservoir_tokens": 0}),
        progress=stage("held-out statistics"), show_tqdm=show_tqdm)
    calib_seconds = time.perf_counter() - started
    results: dict[str, MethodResult] = {}
    for method in methods:
        if method == "none":
            results[method] = MethodResult("none", build_variant(model, [i for i in range(total) if i not in dropped]),
                                           "none", {}, {g: stats[g] for g in stream_gaps},
                                           None if heldout is None else {g: heldout[g] for g in stream_gaps}, 0.0, 0.0)
            continue
        if method == "ghost" and cfg.mode == "sequential":
            results[method] = _sequential_ghost(model, dropped, stream_gaps, calib_windows, heldout_windows,
                                                cfg, calib_cfg, stage, show_tqdm)
            continue
        gaps = block_gaps if method in BRANCH_METHODS else stream_gaps
        t0 = time.perf_counter()
        ops = {g: _fit(method, stats[g], cfg) for g in gaps}
        solve_seconds = time.perf_counter() - t0
        if method in BRANCH_METHODS:
            fold = cfg.replaceme_fold and _foldable(model)
            built = branch_model(model, dropped, ops, method, fold=fold)
            kind = "branch"
        else:
            built, kind = stream_model(model, dropped, ops, method), "stream"
        results[method] = MethodResult(method, built, kind, ops, {g: stats[g] for g in gaps},
                                       None if heldout is None else {g: heldout[g] for g in gaps},
                                       solve_seconds, calib_seconds)
    return RecoveryRun(dropped=dropped, base_layers=total, config=cfg, results=results,
                       calib_seconds=calib_seconds,
                       protocol=dict(getattr(calib_windows, "protocol", {})))


def _foldable(model: nn.Module) -> bool:
    from ghosted.arch import spec_for

    return spec_for(model).mlp_out_linear is not None


def _sequential_ghost(model, dropped, gaps, calib_windows, heldout_windows, cfg, calib_cfg, stage,
                      show_tqdm) -> MethodResult:
    """Fit each gap's operator on the stream of the model already pruned and patched upstream."""
    ops: dict[Gap, torch.Tensor] = {}
    fit_stats, held_stats = {}, {}
    calib_seconds = solve_seconds = 0.0
    seq_cfg = CalibrationConfig(**{**calib_cfg.__dict__, "replaceme": False, "reservoir_tokens": 0})
    for gap in gaps:
        done_layers = [i for g in ops for i in g.layers]
        partial = stream_model(model, done_layers, ops, "ghost")
        t0 = time.perf_counter()
        fit_stats[gap] = collect_stats(model, calib_windows, [gap], seq_cfg, x_model=partial,
                                       progress=stage(f"sequential fit of gap {gap}"),
                                       show_tqdm=show_tqdm)[gap]
        if heldout_windows is not None:
            held_stats[gap] = collect_stats(model, heldout_windows, [gap], seq_cfg, x_model=partial,
                                            show_tqdm=show_tqdm)[gap]
        t1 = time.perf_counter()
        ops[gap] = _fit("ghost", fit_stats[gap], cfg)
        calib_seconds += t1 - t0
        solve_seconds += time.perf_counter() - t1
    built = stream_model(model, dropped, ops, "ghost")
    return MethodResult("ghost", built, "stream", ops, fit_stats, held_stats or None, solve_seconds,
                        calib_seconds, notes=["sequential: each gap fitted on the upstream-patched model"])

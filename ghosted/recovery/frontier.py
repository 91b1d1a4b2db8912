"""The recovery frontier's methods behind ``recover``'s interface: low-rank ghost, Prune&Comp and
LLM-Streamline's trained replacements. Each returns a ``MethodResult`` like the other methods.

  * ``ghost-lowrank``: ``lowrank.py``; one operator per gap like ``ghost``, stored as two factors;
    ``ghost-lowrank-robust`` fits them on the non-sink tokens (ridge chosen on held-out tokens for
    the full-rank robust fit, as ``ghost-robust``) and maps the sink tokens apart.
  * ``prunecomp``: ``prunecomp.py``; a plain checkpoint (no operator), one scale per block gap.
    Its ``fits`` hold the equivalent stream map W = scale·I per gap, for the error frames only.
  * ``streamline-ffn`` / ``streamline-layer``: ``streamline.py``; trained per block gap. Their
    boundary errors cannot be read from second moments (the maps are non-linear), so their
    ``stats`` are empty and ``choices`` carry the training and held-out losses instead.
"""

from __future__ import annotations

import time

import torch

from ghosted.operators.assembly import GapFit
from ghosted.recovery.lowrank import default_rank, lowrank_factors
from ghosted.calibration.stats import BoundaryStats


def fit_lowrank(stats: BoundaryStats, cfg) -> GapFit:
    """One gap's low-rank ghost fit: factors for the operator, the dense W for diagnostics."""
    rank = cfg.rank or default_rank(stats.dim)
    left, right = lowrank_factors(stats, min(rank, stats.dim), eps=cfg.eps, solver=cfg.solver, rcond=cfg.rcond)
    eye = torch.eye(stats.dim, dtype=left.dtype, device=left.device)
    return GapFit(stream=eye + left @ right, factors=(left, right))


def fit_lowrank_robust(stats: BoundaryStats, heldout: BoundaryStats | None, cfg) -> GapFit:
    """The low-rank fit on the non-sink tokens, with ``ghost-robust``'s held-out ridge and sink map."""
    from ghosted.recovery.robust import fit_robust

    robust = fit_robust(stats, heldout, eps=cfg.eps, sink_kind=cfg.sink_map, choose_ridge=cfg.choose_ridge,
                        solver=cfg.solver)
    clean = stats.without_sink()
    rank = min(cfg.rank or default_rank(stats.dim), stats.dim)
    left, right = lowrank_factors(clean, rank, eps=robust.eps, solver=cfg.solver, rcond=cfg.rcond)
    eye = torch.eye(stats.dim, dtype=left.dtype, device=left.device)
    return GapFit(stream=eye + left @ right, factors=(left, right), sink_map=robust.sink_map)


def fit_frontier(method: str, model, dropped, stats, heldout, calib_windows, heldout_windows, cfg, stage,
                 calib_seconds: float):
    """``prunecomp``, ``streamline-ffn`` or ``streamline-layer`` as a ``MethodResult``."""
    from ghosted.calibration.collect import gaps_of
    from ghosted.recovery.methods import MethodResult

    gaps = gaps_of(dropped, "block")
    pick = lambda d: None if d is None else {g: d[g] for g in gaps if g in d}  # noqa: E731
    started = time.perf_counter()
    if method == "prunecomp":
        from ghosted.recovery.prunecomp import prunecomp

        built, scales, measured = prunecomp(model, dropped, calib_windows, cfg.calibration, first_stats=stats,
                                            progress=stage("prunecomp: measuring scales"))
        eye = {g: torch.eye(s.dim, dtype=torch.float64, device=s.xtx.device) for g, s in measured.items()}
        fits = {g: GapFit(stream=scales[g] * eye[g]) for g in gaps}
        choices = [{"method": "prunecomp", "boundary": f"{g.start}-{g.end}", "scale": scales[g],
                    "reason": "channel mean of mean|stream entering end| / mean|stream entering start| per "
                              "window, fused into the embeddings and every output projection before the cut"}
                   for g in gaps]
        return MethodResult(method, built, "folded", {g: f.stream for g, f in fits.items()}, pick(stats),
                            pick(heldout), time.perf_counter() - started, calib_seconds, fits=fits,
                            choices=choices, notes=["scales fused into the weights: a plain checkpoint"])
    return _streamline(method, model, dropped, gaps, calib_windows, heldout_windows, cfg, stage, calib_seconds)


def _streamline(method, model, dropped, gaps, calib_windows, heldout_windows, cfg, stage, calib_seconds):
    from ghosted.operators.assembly import assemble
    from ghosted.recovery.methods import MethodResult
    from ghosted.recovery.streamline import capture_pairs, train_ffn, train_layer, with_layers

    train_cfg = cfg.streamline
    started = time.perf_counter()
    trained, reports = {}, []
    batch = cfg.calibration.batch_size
    for gap in gaps:
        pairs = capture_pairs(model, calib_windows, gap, train_cfg.max_tokens, train_cfg.seed, batch)
        held = None if heldout_windows is None else capture_pairs(model, heldout_windows, gap, train_cfg.max_tokens,
                                                                  train_cfg.seed, batch)
        progress = (lambda name, done, total: stage(name)(done, total)) if stage("training") else None
        if method == "streamline-ffn":
            trained[gap], report = train_ffn(model, gap, pairs, held, train_cfg, method, progress)
        else:
            trained[gap], report = train_layer(model, gap, pairs, held, train_cfg, progress)
        reports.append(report)
        del pairs, held
    if method == "streamline-ffn":
        built = assemble(model, dropped, {g: GapFit(module=m) for g, m in trained.items()}, method)
    else:
        built = with_layers(model, dropped, trained)
    return MethodResult(method, built, "trained", {}, {}, None, time.perf_counter() - started, calib_seconds,
                        choices=[r.row(method) for r in reports],
                        notes=[f"trained {train_cfg.epochs} epochs on at most {train_cfg.max_tokens} tokens per gap"])

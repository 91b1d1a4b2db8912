"""The recovery frontier's methods behind ``recover``'s interface: low-rank ghost, Prune&Comp and
LLM-Streamline's trained replacements, with the signatures of ``ghosted.recovery.methods`` (the low-rank fits per
gap, the others ``fit(ctx, name) -> MethodResult`` on the whole cut).

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
from ghosted.calibration.collect import gap_text


def fit_lowrank(stats: BoundaryStats, heldout: BoundaryStats | None, cfg) -> tuple[GapFit, dict]:
    """One gap's low-rank ghost fit: factors for the operator, the dense W for diagnostics."""
    rank = cfg.rank or default_rank(stats.dim)
    left, right = lowrank_factors(stats, min(rank, stats.dim), eps=cfg.eps, solver=cfg.solver, rcond=cfg.rcond)
    eye = torch.eye(stats.dim, dtype=left.dtype, device=left.device)
    return GapFit(stream=eye + left @ right, factors=(left, right)), {}


def fit_lowrank_robust(stats: BoundaryStats, heldout: BoundaryStats | None, cfg) -> tuple[GapFit, dict]:
    """The low-rank fit on the non-sink tokens, with ``ghost-robust``'s held-out ridge and sink map."""
    from ghosted.recovery.robust import fit_robust

    robust = fit_robust(stats, heldout, eps=cfg.eps, sink_kind=cfg.sink_map, choose_ridge=cfg.choose_ridge,
                        solver=cfg.solver)
    clean = stats.without_sink()
    rank = min(cfg.rank or default_rank(stats.dim), stats.dim)
    left, right = lowrank_factors(clean, rank, eps=robust.eps, solver=cfg.solver, rcond=cfg.rcond)
    eye = torch.eye(stats.dim, dtype=left.dtype, device=left.device)
    return GapFit(stream=eye + left @ right, factors=(left, right), sink_map=robust.sink_map), {}


def fit_prunecomp(ctx, name: str):
    """``prunecomp``: one magnitude scale per block gap, fused into the weights (a plain checkpoint)."""
    from ghosted.recovery.prunecomp import prunecomp
    from ghosted.recovery.methods import MethodResult

    gaps = ctx.block_gaps
    started = time.perf_counter()
    built, scales, measured = prunecomp(ctx.model, ctx.dropped, ctx.calib_windows, ctx.cfg.calibration,
                                        first_stats=ctx.stats, progress=ctx.progress)
    eye = {g: torch.eye(s.dim, dtype=torch.float64, device=s.xtx.device) for g, s in measured.items()}
    fits = {g: GapFit(stream=scales[g] * eye[g]) for g in gaps}
    choices = [{"method": name, "gap": gap_text(g), "scale": scales[g],
                "reason": "channel mean of mean|stream entering end| / mean|stream entering start| per "
                          "window, fused into the embeddings and every output projection before the cut"}
               for g in gaps]
    return MethodResult(name, built, "folded", {g: f.stream for g, f in fits.items()}, ctx.pick(ctx.stats, gaps),
                        ctx.pick(ctx.heldout, gaps), time.perf_counter() - started, ctx.calib_seconds, fits=fits,
                        choices=choices, notes=["scales fused into the weights: a plain checkpoint"])


def fit_streamline_ffn(ctx, name: str):
    """``streamline-ffn``: a fresh pre-norm FFN block trained per block gap, attached as a module."""
    from ghosted.operators.assembly import assemble
    from ghosted.recovery.streamline import train_ffn

    def train(gap, pairs, held, cfg, progress):
        return train_ffn(ctx.model, gap, pairs, held, cfg, name, progress)

    def build(trained):
        return assemble(ctx.model, ctx.dropped, {g: GapFit(module=m) for g, m in trained.items()}, name)
    return _streamline(ctx, name, train, build)


def fit_streamline_layer(ctx, name: str):
    """``streamline-layer``: a copy of each block's first removed layer, trained, put back in its place."""
    from ghosted.recovery.streamline import train_layer, with_layers

    def train(gap, pairs, held, cfg, progress):
        return train_layer(ctx.model, gap, pairs, held, cfg, progress)
    return _streamline(ctx, name, train, lambda trained: with_layers(ctx.model, ctx.dropped, trained))


def _streamline(ctx, name: str, train, build):
    """Capture the stream pairs of every block gap, ``train`` a replacement on each, ``build`` the model."""
    from ghosted.recovery.methods import MethodResult
    from ghosted.recovery.streamline import capture_pairs

    train_cfg = ctx.cfg.streamline
    started = time.perf_counter()
    trained, reports = {}, []
    batch = ctx.cfg.calibration.batch_size
    for gap in ctx.block_gaps:
        pairs = capture_pairs(ctx.model, ctx.calib_windows, gap, train_cfg.max_tokens, train_cfg.seed, batch)
        held = None if ctx.heldout_windows is None else capture_pairs(
            ctx.model, ctx.heldout_windows, gap, train_cfg.max_tokens, train_cfg.seed, batch)
        trained[gap], report = train(gap, pairs, held, train_cfg, ctx.progress)
        reports.append(report)
        del pairs, held
    return MethodResult(name, build(trained), "trained", {}, {}, None, time.perf_counter() - started,
                        ctx.calib_seconds, choices=[r.row(name) for r in reports],
                        notes=[f"trained {train_cfg.epochs} epochs on at most {train_cfg.max_tokens} tokens per gap"])

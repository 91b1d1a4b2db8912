"""The per-gap fits: ``fit(stats, heldout, cfg) -> (GapFit, details)`` for every closed-form method.

Each reads one gap's calibration statistics (and its held-out ones, where it chooses a ridge) and the
run's settings (``cfg``, a ``RecoveryConfig`` of ``ghosted.recovery.fitting``), and returns
the operator to put at that gap and the details for the run's choices (``{}`` when it chooses nothing).
The registry (``ghosted.recovery.methods``) names them; ``recover`` (``ghosted.recovery.fitting``) calls
them once per gap, or once per gap on the upstream-patched model in sequential mode.
"""

from __future__ import annotations

import torch

from ghosted.calibration.stats import BoundaryStats
from ghosted.operators.assembly import GapFit
from ghosted.recovery import solvers as solve
from ghosted.recovery.robust import fit_robust


def fit_ghost(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    return GapFit(stream=solve.ghost_operator(stats, eps=cfg.eps, solver=cfg.solver, rcond=cfg.rcond)), {}


def fit_ghost_robust(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    fit = fit_robust(stats, heldout, eps=cfg.eps, sink_kind=cfg.sink_map, choose_ridge=cfg.choose_ridge,
                     solver=cfg.solver)
    details = {"ridge": fit.eps, "relative_ridge": fit.relative_ridge, "heldout_nonsink_error": fit.heldout_error,
               "sink_map": fit.sink_map.kind}
    return GapFit(stream=fit.weight, sink_map=fit.sink_map), details


def fit_linearpatch_diag(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    return GapFit(stream=solve.linearpatch_operator(stats, rotate=False)), {}


def fit_linearpatch_rotate(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    return GapFit(stream=solve.linearpatch_operator(stats, rotate=True)), {}


def fit_replaceme_ls(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    return GapFit(branch=solve.replaceme_ls(stats, ridge=cfg.replaceme_ridge)), {}


def fit_replaceme_ls_robust(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    sink_map = fit_robust(stats, None, sink_kind=cfg.sink_map, choose_ridge=False).sink_map
    return GapFit(branch=solve.replaceme_ls(stats.without_sink(), ridge=cfg.replaceme_ridge), sink_map=sink_map), {}


def fit_replaceme_cos(stats: BoundaryStats, heldout, cfg) -> tuple[GapFit, dict]:
    sample = stats.replaceme_samples
    with torch.enable_grad():
        return GapFit(branch=solve.replaceme_cosine(
            sample.m, sample.target, epochs=cfg.cos_epochs, lr=cfg.cos_lr,
            batch_tokens=cfg.cos_batch_tokens, seed=cfg.calibration.seed)), {}

"""The sink-robust ghost fit, its held-out ridge, and the ``auto`` choice per boundary.

* ``robust``: W = I + M fitted on non-sink tokens only; sink tokens get their own map.
* ridge: chosen per gap from a grid, by the non-sink boundary error on held-out calibration
  tokens (closed form from statistics, no forward pass).
* ``auto`` (in ``recover``): per gap, the paper's fit, the robust one or no operator, whichever gives
  the lower next-token NLL on held-out calibration windows (boundary MSE would be dominated by the sink).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ghosted.recovery import solvers as solve
from ghosted.core.guards import check_eps
from ghosted.calibration.sinks import SinkMap, fit_sink_map
from ghosted.calibration.stats import BoundaryStats

RIDGE_GRID = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # × mean eigenvalue of the non-sink XᵀX


@dataclass
class RobustFit:
    """A robust operator for one gap and how its settings were chosen."""

    weight: torch.Tensor  # (d, d) W fitted on non-sink tokens
    sink_map: SinkMap
    eps: float  # absolute ridge used for W
    relative_ridge: float  # eps / mean eigenvalue of the non-sink XᵀX
    heldout_error: float | None  # non-sink relative boundary error on held-out tokens


def fit_robust(stats: BoundaryStats, heldout: BoundaryStats | None, *, eps: float = 1e-6,
               sink_kind: str = "constant", choose_ridge: bool = True, solver: str = "solve") -> RobustFit:
    """Robust fit of one gap; with held-out statistics the ridge is chosen on them.

    Non-finite statistics or a non-finite / negative ``eps`` raise a ValueError naming the gap.
    """
    eps = check_eps(eps)
    solve.require_finite(stats)
    clean = stats.without_sink()
    scale = float(torch.trace(clean.xtx)) / clean.dim / max(clean.n_tokens, 1)  # mean eigenvalue per token
    scale_total = scale * clean.n_tokens
    candidates = [(eps, eps / max(scale_total, 1e-300))]
    if choose_ridge and heldout is not None and heldout.sink is not None:
        candidates += [(r * scale_total, r) for r in RIDGE_GRID if r > 0]
    held_clean = heldout.without_sink() if heldout is not None and heldout.sink is not None else None
    best = None
    for absolute, relative in candidates:
        weight = solve.ghost_operator(clean, eps=absolute, solver=solver)
        err = None if held_clean is None else solve.relative_error(held_clean, solve.stream_error(held_clean, weight))
        if best is None or (err is not None and err < best[3]):
            best = (weight, absolute, relative, err)
    weight, absolute, relative, err = best
    sink_map = _sink_map(stats, heldout, sink_kind)
    for part in (sink_map.constant, sink_map.linear):  # W was checked by the solve itself
        if part is not None:
            solve.require_finite_operator(part, stats, f"{sink_map.kind} sink map")
    return RobustFit(weight, sink_map, absolute, relative, err)


def _sink_map(stats: BoundaryStats, heldout: BoundaryStats | None, kind: str) -> SinkMap:
    """Constant substitution, or an affine map whose ridge is picked on held-out sink tokens."""
    if kind == "constant" or heldout is None or heldout.sink is None:
        return fit_sink_map(stats.sink_only(), kind)
    from ghosted.calibration.sinks import sink_map_error

    maps = [fit_sink_map(stats.sink_only(), "affine", ridge=r) for r in (0.1, 1.0, 10.0, 100.0)]
    return min(maps, key=lambda m: sink_map_error(heldout.sink_only(), m))

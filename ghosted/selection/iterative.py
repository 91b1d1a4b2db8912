"""Prune&Comp's prune-and-compensate loop (arXiv 2507.18212) as a selection rule, ``prunecomp:<criterion>``.

n rounds: the base criterion picks one layer on the current model, the layer is removed and its
magnitude scale (``ghosted.recovery.prunecomp``) is measured and fused, and the compensated model is
scored again. ``ghosted.selection.rules.select`` runs it for metrics that start with ``prunecomp:``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from torch import nn

from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.models.pruning import format_layers, original_indices
from ghosted.recovery.prunecomp import compensate, magnitude_scale


def iterative_select(model: nn.Module, metric: str, n: int, windows,
                     pick: Callable[[nn.Module], tuple[list[int], str]],
                     calibration: CalibrationConfig | None = None) -> tuple[list[int], str]:
    """Prune&Comp's loop on top of any criterion: n times, score the current (compensated) model with
    ``metric``, remove the one layer it picks, measure and fuse its scale. Layers are original indices.

    ``pick(current)`` is ``metric``'s choice of one layer on ``current`` (positions, reason): the rule that
    selects, passed in by ``select`` so that this module does not import it back.
    """
    current, removed, steps = model, [], []
    for _ in range(n):
        picked, _reason = pick(current)
        position = picked[0]
        layer = original_indices(current)[position]
        stats = collect_stats(current, windows, [Gap(layer, _next_layer(current, position))],
                              replace(calibration or CalibrationConfig(), replaceme=False, reservoir_tokens=0))
        scale = magnitude_scale(next(iter(stats.values())))
        current = compensate(current, [position], scale)
        removed.append(layer)
        steps.append(f"{layer} (scale {scale:.4f})")
    reason = (f"prunecomp:{metric} (Prune&Comp's iterative loop): {n} rounds, each removing the layer "
              f"{metric} picks on the model compensated so far, then fusing its magnitude scale: "
              f"{', '.join(steps)}; layers {format_layers(removed)}.")
    return sorted(removed), reason


def _next_layer(model: nn.Module, position: int) -> int:
    """Original index of the stream after ``position``: the next kept layer, or the end."""
    kept = original_indices(model)
    return kept[position + 1] if position + 1 < len(kept) else kept[-1] + 1

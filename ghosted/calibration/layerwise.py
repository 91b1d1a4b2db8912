"""Calibration statistics of every gap from a lazy model, layer by layer: each layer is read once per pass.

The same sums as ``collect.collect_stats``, batch for batch in the same order, so the statistics (and every
operator fitted from them) are bitwise equal. X (the stream entering a gap) and m (the MLP-branch output
before it) are kept per batch from their boundary until the stream Y at the gap's end arrives; then the batch
goes into the gap's accumulator and X is let go once no open gap needs it.
"""

from __future__ import annotations

from torch import nn

from ghosted.calibration.collect import (CalibrationConfig, Gap, SinkDetector, _batches, _index_map, accumulate,
                                         check_gaps)
from ghosted.calibration.stats import BoundaryAccumulator, BoundaryStats
from ghosted.core.progress import Progress
from ghosted.models.lazy import LazyModel
from ghosted.models.layer_pass import LayerPass


def collect_stats_layerwise(lazy: LazyModel, windows, gaps: list[Gap], config: CalibrationConfig | None = None,
                            *, model: nn.Module | None = None, x_model: nn.Module | None = None,
                            sink_detector: SinkDetector | None = None, progress: Progress | None = None,
                            label: str = "calibration (layer-wise)") -> dict[Gap, BoundaryStats]:
    """What ``collect_stats(model, windows, gaps, config, x_model=...)`` returns, for views of ``lazy.model``
    (``model`` defaults to ``lazy.model`` itself); the pass stops after the deepest gap's end."""
    cfg = config or CalibrationConfig()
    y_model = model if model is not None else lazy.model
    x_source = x_model if x_model is not None else y_model
    check_gaps(gaps, _index_map(y_model), _index_map(x_source), cfg.replaceme)
    batches = list(_batches(windows, cfg.batch_size))
    x_at: dict[int, dict[int, object]] = {g.start: {} for g in gaps}  # start -> batch -> X (B, T, d)
    m_at: dict[int, dict[int, object]] = {g.start - 1: {} for g in gaps if cfg.replaceme and g.start > 0}
    accumulators: dict[Gap, BoundaryAccumulator] = {}
    ends = sorted({g.end for g in gaps})

    def on_boundary(name: str, b: int, batch: int, hidden) -> None:
        if name == "x" and b in x_at:
            x_at[b][batch] = hidden
        if name == "y":
            for gap in (g for g in gaps if g.end == b):
                m = m_at[gap.start - 1][batch] if gap.start - 1 in m_at else None
                accumulate(accumulators, gap, (x_at[gap.start][batch], hidden, m), batches[batch][1],
                           batch * cfg.batch_size, cfg, sink_detector)
            if batch == len(batches) - 1:  # the last batch of this end: X no open gap needs is let go
                for start in [s for s in x_at if all(g.end <= b for g in gaps if g.start == s)]:
                    x_at.pop(start)

    def on_mlp(name: str, layer: int, batch: int, hidden) -> None:
        m_at[layer][batch] = hidden

    variants = {"x": x_source, "y": y_model}
    LayerPass(lazy).run(batches, variants, until=ends[-1], boundaries={"x": set(x_at), "y": set(ends)},
                        on_boundary=on_boundary, mlp={"x": set(m_at)}, on_mlp=on_mlp, progress=progress,
                        label=label)
    return {gap: accumulators[gap].finalize() for gap in gaps}


"""Streaming calibration: one forward pass, float64 statistics per gap, no stored activations.

A *gap* is a contiguous run of removed layers [start, end). Its statistics pair X, the stream
entering ``start``, with Y, the stream entering ``end``; ReplaceMe also needs m, the MLP-branch
output of layer start-1. All gaps are served by a single forward pass that stops right after the
deepest boundary needed, and each gap's sums live on the device of its boundary layer.

A model read layer by layer (``ghosted.models.lazy``) gets the same sums, batch for batch in the same order
(so bitwise equal statistics and operators), from one ``LayerPass``: X and m are kept per batch from their
boundary until the stream Y at the gap's end arrives, and X is let go once no open gap needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn

from ghosted.models import memory_plan
from ghosted.models.architecture import hidden_size, num_layers
from ghosted.models.capture import tap
from ghosted.models.layer_pass import LayerPass
from ghosted.models.lazy import LazyModel, lazy_of
from ghosted.models.pruning import format_layers
from ghosted.core.progress import Progress, for_stage
from ghosted.core.guards import NonFiniteError, nonfinite_cause
from ghosted.calibration.stats import BoundaryAccumulator, BoundaryStats

SinkDetector = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (B,T,d), valid (B,T)) -> (B,T) bool


@dataclass(frozen=True)
class Gap:
    """Removed layers [start, end) in original 0-based indexing."""

    start: int
    end: int

    @property
    def layers(self) -> list[int]:
        return list(range(self.start, self.end))

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


def gap_text(gap) -> str:
    """How a user reads a gap (a ``Gap`` or anything with its ``start`` and ``end``, such as
    ``BoundaryStats``): its layers in the drop notation, ``Gap(12, 19)`` -> ``"12-18"``, ``Gap(12, 13)`` ->
    ``"12"``, the text ``--drop`` takes, so that tables, choices and charts name a gap as the user wrote it."""
    return format_layers(range(gap.start, gap.end))


def gaps_of(dropped: list[int], granularity: str = "block") -> list[Gap]:
    """Split dropped layers into gaps: one per contiguous run ("block") or one per layer ("layer")."""
    dropped = sorted(set(dropped))
    if granularity == "layer":
        return [Gap(i, i + 1) for i in dropped]
    gaps: list[Gap] = []
    for i in dropped:
        if gaps and gaps[-1].end == i:
            gaps[-1] = Gap(gaps[-1].start, i + 1)
        else:
            gaps.append(Gap(i, i + 1))
    return gaps


@dataclass
class CalibrationConfig:
    """How calibration statistics are gathered."""

    batch_size: int = 4  # windows per forward pass; memory grows with it, statistics do not
    replaceme: bool = True  # also gather MLP-branch statistics for ReplaceMe
    reservoir_tokens: int = 16384  # token rows kept for ReplaceMe-cosine (bounded memory)
    linearpatch: bool = True  # per-sequence channel ratios for LinearPatch
    seed: int = 0  # reservoir sampling


def _batches(windows, batch_size: int):
    ids = windows.input_ids
    mask = getattr(windows, "attention_mask", None)
    if mask is None:
        mask = torch.ones_like(ids)
    for start in range(0, ids.size(0), batch_size):
        yield ids[start:start + batch_size], mask[start:start + batch_size]


def collect_stats(model: nn.Module, windows, gaps: list[Gap], config: CalibrationConfig | None = None,
                  *, x_model: nn.Module | None = None, sink_detector: SinkDetector | None = None,
                  progress: Progress | None = None, label: str = "calibration") -> dict[Gap, BoundaryStats]:
    """Float64 statistics of every gap over ``windows``, in one pass over ``model``.

    ``x_model`` (sequential mode) reads X and m from a different, already pruned-and-patched model
    holding every layer in ``gap.start - 1 .. gap.start`` under its original index; Y always comes
    from ``model``. ``sink_detector`` flags tokens whose statistics are also kept apart. ``progress``
    gets one step per batch under the stage ``label``.

    Example:
        >>> stats = collect_stats(model, calib_windows, [Gap(12, 19)])
        >>> stats[Gap(12, 19)].xtx.shape     # (576, 576), float64
    """
    cfg = config or CalibrationConfig()
    if lazy_of(model) is not None:  # read layer by layer from the checkpoint: the same sums, each layer read once
        return collect_stats_layerwise(lazy_of(model), windows, gaps, cfg, model=model, x_model=x_model,
                                       sink_detector=sink_detector, progress=progress, label=label)
    y_index = _index_map(model)
    use_mlp = cfg.replaceme
    accumulators: dict[Gap, BoundaryAccumulator] = {}
    x_source = x_model if x_model is not None else model
    index = _index_map(x_source)
    check_gaps(gaps, y_index, index, use_mlp)
    x_bounds = sorted({index[g.start] for g in gaps})
    mlp_layers = sorted({index[g.start - 1] for g in gaps if use_mlp and g.start > 0})
    y_bounds = sorted({y_index[g.end] for g in gaps})
    total = -(-windows.input_ids.size(0) // cfg.batch_size)
    step = for_stage(progress, label)
    step(0, total)
    sequential = x_model is not None
    with ExitStack() as stack:
        x_tap = stack.enter_context(tap(
            x_source, boundaries=x_bounds if sequential else x_bounds + y_bounds, mlp_layers=mlp_layers))
        y_tap = stack.enter_context(tap(model, boundaries=y_bounds)) if sequential else x_tap
        for done, (ids, mask) in enumerate(_batches(windows, cfg.batch_size), start=1):
            got_x = x_tap.run(ids, mask)
            got_y = y_tap.run(ids, mask) if sequential else got_x
            for gap in gaps:
                x = got_x.resid[index[gap.start]]  # (B, T, d)
                y = got_y.resid[y_index[gap.end]]  # (B, T, d)
                m = got_x.mlp.get(index[gap.start - 1]) if use_mlp and gap.start > 0 else None
                accumulate(accumulators, gap, (x, y, m), mask, (done - 1) * cfg.batch_size, cfg, sink_detector)
            step(done, total)
    return {gap: acc.finalize() for gap, acc in accumulators.items()}


def collect_stats_layerwise(lazy: LazyModel, windows, gaps: list[Gap], config: CalibrationConfig | None = None,
                            *, model: nn.Module | None = None, x_model: nn.Module | None = None,
                            sink_detector: SinkDetector | None = None, progress: Progress | None = None,
                            label: str = "calibration (layer-wise)", budget: int | None = None
                            ) -> dict[Gap, BoundaryStats]:
    """What ``collect_stats(model, windows, gaps, config, x_model=...)`` returns, for views of ``lazy.model``
    (``model`` defaults to ``lazy.model`` itself); each pass stops after the deepest gap's end. When the
    streams of every window exceed ``budget`` bytes (default: ``memory_plan.stream_budget``), the windows go
    through in groups, each reading the layers again; the sums are the same, batch for batch."""
    cfg = config or CalibrationConfig()
    y_model = model if model is not None else lazy.model
    x_source = x_model if x_model is not None else y_model
    check_gaps(gaps, _index_map(y_model), _index_map(x_source), cfg.replaceme)
    batches = list(_batches(windows, cfg.batch_size))
    ids = windows.input_ids
    per_batch = memory_plan.batch_stream_bytes(min(cfg.batch_size, ids.size(0)), ids.size(1),
                                               hidden_size(lazy.model), lazy.dtype, 2 + 2 * len(gaps))
    accumulators: dict[Gap, BoundaryAccumulator] = {}
    runner = LayerPass(lazy)
    for group in memory_plan.groups(len(batches), per_batch, budget or memory_plan.stream_budget(lazy.device)):
        _layerwise_group(runner, {"x": x_source, "y": y_model}, [(i, batches[i]) for i in group], gaps, cfg,
                         accumulators, sink_detector, progress, label)
    return {gap: accumulators[gap].finalize() for gap in gaps}


def _layerwise_group(runner: LayerPass, variants: dict[str, nn.Module], batches: list, gaps: list[Gap],
                     cfg: CalibrationConfig, accumulators: dict, sink_detector, progress, label: str) -> None:
    """One pass over the layers for ``batches`` ((global index, (ids, mask)) pairs), into ``accumulators``."""
    x_at: dict[int, dict[int, torch.Tensor]] = {g.start: {} for g in gaps}  # start -> batch -> X (B, T, d)
    m_at: dict[int, dict[int, torch.Tensor]] = {g.start - 1: {} for g in gaps if cfg.replaceme and g.start > 0}
    ends = sorted({g.end for g in gaps})

    def on_boundary(name: str, b: int, batch: int, hidden) -> None:
        if name == "x" and b in x_at:
            x_at[b][batch] = hidden
        if name == "y":
            index, (_, mask) = batches[batch]
            for gap in (g for g in gaps if g.end == b):
                m = m_at[gap.start - 1][batch] if gap.start - 1 in m_at else None
                accumulate(accumulators, gap, (x_at[gap.start][batch], hidden, m), mask, index * cfg.batch_size,
                           cfg, sink_detector)
            if batch == len(batches) - 1:  # the last batch of this end: X no open gap needs is let go
                for start in [s for s in x_at if all(g.end <= b for g in gaps if g.start == s)]:
                    x_at.pop(start)

    def on_mlp(name: str, layer: int, batch: int, hidden) -> None:
        m_at[layer][batch] = hidden

    runner.run([pair for _, pair in batches], variants, until=ends[-1], boundaries={"x": set(x_at), "y": set(ends)},
               on_boundary=on_boundary, mlp={"x": set(m_at)}, on_mlp=on_mlp, progress=progress, label=label)


def accumulate(accumulators: dict[Gap, BoundaryAccumulator], gap: Gap, streams, mask: torch.Tensor,
               first_window: int, cfg: CalibrationConfig, sink_detector: SinkDetector | None = None) -> None:
    """Add one batch's ``streams`` (X, Y, m: (B, T, d), m may be None) of ``gap`` to its accumulator,
    once they are finite on every valid token (the accumulator is made on the first batch, on X's device)."""
    x, y, m = streams
    if gap not in accumulators:
        accumulators[gap] = BoundaryAccumulator(
            gap.start, gap.end, x.size(-1), device=x.device, with_mlp=m is not None,
            lp=cfg.linearpatch, reservoir_tokens=cfg.reservoir_tokens, seed=cfg.seed)
    valid = mask.to(x.device).bool()  # (B, T)
    require_finite_activations(gap, first_window, valid, x, y, m)
    sink = sink_detector(x, valid) if sink_detector else None
    accumulators[gap].update(x, y.to(x.device), valid, m=m, sink=sink)


def check_gaps(gaps: list[Gap], y_index: dict[int, int], x_index: dict[int, int], use_mlp: bool) -> None:
    """A ValueError, before any pass, for a gap the models' layers (``_index_map``) cannot serve."""
    for gap in gaps:
        if gap.end not in y_index or gap.start >= gap.end:
            raise ValueError(f"Gap {gap} does not fit this model's layers {sorted(y_index)[:-1]}.")
    missing = [g for g in gaps if g.start not in x_index or (use_mlp and g.start > 0 and g.start - 1 not in x_index)]
    if missing:
        raise ValueError(f"Gaps {missing} need layers this model no longer has.")


def require_finite_activations(gap: Gap, first_window: int, valid: torch.Tensor, *streams) -> None:
    """Stop with ``NonFiniteError`` naming the gap and the windows when a valid token is NaN or inf.

    Checked per batch, before anything is accumulated, so a broken model fails on its first batch
    rather than after a whole calibration pass. Padding positions are not checked (never used).
    """
    bad = torch.zeros_like(valid)  # (B, T) bool
    for stream in streams:
        if stream is not None:
            bad |= ~torch.isfinite(stream).all(dim=-1).to(valid.device)  # (B, T)
    bad &= valid
    if bool(bad.any()):
        rows = sorted({first_window + int(r) for r in bad.nonzero()[:, 0]})
        dtype = str(next(s for s in streams if s is not None).dtype).replace("torch.", "")
        raise NonFiniteError(f"Non-finite activations at gap {gap} ({int(bad.sum())} tokens of calibration "
                             f"windows {rows}): the statistics and every operator would be NaN. Likely cause: "
                             f"{nonfinite_cause(dtype)}.")


def _index_map(model: nn.Module) -> dict[int, int]:
    """Original layer index -> position in ``model`` (identity for an unpruned model), plus the end."""
    kept = list(getattr(model, "ghosted_layers", range(num_layers(model))))
    mapping = {orig: pos for pos, orig in enumerate(kept)}
    mapping[max(kept) + 1] = len(kept)  # the stream after the last kept layer
    return mapping


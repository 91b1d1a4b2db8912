"""Build a recovered model: the pruned view plus each gap's operators at the right sites."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ghosted.models.architecture import get_path, num_layers, spec_for
from ghosted.calibration.collect import Gap
from ghosted.operators.modules import LowRankOperator, RobustLowRankOperator
from ghosted.operators.sites import (BranchOperator, PatchSite, RobustStreamOperator, StreamOperator,
                                     attach_branch_operator, attach_stream_operators, fold_branch_operator,
                                     site_for_gap)
from ghosted.models.pruning import build_variant
from ghosted.calibration.sinks import SinkContext, SinkMap, SinkRule


@dataclass
class GapFit:
    """What one gap gets: a stream operator W and/or a branch map T, and maybe a sink map."""

    stream: torch.Tensor | None = None  # (d, d) W applied to the residual stream
    branch: torch.Tensor | None = None  # (d, d) T applied to the MLP branch of the layer before
    sink_map: SinkMap | None = None  # robust fits: what sink tokens become at this boundary
    factors: tuple[torch.Tensor, torch.Tensor] | None = None  # low-rank fits: (U (d, R), V (R, d)) with
    # W = I + U·V applied as h + (h·U)·V; ``stream`` then holds the dense W for diagnostics only
    module: nn.Module | None = None  # a trained stream block (h -> h'), placed at the site as it is


def assemble(model: nn.Module, dropped: list[int], fits: dict[Gap, GapFit], method: str,
             fold: bool = True, rule: SinkRule | None = None) -> nn.Module:
    """A new model without ``dropped`` layers, carrying the operators in ``fits``; ``model`` untouched."""
    keep = [i for i in range(num_layers(model)) if i not in set(dropped)]
    sites = {gap: site_for_gap(keep, gap.start) for gap in fits}
    new = build_variant(model, keep, clone=[keep[s.index] for s in sites.values()])
    context = None
    if any(f.sink_map is not None for f in fits.values()):
        context = SinkContext(rule or SinkRule())
        get_path(new, spec_for(new).stack).register_forward_pre_hook(context.hook, with_kwargs=True)
    grouped: dict[tuple[int, bool], list[nn.Module]] = {}
    for gap in sorted(fits, key=lambda g: g.start):
        fit, site = fits[gap], sites[gap]
        if fit.branch is not None:
            if site.before:
                raise ValueError(f"Gap {gap} starts at layer 0: there is no MLP branch before it.")
            if fold and spec_for(model).mlp_out_linear is not None:
                fold_branch_operator(new, site.index, fit.branch)
            else:
                attach_branch_operator(new, site.index, BranchOperator(fit.branch, (gap.start, gap.end), method))
        op = _stream_operator(fit, gap, method, context)
        if op is not None:
            grouped.setdefault((site.index, site.before), []).append(op)
    for (index, before), ops in grouped.items():
        attach_stream_operators(new, PatchSite(index, before), ops)
    return new


def _stream_operator(fit: GapFit, gap: Gap, method: str, context) -> nn.Module | None:
    if fit.module is not None:
        return fit.module
    if fit.factors is not None:
        if fit.sink_map is None:
            return LowRankOperator(*fit.factors, (gap.start, gap.end), method)
        return RobustLowRankOperator(*fit.factors, fit.sink_map, context, (gap.start, gap.end), method)
    weight = fit.stream
    if weight is None and fit.sink_map is None:
        return None
    if weight is None:  # a branch fit with sink handling: identity on ordinary tokens
        dim = fit.sink_map.constant.shape[0]
        weight = torch.eye(dim, dtype=torch.float64)
    if fit.sink_map is None:
        return StreamOperator(weight, (gap.start, gap.end), method)
    return RobustStreamOperator(weight, fit.sink_map, context, (gap.start, gap.end), method)


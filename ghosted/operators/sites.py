"""Recovery operators as modules attached at pruning boundaries of a (private) pruned model.

Two kinds of operator exist:
  * ``StreamOperator``: h -> h·W on the whole residual stream (ghost, LinearPatch), applied right
    after the last kept layer before a gap, or before the first surviving layer when layer 0 is gone;
  * ``BranchOperator``: m -> m·T on the MLP-branch output of the last kept layer (ReplaceMe), either
    hooked or folded into that layer's output projection so the result is a plain checkpoint.

The operator is registered as a child module of the (cloned) layer it patches, so it moves with the
model between devices and shows up in its state dict, and the forward hook that applies it is part
of the new model object only: the original model never sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ghosted.models.architecture import get_path, hidden_of, layers_of, spec_for, with_hidden
from ghosted.models.capture import private_submodule


class StreamOperator(nn.Module):
    """h -> h·W, computed in float32 and returned in the stream's dtype (W is stored in float32)."""

    def __init__(self, weight: torch.Tensor, boundary: tuple[int, int] = (-1, -1), method: str = ""):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().float().clone(), requires_grad=False)  # (d, d)
        self.boundary = tuple(boundary)  # original (start, end) of the gap this operator bridges
        self.method = method

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.weight.device != hidden.device:  # device_map: follow the stream once, not per call
            self.weight.data = self.weight.data.to(hidden.device)
        return (hidden.float() @ self.weight).to(hidden.dtype)  # (B, T, d)

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, boundary={self.boundary}, method={self.method!r}"


class BranchOperator(StreamOperator):
    """m -> m·T on an MLP-branch output (ReplaceMe's map), same numerics as StreamOperator."""


class RobustStreamOperator(StreamOperator):
    """h -> h·W for ordinary tokens; sink tokens get their own map (a constant, or x·A + b).

    Which tokens are sinks comes from a shared ``SinkContext`` (position 0 of the prompt, set by a
    pre-hook on the layer stack, so decoding steps with the KV cache are never sinks) and, when the
    rule has a norm threshold, from ‖h‖ itself.
    """

    def __init__(self, weight: torch.Tensor, sink_map, context, boundary=(-1, -1), method: str = ""):
        super().__init__(weight, boundary, method)
        self.sink_constant = nn.Parameter(sink_map.constant.detach().float().clone(), requires_grad=False)  # (d,)
        linear = sink_map.linear
        self.sink_linear = None if linear is None else nn.Parameter(
            linear.detach().float().clone(), requires_grad=False)  # (d, d)
        self.context = context

    def sink_mask(self, hidden: torch.Tensor) -> torch.Tensor | None:
        mask = self.context.mask
        threshold = self.context.rule.norm_threshold
        if threshold is not None:
            by_norm = hidden.float().norm(dim=-1) > threshold  # (B, T)
            mask = by_norm if mask is None else mask.to(hidden.device) | by_norm
        return None if mask is None else mask.to(hidden.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.replace_sinks(hidden, super().forward(hidden))  # (B, T, d)

    def replace_sinks(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` with the sink tokens of ``hidden`` replaced by their own map."""
        mask = self.sink_mask(hidden)
        if mask is None or mask.shape != hidden.shape[:2] or not bool(mask.any()):
            return out
        constant = self.sink_constant.to(hidden.device)
        if self.sink_linear is None:
            sink_values = constant.expand_as(out)
        else:
            sink_values = hidden.float() @ self.sink_linear.to(hidden.device) + constant  # (B, T, d)
        return torch.where(mask[..., None], sink_values.to(out.dtype), out)

    def extra_repr(self) -> str:
        kind = "constant" if self.sink_linear is None else "affine"
        return f"{super().extra_repr()}, sinks={self.context.rule.describe()} -> {kind}"


@dataclass
class PatchSite:
    """Where operators go in the pruned model: after pruned layer ``index``, or before layer 0."""

    index: int  # index in the *pruned* model's layer list
    before: bool = False  # True only when the gap starts at layer 0 (no kept layer precedes it)


def site_for_gap(kept: list[int], start: int) -> PatchSite:
    """The patch site for a gap starting at original layer ``start`` in a model keeping ``kept``."""
    previous = [i for i, layer in enumerate(kept) if layer < start]
    if previous:
        return PatchSite(previous[-1])
    return PatchSite(0, before=True)


def _after_hook(ops: nn.ModuleList):
    def hook(module, args, output):
        hidden = hidden_of(output)
        for op in ops:
            hidden = op(hidden)
        return with_hidden(output, hidden)
    return hook


def _before_hook(ops: nn.ModuleList):
    def hook(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        for op in ops:
            hidden = op(hidden)
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}
    return hook


def attach_stream_operators(model: nn.Module, site: PatchSite, ops: list[StreamOperator]) -> None:
    """Apply ``ops`` in order at ``site`` of ``model``, whose patched layer must be private to it."""
    layer = layers_of(model)[site.index]
    chain = nn.ModuleList(ops)
    name = "ghosted_pre" if site.before else "ghosted_post"
    if name in layer._modules:
        raise ValueError(f"Layer {site.index} already carries recovery operators.")
    layer._modules[name] = chain
    if site.before:
        layer.register_forward_pre_hook(_before_hook(chain), with_kwargs=True)
    else:
        layer.register_forward_hook(_after_hook(chain))


def attach_branch_operator(model: nn.Module, layer_index: int, op: BranchOperator) -> None:
    """Hook ``op`` on the MLP-branch output of pruned layer ``layer_index`` (private to ``model``)."""
    layer = layers_of(model)[layer_index]
    branch = private_submodule(layer, spec_for(model).mlp_branch)
    branch._modules["ghosted_branch"] = op
    branch.register_forward_hook(lambda module, args, output: with_hidden(output, op(hidden_of(output))))


def fold_branch_operator(model: nn.Module, layer_index: int, transform: torch.Tensor) -> None:
    """Fold m -> m·T into the output projection of pruned layer ``layer_index`` (private to it).

    The new weight is computed in float64 and stored in the layer's dtype; the result is a plain
    checkpoint with no extra module. Raises ValueError for families whose MLP branch ends in a norm.
    """
    path = spec_for(model).mlp_out_linear
    if path is None:
        raise ValueError(f"{spec_for(model).family}: the MLP branch ends in a norm, so ReplaceMe's "
                         "map cannot be folded into a weight; use the hooked form.")
    layer = layers_of(model)[layer_index]
    linear = private_submodule(layer, path)
    if linear.weight.device.type == "meta":  # accelerate offload reloads the original at every call
        raise ValueError(f"Layer {layer_index} is offloaded (device_map), so ReplaceMe's map cannot be "
                         "folded into its weight; use the hooked form (fold=False, --no-fold).")
    t = transform.double().to(linear.weight.device)  # (d, d)
    weight = linear.weight.double()
    from transformers.pytorch_utils import Conv1D

    is_conv1d = isinstance(linear, Conv1D)  # GPT-2 stores (in, out) and computes x·W + b
    new_weight = weight @ t if is_conv1d else t.T @ weight  # Linear: (out, in), y = x·Wᵀ + b
    linear.weight = nn.Parameter(new_weight.to(linear.weight.dtype), requires_grad=False)
    if getattr(linear, "bias", None) is not None:
        linear.bias = nn.Parameter((linear.bias.double() @ t).to(linear.bias.dtype), requires_grad=False)


def operators_of(model: nn.Module) -> list[tuple[int, str, nn.Module]]:
    """Every recovery operator in ``model``: (pruned layer index, site name, operator)."""
    found = []
    for i, layer in enumerate(layers_of(model)):
        for name in ("ghosted_pre", "ghosted_post"):
            for op in layer._modules.get(name, []) or []:
                found.append((i, name, op))
        branch = get_path(layer, spec_for(model).mlp_branch)
        if "ghosted_branch" in branch._modules:
            found.append((i, "ghosted_branch", branch._modules["ghosted_branch"]))
    return found

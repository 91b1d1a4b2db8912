"""Prune&Comp (arXiv 2507.18212): magnitude compensation fused into the weights upstream of a cut.

Removing layers [s, e) hands layer e the stream entering s, whose magnitude differs from the stream
it was trained on. Prune&Comp measures that gap on calibration text as one scalar

    scale = mean over channels c of ( mean over sequences of  mean_t |h_e[t, c]| / mean_t |h_s[t, c]| ),

(h_b = residual stream entering layer b; its code averages per-sample channel ratios, then the
channels), and multiplies the stream at the cut by it. In a pre-norm transformer the stream entering
s is the sum of the embeddings and of every attention and MLP output before s, and each layer reads
it through a scale-invariant norm, so scaling the embeddings and the output projections of every
layer before the cut scales the stream there exactly (up to the norms' ε) and changes nothing else
upstream. The pruned model therefore carries no extra operator: it is a plain checkpoint.

Here the changed weights are NEW tensors on a new model object (the base model shares every other
weight and is never changed). When the output head shares the input embedding (tied weights, as
in SmolLM2), the head keeps sharing the scaled embedding and the final norm is scaled by 1/scale
instead, so the logits are unchanged and the checkpoint stays tied (no extra parameters).

Several gaps are compensated one after the other, from the first: each scale is measured on the
model already pruned and compensated upstream (the gap's own layers still present), as the
paper's loop always measures on the current model. The paper's prune-and-compensate loop as a
selection rule (remove one layer at a time by any base criterion, compensate, re-score the compensated
model) is ``ghosted.selection.iterative``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import torch
from torch import nn

from ghosted.models.architecture import embedding_of, head_of, layers_of, num_layers, spec_for, stack_of
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats, gaps_of
from ghosted.models.capture import private_submodule
from ghosted.core.progress import Progress
from ghosted.models.pruning import build_variant, original_indices
from ghosted.calibration.stats import BoundaryStats

# What writes into the residual stream, per family: embeddings (paths in the layer stack) and the
# output of each branch (paths in a decoder layer). Families whose branches end in a norm scale
# that norm instead (its output is what is added).
_LLAMA_WRITERS = (("embed_tokens",), ("self_attn.o_proj", "mlp.down_proj"))
_WRITERS = {
    "gemma2": (("embed_tokens",), ("post_attention_layernorm", "post_feedforward_layernorm")),
    "gemma3_text": (("embed_tokens",), ("post_attention_layernorm", "post_feedforward_layernorm")),
    "gpt2": (("wte", "wpe"), ("attn.c_proj", "mlp.c_proj")),
    "gpt_neox": (("embed_in",), ("attention.dense", "mlp.dense_4h_to_h")),
    "opt": (("embed_tokens", "embed_positions"), ("self_attn.out_proj", "fc2")),
}
_NOT_PRE_NORM = ("olmo2", "olmo3")  # attention and MLP read the raw stream: scaling it is not neutral


def magnitude_scale(stats: BoundaryStats) -> float:
    """Prune&Comp's scalar: the channel mean of the mean per-sequence ratio mean_t|Y| / mean_t|X|.

    The per-sequence channel ratios are LinearPatch's, already accumulated in ``stats``.
    """
    if stats.lp_ratio_sum is None or stats.n_samples == 0:
        raise ValueError("Prune&Comp needs the per-sequence channel ratios: gather statistics with "
                         "CalibrationConfig(linearpatch=True) on at least one window.")
    return float((stats.lp_ratio_sum / stats.n_samples).mean())


def writers_of(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(embedding paths in the stack, branch-output paths in a layer) for ``model``'s family."""
    family = spec_for(model).family
    if family in _NOT_PRE_NORM:
        raise ValueError(f"Prune&Comp needs a pre-norm model (every layer reads the stream through a "
                         f"norm); {family} applies attention and MLP to the raw stream, so its scale "
                         "cannot be fused upstream. Use ghost or linearpatch-diag for this model.")
    if family == "opt" and not getattr(model.config, "do_layer_norm_before", True):
        raise ValueError("Prune&Comp needs a pre-norm model; this OPT applies its norms after each "
                         "branch (do_layer_norm_before=False).")
    embeds, outputs = _WRITERS.get(family, _LLAMA_WRITERS)
    if family == "opt" and getattr(stack_of(model), "project_in", None) is not None:
        embeds = ("project_in", "embed_positions")  # token embeddings enter through this projection
    return embeds, outputs


def compensate(model: nn.Module, drop: list[int], scale: float) -> nn.Module:
    """A new model without positions ``drop`` of ``model``, the stream at the cut scaled by ``scale``.

    ``drop`` is one contiguous run of positions in ``model``'s layer list. Every weight that writes
    into the stream before the cut is replaced by a scaled NEW tensor; ``model`` is not changed.
    """
    embeds, outputs = writers_of(model)
    total = num_layers(model)
    keep = [i for i in range(total) if i not in set(drop)]
    upstream = [i for i in keep if i < min(drop)]
    new = build_variant(model, keep, clone=upstream)
    stack = stack_of(new)
    tied = head_of(new).weight is embedding_of(new).weight and spec_for(new).embed in embeds
    for path in embeds:
        if getattr(stack, path.split(".")[0], None) is not None:
            _scale_module(private_submodule(stack, path), scale)
    if tied:  # the head reads the scaled embedding: undo the scale in the final norm before it
        private_submodule(new, spec_for(new).head).weight = embedding_of(new).weight
        _scale_module(private_submodule(stack, spec_for(new).final_norm), 1.0 / scale)
    layers = layers_of(new)
    for position in range(len(upstream)):
        for path in outputs:
            _scale_module(private_submodule(layers[position], path), scale)
    return new


@cache
def _one_plus_weight_norms() -> tuple[type, ...]:
    """The RMSNorm classes of the supported families that multiply by (1 + weight): Gemma's."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    return GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm


def _scale_module(module: nn.Module, scale: float) -> None:
    """Multiply a private module's output by ``scale`` through new weight (and bias) tensors."""
    gemma_norm = isinstance(module, _one_plus_weight_norms())  # weight w scales by 1 + w: s(1 + w) - 1
    for name in ("weight", "bias"):
        old = getattr(module, name, None)
        if not isinstance(old, torch.Tensor):
            continue
        value = old.double()
        value = scale * (1.0 + value) - 1.0 if gemma_norm and name == "weight" else scale * value
        setattr(module, name, nn.Parameter(value.to(old.dtype), requires_grad=False))


def prunecomp(model: nn.Module, dropped: list[int], windows, config: CalibrationConfig | None = None,
              first_stats: dict[Gap, BoundaryStats] | None = None, progress: Progress | None = None
              ) -> tuple[nn.Module, dict[Gap, float], dict[Gap, BoundaryStats]]:
    """Remove ``dropped`` (original indices of ``model``) gap by gap, compensating each.

    Returns (the compensated model, the scale of each block gap, the statistics each was measured
    on). ``first_stats`` may hold the first gap's statistics on ``model`` itself (saves one pass).
    """
    cfg = replace(config or CalibrationConfig(), replaceme=False, reservoir_tokens=0, linearpatch=True)
    current, scales, measured = model, {}, {}
    for i, gap in enumerate(gaps_of(dropped, "block")):
        if i == 0 and first_stats is not None and gap in first_stats:
            stats = first_stats[gap]
        else:
            stats = collect_stats(current, windows, [gap], cfg, progress=progress,
                                  label=f"prunecomp: measuring the scale of gap {gap}")[gap]
        scales[gap], measured[gap] = magnitude_scale(stats), stats
        positions = [original_indices(current).index(layer) for layer in gap.layers]
        current = compensate(current, positions, scales[gap])
    return current, scales, measured

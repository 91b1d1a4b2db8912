"""The architecture adapter: the one place that knows where each model family keeps its parts.

Everything else in ghosted asks this module for "the decoder layers", "the final norm", "the MLP
branch of layer i" and so on, so that supporting a new family means adding one ``ArchSpec`` here.

Conventions used throughout the project:
  * Layers are 0-based. "Boundary b" is the residual stream *entering* layer b; boundary L (the
    number of layers) is the output of the last layer, *before* the final norm.
  * A decoder layer in transformers v5 returns a plain tensor; older or remote-code families return
    a tuple whose first entry is the hidden state. ``hidden_of`` and ``with_hidden`` accept both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ArchSpec:
    """Where one model family keeps its parts, as attribute paths."""

    family: str
    stack: str  # path from the CausalLM to the module that owns the layer list
    layers: str  # attribute of the stack holding the nn.ModuleList of decoder layers
    final_norm: str  # attribute of the stack: the norm applied after the last layer
    embed: str  # attribute of the stack: the token embedding
    head: str = "lm_head"  # attribute of the CausalLM: the output projection
    mlp_branch: str = "mlp"  # module in a layer whose output is added to the residual stream
    mlp_out_linear: str | None = "mlp.down_proj"  # linear producing that output (None: not foldable)


_LLAMA_LIKE = dict(stack="model", layers="layers", final_norm="norm", embed="embed_tokens")
_POST_NORM = dict(_LLAMA_LIKE, mlp_branch="post_feedforward_layernorm", mlp_out_linear=None)

SPECS: dict[str, ArchSpec] = {
    **{t: ArchSpec(t, **_LLAMA_LIKE) for t in (
        "llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "cohere", "smollm3", "helium",
        "ministral", "glm")},
    "gemma": ArchSpec("gemma", **_LLAMA_LIKE),
    "gemma2": ArchSpec("gemma2", **_POST_NORM),
    "gemma3_text": ArchSpec("gemma3_text", **_POST_NORM),
    "olmo2": ArchSpec("olmo2", **_POST_NORM),
    "olmo3": ArchSpec("olmo3", **_POST_NORM),
    "gpt2": ArchSpec("gpt2", stack="transformer", layers="h", final_norm="ln_f", embed="wte",
                     mlp_out_linear="mlp.c_proj"),
    "gpt_neox": ArchSpec("gpt_neox", stack="gpt_neox", layers="layers", final_norm="final_layer_norm",
                         embed="embed_in", mlp_out_linear="mlp.dense_4h_to_h"),
    "opt": ArchSpec("opt", stack="model.decoder", layers="layers", final_norm="final_layer_norm",
                    embed="embed_tokens", mlp_branch="fc2", mlp_out_linear="fc2"),
}


class UnsupportedArchitecture(ValueError):
    """Raised for a model whose layer layout this adapter does not know."""


def get_path(root: nn.Module, path: str):
    """``get_path(model, "model.decoder")`` -> ``model.model.decoder`` ("" returns root)."""
    obj = root
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def spec_for(model: nn.Module) -> ArchSpec:
    """The ArchSpec of a causal LM, by ``config.model_type``, or by its layout when unknown."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in SPECS:
        return SPECS[model_type]
    generic = ArchSpec(str(model_type), **_LLAMA_LIKE)
    try:  # many newer families copy Llama's layout; accept them when it really matches
        stack = get_path(model, generic.stack)
        if isinstance(getattr(stack, "layers", None), nn.ModuleList) and hasattr(stack, "norm"):
            return generic
    except AttributeError:
        pass
    arch = getattr(config, "architectures", None) or [type(model).__name__]
    raise UnsupportedArchitecture(
        f"Unsupported architecture {arch[0]} (model_type={model_type!r}): ghosted does not know where "
        f"its decoder layers live. Supported families: {', '.join(sorted(SPECS))}, and any model with "
        "a Llama-style layout (model.layers, model.norm, lm_head)."
    )


def stack_of(model: nn.Module) -> nn.Module:
    """The module that owns the decoder layers (LlamaModel, GPT2Model, OPTDecoder, ...)."""
    return get_path(model, spec_for(model).stack)


def layers_of(model: nn.Module) -> nn.ModuleList:
    """The decoder layers, in order."""
    spec = spec_for(model)
    return getattr(get_path(model, spec.stack), spec.layers)


def num_layers(model: nn.Module) -> int:
    return len(layers_of(model))


def hidden_size(model: nn.Module) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


def embedding_of(model: nn.Module) -> nn.Module:
    spec = spec_for(model)
    return getattr(get_path(model, spec.stack), spec.embed)


def head_of(model: nn.Module) -> nn.Module:
    return getattr(model, spec_for(model).head)


def hidden_of(output) -> torch.Tensor:
    """The hidden state from a decoder layer's output (v5 tensor, or a v4-style tuple)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def with_hidden(output, hidden: torch.Tensor):
    """A decoder layer's output with its hidden state replaced, keeping the output's type."""
    if isinstance(output, torch.Tensor):
        return hidden
    return (hidden, *output[1:])


def layer_param_count(model: nn.Module, layer: int) -> int:
    return sum(p.numel() for p in layers_of(model)[layer].parameters())


def removed_share(model: nn.Module, layers) -> float:
    """Share of the model's parameters that dropping ``layers`` removes."""
    total = sum(p.numel() for p in model.parameters())
    return sum(layer_param_count(model, i) for i in layers) / max(total, 1)


def describe(model: nn.Module) -> dict:
    """Facts about a loaded model for display: family, layers, width, parameters, memory, device."""
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    n_bytes = sum(p.numel() * p.element_size() for p in params)
    devices = sorted({str(p.device) for p in params})
    config = model.config
    return {
        "architecture": (getattr(config, "architectures", None) or [type(model).__name__])[0],
        "model_type": getattr(config, "model_type", "?"),
        "family": spec_for(model).family,
        "layers": num_layers(model),
        "hidden_size": hidden_size(model),
        "parameters": n_params,
        "memory_mb": round(n_bytes / 2**20, 1),
        "dtype": str(params[0].dtype).replace("torch.", "") if params else "?",
        "device": ", ".join(devices),
    }


OPERATOR_SITES = ("ghosted_pre", "ghosted_post", "ghosted_branch")  # child names recovery operators hang under
# (ghosted/operators/sites.py attaches them): a lower layer can tell a recovered model without importing operators/


def has_operators(model: nn.Module) -> bool:
    """Whether recovery operators are attached anywhere in ``model`` (a non-empty child at an operator site)."""
    for module in model.modules():
        for name in OPERATOR_SITES:
            child = module._modules.get(name)
            if child is not None and not (isinstance(child, nn.ModuleList) and len(child) == 0):
                return True
    return False

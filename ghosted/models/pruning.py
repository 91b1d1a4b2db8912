"""Non-mutating layer pruning: build a new model object that shares the kept weights.

The input model may be shared (a Streamlit cache hands one model to every browser session), so
nothing reachable from it is ever changed. A pruned model is a *view*: a shallow clone of every
module on the path from the CausalLM to the layer list, a new ``ModuleList`` of kept layers, and a
deep-copied config. A kept layer whose index changes is shallow-cloned too, so that renumbering its
attention ``layer_idx`` (needed by the KV cache) never touches the original module.
"""

from __future__ import annotations

import copy
import numbers
from collections import OrderedDict
from collections.abc import Iterable

from torch import nn

from ghosted.models.architecture import layers_of, num_layers, spec_for

_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def shallow_clone(module: nn.Module) -> nn.Module:
    """A new module object sharing parameters, buffers and children with ``module``.

    Its own child/parameter/hook dicts can be changed without affecting the original. Hooks present
    on the original (recovery patches of an already pruned model) are copied; accelerate's
    device-placement hook (``device_map`` models) is re-attached to the clone so that it keeps moving
    tensors between devices.
    """
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    for name in _HOOK_DICTS:
        if hasattr(module, name):
            setattr(clone, name, OrderedDict(getattr(module, name)))
    hf_hook = module.__dict__.get("_hf_hook")
    if hf_hook is not None:  # accelerate replaced `forward` with a closure bound to the original
        from accelerate.hooks import add_hook_to_module

        for attr in ("forward", "_old_forward", "_hf_hook"):
            clone.__dict__.pop(attr, None)
        add_hook_to_module(clone, hf_hook)
    return clone


MAX_LAYERS = 1024  # no released decoder has this many layers (the largest about 130): the bound of a layer spec
# read before the model's own layer count is known, so that a typo never allocates a huge range


def parse_layers(spec: str | Iterable[int], n_layers: int | None = None) -> list[int]:
    """Parse ``"20-26"`` or ``"3,7,9-11"`` (0-based, ranges inclusive) into a sorted list.

    Raises ValueError with a message a user can act on for malformed text or out-of-range layers. Every
    range is checked against ``n_layers`` (``MAX_LAYERS`` when not known yet) before it is expanded, so
    ``"0-99999999999"`` is refused at once instead of filling memory.
    """
    bound = MAX_LAYERS if n_layers is None else n_layers
    if not isinstance(spec, str) and hasattr(spec, "__len__") and len(spec) > bound:
        raise ValueError(f"{len(spec)} layers to drop: more than {_limit(bound, n_layers)}.")
    if isinstance(spec, str):
        layers: set[int] = set()
        for part in filter(None, (p.strip() for p in spec.split(","))):
            lo, sep, hi = part.partition("-")
            try:
                start, end = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                raise ValueError(f"Cannot read layer spec {part!r}: use indices and inclusive ranges "
                                 "such as '20-26' or '3,7,9-11'.") from None
            if end < start:
                raise ValueError(f"Range {part!r} is backwards; write it as {end}-{start}.")
            if end >= bound and n_layers is not None:
                raise ValueError(f"Layers {part[:40]} do not exist: this model has layers 0..{n_layers - 1}.")
            if end >= bound:
                raise ValueError(f"Layer {end} in {part[:40]!r} is beyond {_limit(bound, n_layers)}; layers are "
                                 "numbered from 0, e.g. 20-26.")
            layers.update(range(start, end + 1))
    else:
        layers = {_layer_index(i) for i in ([spec] if _is_index(spec) else _items(spec))}
    out = sorted(layers)
    if n_layers is not None:
        bad = [i for i in out if not 0 <= i < n_layers]
        if bad:
            raise ValueError(f"Layers {bad} do not exist: this model has layers 0..{n_layers - 1}.")
        if out and len(out) >= n_layers:
            raise ValueError(f"Dropping layers {format_layers(out)} removes all {n_layers} layers of this "
                             "model: keep at least one.")
    return out


def _limit(bound: int, n_layers: int | None) -> str:
    return f"this model's {n_layers} layers" if n_layers is not None else f"any model's (at most {bound} layers)"


def _is_index(value) -> bool:
    """True for a whole number (numpy integers too), never for a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _items(spec) -> list:
    """The items of an iterable layer list, or a TypeError saying what a layer spec is."""
    try:
        return list(spec)
    except TypeError:
        raise TypeError(f"Layers to drop must be a string such as '20-26' or a list of layer indices, "
                        f"not {spec!r} ({type(spec).__name__}).") from None


def _layer_index(value) -> int:
    """One layer index of a list: a whole number, never a float or a bool (True would mean layer 1)."""
    if not _is_index(value):
        raise TypeError(f"Layer indices must be whole numbers, not {value!r} ({type(value).__name__}).")
    return int(value)


def format_layers(layers: Iterable[int]) -> str:
    """Inverse of ``parse_layers``: ``[3, 7, 9, 10, 11]`` -> ``"3,7,9-11"``."""
    items = sorted(set(layers))
    parts, i = [], 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def _renumbered(layer: nn.Module, new_idx: int) -> nn.Module:
    """``layer`` with every ``layer_idx`` inside it equal to ``new_idx``, cloning only what changes."""
    if all(getattr(m, "layer_idx", new_idx) == new_idx for m in layer.modules()):
        return layer
    clone = shallow_clone(layer)
    if isinstance(getattr(layer, "layer_idx", None), int):
        clone.layer_idx = new_idx
    for name, child in layer._modules.items():
        if child is not None:
            clone._modules[name] = _renumbered(child, new_idx)
    return clone


def _sliced_config(config, keep: list[int]):
    """A deep copy of ``config`` describing only the kept layers (count and layer types)."""
    new = copy.deepcopy(config)
    text = new.get_text_config() if hasattr(new, "get_text_config") else new
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        text.layer_types = [layer_types[i] for i in keep]
    text.num_hidden_layers = len(keep)
    return new


def build_variant(model: nn.Module, keep: list[int], clone: Iterable[int] = ()) -> nn.Module:
    """A new model running only original layers ``keep`` (in order); ``model`` is left untouched.

    ``clone`` lists original layer indices that must be private to the new model even when their
    index does not change (so hooks or patches can be attached to them safely).
    """
    spec = spec_for(model)
    total = num_layers(model)
    if not keep:
        raise ValueError("Cannot remove every layer: keep at least one.")
    if any(not 0 <= i < total for i in keep):
        raise ValueError(f"Layer indices must be in 0..{total - 1}, got {keep}.")
    old_config = model.config
    new_config = _sliced_config(old_config, keep)
    new_model = shallow_clone(model)
    parents = [new_model]
    for part in filter(None, spec.stack.split(".")):  # clone the path down to the layer list
        child = shallow_clone(parents[-1]._modules[part])
        parents[-1]._modules[part] = child
        parents.append(child)
    for module in parents:
        if getattr(module, "config", None) is old_config:
            module.config = new_config
    original = layers_of(model)
    private = set(clone)
    kept = []
    for new_idx, old_idx in enumerate(keep):
        layer = _renumbered(original[old_idx], new_idx)
        if old_idx in private and layer is original[old_idx]:
            layer = shallow_clone(layer)
        kept.append(layer)
    parents[-1]._modules[spec.layers] = nn.ModuleList(kept)
    base_indices = original_indices(model)
    new_model.ghosted_layers = [base_indices[i] for i in keep]  # original index of each kept layer
    return new_model


def prune(model: nn.Module, drop: str | Iterable[int]) -> nn.Module:
    """A new model without layers ``drop`` that shares every kept weight with ``model``.

    Example:
        >>> pruned = prune(model, "20-26")      # or prune(model, [20, 21, 22])
        >>> pruned.config.num_hidden_layers    # 30 - 7 = 23 for SmolLM2
    """
    total = num_layers(model)
    dropped = parse_layers(drop, total)
    keep = [i for i in range(total) if i not in set(dropped)]
    return build_variant(model, keep)


def original_indices(model: nn.Module) -> list[int]:
    """Original layer index of each layer of ``model`` (identity for an unpruned model)."""
    return list(getattr(model, "ghosted_layers", range(num_layers(model))))


def dropped_layers(model: nn.Module, base_layers: int) -> list[int]:
    kept = set(original_indices(model))
    return [i for i in range(base_layers) if i not in kept]


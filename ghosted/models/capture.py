"""Read the residual stream at layer boundaries during a forward pass, then stop early.

Hooks are attached to a private view of the model (``build_variant`` clones the hooked layers), so
a model shared with other users is never touched, and they are removed when the context exits.
The forward pass is cut right after the deepest boundary that is needed: nothing past it runs.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ghosted.models.architecture import hidden_of, layers_of, num_layers, spec_for
from ghosted.models.pruning import build_variant, shallow_clone


class StopForward(Exception):
    """Raised inside a hook to end a forward pass once everything needed is captured."""


@dataclass
class Captured:
    """Tensors captured in one forward pass (each (B, T, d), on the device where it was computed)."""

    resid: dict[int, torch.Tensor] = field(default_factory=dict)  # boundary -> stream entering it
    mlp: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> its MLP-branch output


class Tap:
    """A model view with capture hooks; ``run`` returns what one forward pass produced."""

    def __init__(self, view: nn.Module, boundaries: list[int], mlp_layers: list[int], stop: bool):
        self.view = view
        self.boundaries = sorted(set(boundaries))
        self.mlp_layers = sorted(set(mlp_layers))
        self.stop = stop
        self._current = Captured()
        self._handles = []

    def _attach(self) -> None:
        layers = layers_of(self.view)
        n = len(layers)
        deepest = max(self.boundaries, default=-1)
        for b in self.boundaries:
            if b < n:
                self._handles.append(layers[b].register_forward_pre_hook(
                    self._pre_hook(b, stop=self.stop and b == deepest), with_kwargs=True))
            else:
                self._handles.append(layers[n - 1].register_forward_hook(
                    self._post_hook(n, stop=self.stop)))
        branch = spec_for(self.view).mlp_branch
        for j in self.mlp_layers:
            module = private_submodule(layers[j], branch)
            self._handles.append(module.register_forward_hook(self._mlp_hook(j)))

    def _pre_hook(self, b: int, stop: bool):
        def hook(module, args, kwargs):
            self._current.resid[b] = args[0] if args else kwargs["hidden_states"]
            if stop:
                raise StopForward
        return hook

    def _post_hook(self, b: int, stop: bool):
        def hook(module, args, output):
            self._current.resid[b] = hidden_of(output)
            if stop:
                raise StopForward
        return hook

    def _mlp_hook(self, j: int):
        def hook(module, args, output):
            hidden = hidden_of(output)
            if hidden.dim() == 2:  # OPT runs its MLP on flattened (B·T, d) tokens
                hidden = hidden.view(*self._batch_shape, hidden.size(-1))  # (B, T, d)
            self._current.mlp[j] = hidden
        return hook

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Captured:
        """One forward pass over (B, T) token ids; returns the captured tensors."""
        self._current = Captured()
        self._batch_shape = tuple(input_ids.shape)  # (B, T)
        device = input_device(self.view)
        try:
            self.view(input_ids=input_ids.to(device),
                      attention_mask=None if attention_mask is None else attention_mask.to(device),
                      use_cache=False)
        except StopForward:
            pass
        return self._current


@contextmanager
def tap(model: nn.Module, boundaries=(), mlp_layers=(), stop: bool = True):
    """Capture streams entering ``boundaries`` (0..L) and MLP-branch outputs of ``mlp_layers``.

    Example:
        >>> with tap(model, boundaries=[12, 19]) as t:
        ...     got = t.run(input_ids)        # got.resid[12], got.resid[19]: (B, T, d)
    """
    n = num_layers(model)
    bad = [b for b in boundaries if not 0 <= b <= n] + [j for j in mlp_layers if not 0 <= j < n]
    if bad:
        raise ValueError(f"Boundaries must be in 0..{n} and layers in 0..{n - 1}; got {bad}.")
    hooked = {b for b in boundaries if b < n} | ({n - 1} if n in boundaries else set()) | set(mlp_layers)
    view = build_variant(model, list(range(n)), clone=hooked)
    handle = Tap(view, list(boundaries), list(mlp_layers), stop)
    handle._attach()
    try:
        yield handle
    finally:
        handle.detach()


def private_submodule(owner: nn.Module, path: str) -> nn.Module:
    """The submodule at ``path`` of a private ``owner``, cloned along the way so it is private too."""
    module = owner
    for part in path.split("."):
        child = shallow_clone(module._modules[part])
        module._modules[part] = child
        module = child
    return module


def input_device(model: nn.Module) -> torch.device:
    """Device where token ids must go (the embedding's device, also under ``device_map``)."""
    from ghosted.models.architecture import embedding_of

    embedding = embedding_of(model)
    execution = getattr(getattr(embedding, "_hf_hook", None), "execution_device", None)
    if execution is not None:  # accelerate: an offloaded embedding's weight lives on "meta"
        return torch.device(execution)
    return embedding.weight.device

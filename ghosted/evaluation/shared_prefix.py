"""Shared-prefix perplexity: compare K variants of one model for the price of one prefix + K suffixes.

Variants built by ghosted (dense, pruned, each recovery method) keep the very same layer objects
before the first layer any of them changes: ``build_variant`` only clones a layer it renumbers or
patches. Those leading layers compute the same stream in every variant, so for each batch of
evaluation windows this module

  1. runs the shared prefix once, through ``capture.tap``, and stops at the split point k;
  2. runs each variant's *suffix view* (``build_variant`` keeping its layers k.. on a private
     clone): embeddings, positions and masks are computed from the input ids as usual, and a
     forward pre-hook (registered first, so the variant's own pre-hooks still run after it) swaps
     the input of the suffix's first layer for the cached stream.

The split point is found by object identity, never by assumption: layer i is shared when every
variant holds the same module object at position i (and the same embedding). A patched layer is a
clone, so a variant with an operator after layer k-1 (or folded into it, or a pre-hook on layer 0)
puts the split at or before that layer and its patch runs in the suffix as usual. Results equal
``evaluate.perplexity`` on each variant alone; without a shared layer it falls back to exactly that.

Example:
    >>> res = perplexities({"dense": model, **{m: r.model for m, r in run.results.items()}}, windows)
    >>> res["ghost"].ppl
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ghosted.models.architecture import embedding_of, layers_of, num_layers
from ghosted.models.capture import input_device, tap
from ghosted.core.progress import Progress, counted
from ghosted.evaluation.perplexity import (PerplexityResult, mean_nll, model_dtype_device, nll_from_logits, perplexity,
                                           require_scored_tokens)
from ghosted.models.pruning import build_variant, original_indices


def shared_prefix_length(models: list[nn.Module]) -> int:
    """How many leading layers every model holds as the very same module objects (0 if none)."""
    if len(models) < 2:
        return 0
    first = models[0]
    if any(embedding_of(m) is not embedding_of(first) for m in models[1:]):
        return 0
    stacks = [layers_of(m) for m in models]
    origins = [original_indices(m) for m in models]
    shortest = min(len(s) for s in stacks)
    k = 0
    while k < shortest - 1 and all(s[k] is stacks[0][k] and o[k] == origins[0][k]
                                   for s, o in zip(stacks[1:], origins[1:])):
        k += 1  # keep >= 1 layer in every suffix (``build_variant`` needs one)
    return k


class SuffixView:
    """Layers ``k..`` of a variant, whose first layer reads a cached stream instead of its input.

    The view is private (``build_variant`` with the first kept layer cloned), so the injection hook
    never reaches the variant or the model it shares weights with.
    """

    def __init__(self, model: nn.Module, k: int):
        self.view = build_variant(model, list(range(k, num_layers(model))), clone=[k])
        self._cached: torch.Tensor | None = None
        layers_of(self.view)[0].register_forward_pre_hook(self._inject, with_kwargs=True, prepend=True)

    def _inject(self, module, args, kwargs):
        if self._cached is None:
            raise RuntimeError("SuffixView run outside feeding(): no cached stream to inject.")
        incoming = args[0] if args else kwargs["hidden_states"]
        if incoming.shape != self._cached.shape:
            raise RuntimeError(f"Cached stream {tuple(self._cached.shape)} does not match the suffix "
                               f"input {tuple(incoming.shape)}.")
        cached = self._cached.to(device=incoming.device, dtype=incoming.dtype)  # (B, T, d)
        if args:
            return (cached, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": cached}

    @contextmanager
    def feeding(self, hidden: torch.Tensor):
        """Within the block, the suffix's first layer receives ``hidden`` (B, T, d)."""
        self._cached = hidden
        try:
            yield self.view
        finally:
            self._cached = None

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Logits (B, T, V) of the whole variant, given the stream entering its layer k."""
        device = input_device(self.view)
        with self.feeding(hidden) as view:
            return view(input_ids=input_ids.to(device), attention_mask=None if mask is None else mask.to(device),
                        use_cache=False).logits


@dataclass
class _Tally:
    """Running NLL sum, token count and seconds of one variant."""

    nll: float = 0.0
    tokens: int = 0
    seconds: float = 0.0


def perplexities(models: dict[str, nn.Module], windows, batch_size: int = 4, share: bool = True,
                 progress: Progress | None = None) -> dict[str, PerplexityResult]:
    """Perplexity of every model on ``windows``, sharing the leading layers they have in common.

    Equal to ``{name: evaluate.perplexity(model, windows)}``. Each result's ``seconds`` is the
    variant's suffix time plus an equal share of the prefix time. ``share=False`` skips sharing.
    """
    require_scored_tokens(windows, ", ".join(models))
    items = list(models.items())
    k = shared_prefix_length([m for _, m in items]) if share else 0
    if k == 0:
        return _separately(items, windows, batch_size, progress)
    ref = items[0][1]
    suffixes = {name: SuffixView(model, k) for name, model in items}
    tallies = {name: _Tally() for name, _ in items}
    ids, mask = windows.input_ids, getattr(windows, "attention_mask", None)
    starts = range(0, ids.size(0), batch_size)
    with tap(ref, boundaries=[k]) as prefix:
        for start in counted(starts, progress, f"perplexity x{len(items)} (shared {k} layers)"):
            batch_ids = ids[start:start + batch_size]  # (B, T)
            batch_mask = None if mask is None else mask[start:start + batch_size]
            t0 = time.perf_counter()
            hidden = prefix.run(batch_ids, batch_mask).resid[k]  # (B, T, d)
            share_s = (time.perf_counter() - t0) / len(items)
            for name, suffix in suffixes.items():
                t1 = time.perf_counter()
                logits = suffix.logits(hidden, batch_ids, batch_mask)  # (B, T, V)
                nll, count = nll_from_logits(logits, batch_ids.to(logits.device), batch_mask)
                tally = tallies[name]
                tally.nll, tally.tokens = tally.nll + nll, tally.tokens + count
                tally.seconds += time.perf_counter() - t1 + share_s
    return {name: _result(tallies[name], model, windows, name) for name, model in items}


def _separately(items, windows, batch_size, progress) -> dict[str, PerplexityResult]:
    """Plain ``perplexity`` per model (nothing to share); one progress stage per model."""
    return {name: perplexity(model, windows, batch_size=batch_size, progress=progress, label=name)
            for name, model in items}


def _result(tally: _Tally, model: nn.Module, windows, label: str) -> PerplexityResult:
    """The same PerplexityResult (and protocol) that ``evaluate.perplexity`` reports, with its checks."""
    dtype, device = model_dtype_device(model)
    mean = mean_nll(tally.nll, tally.tokens, windows, label, dtype)
    protocol = {**getattr(windows, "protocol", {}), "dtype": dtype, "device": device,
                "scored_tokens": tally.tokens}
    return PerplexityResult(ppl=math.exp(mean), nll=mean, scored_tokens=tally.tokens,
                            seconds=tally.seconds, protocol=protocol)

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

import time
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from ghosted.models.architecture import embedding_of, layers_of, num_layers
from ghosted.models.capture import input_device, tap
from ghosted.models.lazy import lazy_of
from ghosted.core.progress import Progress, counted
from ghosted.evaluation.layerwise import layerwise_perplexities
from ghosted.evaluation.perplexity import PerplexityResult, model_logits, require_scored_tokens, scored_result
from ghosted.evaluation.scores import Reference, WindowScores, score_logits, summarize
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


def perplexities(models: dict[str, nn.Module], windows, batch_size: int = 4, share: bool = True,
                 progress: Progress | None = None, reference: str | None = "dense",
                 baselines=("none", "ghost")) -> dict[str, PerplexityResult]:
    """Perplexity of every model on ``windows``, sharing the leading layers they have in common.

    The perplexities equal ``{name: evaluate.perplexity(model, windows)}``. Each result's ``summary``
    adds (``ghosted.evaluation.scores.summarize``) the perplexity's interval, the KL divergence from
    and top-1 agreement with the ``reference`` model's next-token distribution (when it is one of
    ``models``; its logits are in the same pass) and the paired perplexity difference from each of
    ``baselines`` that was scored. Each result's ``seconds`` is the variant's suffix time plus an
    equal share of the prefix time. ``share=False`` skips sharing.
    """
    lazy = {id(lazy_of(m)): lazy_of(m) for m in models.values()}
    if len(lazy) == 1 and None not in lazy.values():  # views of one model read layer by layer: chunked head
        return layerwise_perplexities(next(iter(lazy.values())), models, windows, batch_size, progress,
                                      reference if reference in models else None, baselines)
    require_scored_tokens(windows, ", ".join(models))
    items = list(models.items())
    k = shared_prefix_length([m for _, m in items]) if share else 0
    order = sorted(items, key=lambda item: item[0] != reference)  # the reference first in each batch
    parts = {name: [] for name, _ in items}
    seconds = dict.fromkeys(parts, 0.0)
    ids, mask = windows.input_ids, getattr(windows, "attention_mask", None)
    label = f"perplexity x{len(items)} (shared {k} layers)" if k else f"perplexity x{len(items)}"
    with _logit_sources(order, k) as sources:
        for start in counted(range(0, ids.size(0), batch_size), progress, label):
            batch_ids = ids[start:start + batch_size]  # (B, T)
            batch_mask = None if mask is None else mask[start:start + batch_size]
            t0 = time.perf_counter()
            hidden = sources.prefix(batch_ids, batch_mask)  # (B, T, d), or None without a shared prefix
            share_s = (time.perf_counter() - t0) / len(items)
            ref = None
            for name, logits_of in sources.variants.items():
                t1 = time.perf_counter()
                logits = logits_of(hidden, batch_ids, batch_mask)  # (B, T, V)
                batch, logprobs = score_logits(logits, batch_ids, batch_mask, ref)
                if name == reference:
                    ref = Reference.of(logprobs)
                    batch.kl, batch.agree = np.zeros_like(batch.nll), batch.tokens.astype(np.float64)
                parts[name].append(batch)
                seconds[name] += time.perf_counter() - t1 + share_s
    scores = {name: WindowScores.concat(parts[name]) for name, _ in items}
    summaries = summarize(scores, baselines)
    return {name: scored_result(scores[name], seconds[name], model, windows, name, summaries[name])
            for name, model in items}


class _Sources:
    """Where each variant's logits come from: the shared prefix's stream and each suffix, or the whole model."""

    def __init__(self, prefix, variants: dict):
        self.prefix = prefix  # (ids, mask) -> the stream (B, T, d) entering layer k, or None
        self.variants = variants  # name -> (hidden, ids, mask) -> logits (B, T, V)


@contextmanager
def _logit_sources(items: list[tuple[str, nn.Module]], k: int):
    """The prefix tap and suffix views when ``k`` layers are shared; else each model runs whole."""
    if k == 0:
        yield _Sources(lambda ids, mask: None,
                       {name: _whole(model) for name, model in items})
        return
    suffixes = {name: SuffixView(model, k) for name, model in items}
    with tap(items[0][1], boundaries=[k]) as prefix:
        yield _Sources(lambda ids, mask: prefix.run(ids, mask).resid[k],
                       {name: suffix.logits for name, suffix in suffixes.items()})


def _whole(model: nn.Module):
    return lambda hidden, ids, mask: model_logits(model, ids, mask)

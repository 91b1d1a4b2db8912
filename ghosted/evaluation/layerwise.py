"""Perplexity, KL and top-1 agreement of several variants of a lazy model, layer by layer, logits in chunks.

Every variant goes through one ``LayerPass`` (each decoder layer read once for all of them), then the
head runs on chunks of positions: per chunk, the reference's log-probabilities first, then each
variant's, so neither B·T × V logits nor the reference's B·T × V probabilities are ever held whole.
Chunks overlap by one position (the last logit of a chunk scores no target) and the per-window sums
add up over chunks, so the results equal ``shared_prefix.perplexities`` on the whole models.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from ghosted.core.progress import Progress
from ghosted.evaluation.perplexity import PerplexityResult, require_scored_tokens, scored_result
from ghosted.evaluation.scores import Reference, WindowScores, score_logits, summarize
from ghosted.models import memory_plan
from ghosted.models.architecture import hidden_size
from ghosted.models.lazy import LazyModel
from ghosted.models.layer_pass import LayerPass, Tail

LOGITS_BUDGET = 64 * 2**20  # bytes of float32 logits-sized tensors held at once while scoring a chunk
_COPIES = 4  # logits, log-probabilities, the reference's probabilities and a temporary, per position


def chunk_positions(batch: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Positions per chunk so that a few (B, t, V) float32 tensors stay within ``budget`` bytes (>= 1)."""
    return max(1, budget // (batch * vocab * 4 * _COPIES))


def layerwise_perplexities(lazy: LazyModel, models: dict[str, nn.Module], windows, batch_size: int = 4,
                           progress: Progress | None = None, reference: str | None = "dense",
                           baselines=("none", "ghost"), budget: int = LOGITS_BUDGET,
                           stream_budget: int | None = None) -> dict[str, PerplexityResult]:
    """What ``shared_prefix.perplexities(models, windows)`` returns, for views of ``lazy.model``, layer by layer.

    ``budget``: bytes of logits-sized tensors per chunk; ``stream_budget``: bytes of streams per group of windows
    (default ``memory_plan.stream_budget``; each group reads the layers again). Each result's ``seconds`` is an
    equal share of the pass (the variants run together).
    """
    require_scored_tokens(windows, ", ".join(models))
    started = time.perf_counter()
    order = dict(sorted(models.items(), key=lambda item: item[0] != reference))
    ids, mask = windows.input_ids, getattr(windows, "attention_mask", None)
    batches = [(ids[s:s + batch_size], None if mask is None else mask[s:s + batch_size])
               for s in range(0, ids.size(0), batch_size)]
    runner = LayerPass(lazy)
    per_batch = memory_plan.batch_stream_bytes(min(batch_size, ids.size(0)), ids.size(1), hidden_size(lazy.model),
                                               lazy.dtype, len(order))
    parts: dict[str, list[WindowScores]] = {name: [] for name in order}
    label = f"layer-wise perplexity x{len(order)}"
    for group in memory_plan.groups(len(batches), per_batch, stream_budget or memory_plan.stream_budget(lazy.device)):
        _score_group(runner, [batches[i] for i in group], order, reference, budget, parts, progress, label)
    seconds = (time.perf_counter() - started) / len(order)
    scores = {name: WindowScores.concat(parts[name]) for name in order}
    summaries = summarize(scores, baselines)
    return {name: scored_result(scores[name], seconds, models[name], windows, name, summaries[name],
                                device=str(lazy.device)) for name in models}


def _score_group(runner: LayerPass, batches: list, order: dict[str, nn.Module], reference: str | None, budget: int,
                 parts: dict[str, list[WindowScores]], progress, label: str) -> None:
    """One pass over the layers for ``batches``, then the head chunk by chunk; each batch's scores into ``parts``."""
    finals = runner.run(batches, order, progress=progress, label=label)
    with runner.tail() as tail:
        for b, (batch_ids, batch_mask) in enumerate(batches):
            normed: dict[int, torch.Tensor] = {}
            for name in order:
                final = finals[name][b]  # (B, T, d); one tensor for variants whose streams are equal
                if id(final) not in normed:
                    normed[id(final)] = tail.normed(final, batch_ids, batch_mask)  # (B, T, d)
            streams = {name: normed[id(finals[name][b])] for name in order}
            for name, scores in chunked_scores(tail, streams, batch_ids, batch_mask, reference, budget).items():
                parts[name].append(scores)


def chunked_scores(tail: Tail, normed: dict[str, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor | None,
                   reference: str | None, budget: int = LOGITS_BUDGET) -> dict[str, WindowScores]:
    """Per-window scores of each variant's normed final stream (B, T, d), the head applied chunk by chunk."""
    batch, length = ids.shape
    vocab = tail.runner.head.out_features if hasattr(tail.runner.head, "out_features") else None
    step = chunk_positions(batch, vocab or 2**17, budget)
    totals: dict[str, WindowScores] = {}
    for start in range(0, max(length - 1, 1), step):
        cut = slice(start, min(start + step, length - 1) + 1)  # positions start..end: targets start+1..end
        chunk_ids, chunk_mask = ids[:, cut], None if mask is None else mask[:, cut]
        ref = None
        for name, hidden in normed.items():
            logits = tail.logits(hidden[:, cut])  # (B, t, V)
            scores, logprobs = score_logits(logits, chunk_ids, chunk_mask, ref)
            if name == reference:
                ref = Reference.of(logprobs)
                scores.kl, scores.agree = np.zeros_like(scores.nll), scores.tokens.astype(np.float64)
            del logits, logprobs
            totals[name] = scores if name not in totals else _added(totals[name], scores)
    return totals


def _added(a: WindowScores, b: WindowScores) -> WindowScores:
    """Sums per window of two disjoint sets of targets."""
    def plus(x, y):
        return None if x is None or y is None else x + y
    return WindowScores(a.nll + b.nll, a.tokens + b.tokens, plus(a.kl, b.kl), plus(a.agree, b.agree))

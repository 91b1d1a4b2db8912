"""Token-level perplexity over non-overlapping windows, always reported with its protocol."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ghosted.models.capture import input_device
from ghosted.core.progress import Progress, counted
from ghosted.core.guards import NonFiniteError, nonfinite_cause
from ghosted.evaluation.scores import WindowScores, score_logits, summarize


@dataclass
class PerplexityResult:
    """Perplexity and the protocol that produced it (so the number can be compared and reproduced)."""

    ppl: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    scored_tokens: int
    seconds: float
    protocol: dict = field(default_factory=dict)
    scores: WindowScores | None = None  # per-window sums: what the intervals resample
    summary: dict = field(default_factory=dict)  # ppl interval, KL/top-1 to the reference, paired differences

    def __str__(self) -> str:
        p = self.protocol
        return (f"PPL {self.ppl:.3f} on {p.get('source', '?')} ({self.scored_tokens} tokens scored, "
                f"{p.get('n_windows', '?')} windows of {p.get('seq_len', '?')}, BOS {p.get('bos', '?')}, "
                f"{p.get('dtype', '?')} on {p.get('device', '?')})")


def model_dtype_device(model: nn.Module) -> tuple[str, str]:
    param = next(model.parameters())
    return str(param.dtype).replace("torch.", ""), str(input_device(model))


@torch.no_grad()
def model_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Logits (B, T, V) of one forward pass over a (B, T) batch, on the model's input device."""
    device = input_device(model)
    mask = None if attention_mask is None else attention_mask.to(device)
    return model(input_ids=input_ids.to(device), attention_mask=mask, use_cache=False).logits


def window_nll(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
               ) -> tuple[float, int]:
    """Summed next-token NLL (float64) and the number of scored tokens for a (B, T) batch."""
    return nll_from_logits(model_logits(model, input_ids, attention_mask), input_ids, attention_mask)


def nll_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor | None
                    ) -> tuple[float, int]:
    """Summed NLL of tokens 1..T-1 given their prefixes; padding targets are not scored."""
    scores, _ = score_logits(logits, input_ids, mask)
    return scores.total_nll, scores.total_tokens


def perplexity(model: nn.Module, windows, batch_size: int = 4, progress: Progress | None = None,
               label: str = "perplexity") -> PerplexityResult:
    """Perplexity of ``model`` on ``windows`` (a ``TokenWindows``: (N, T) ids and a protocol dict).

    ``progress`` gets one step per batch under the stage ``label`` (also the name in error messages).

    Example:
        >>> res = perplexity(model, evaluation_windows(tok, "bundled:wiki", 4096, 512))
        >>> print(res)   # PPL 27.2 on ... (4088 tokens scored, 8 windows of 512, BOS none, ...)
    """
    started = time.perf_counter()
    require_scored_tokens(windows, label)
    ids, mask = windows.input_ids, getattr(windows, "attention_mask", None)
    parts = []
    for start in counted(range(0, ids.size(0), batch_size), progress, label):
        batch_ids = ids[start:start + batch_size]  # (B, T)
        batch_mask = None if mask is None else mask[start:start + batch_size]
        parts.append(score_logits(model_logits(model, batch_ids, batch_mask), batch_ids, batch_mask)[0])
    scores = WindowScores.concat(parts)
    return scored_result(scores, time.perf_counter() - started, model, windows, label,
                         summarize({label: scores})[label])


def scored_result(scores: WindowScores, seconds: float, model: nn.Module, windows, label: str,
                  summary: dict, device: str | None = None) -> PerplexityResult:
    """The PerplexityResult of ``scores`` with its protocol, after the checks of ``mean_nll`` (``device``:
    where it ran, when not the model's input device: a layer-wise model's weights sit on ``meta``)."""
    dtype, input_at = model_dtype_device(model)
    device = device or input_at
    mean = mean_nll(scores.total_nll, scores.total_tokens, windows, label, dtype)
    protocol = {**getattr(windows, "protocol", {}), "dtype": dtype, "device": device,
                "scored_tokens": scores.total_tokens}
    return PerplexityResult(ppl=math.exp(mean), nll=mean, scored_tokens=scores.total_tokens, seconds=seconds,
                            protocol=protocol, scores=scores, summary=summary)


def require_scored_tokens(windows, label: str = "perplexity") -> int:
    """How many targets ``windows`` score (mask positions 1..T-1); ValueError, before any work, when none."""
    ids, mask = windows.input_ids, getattr(windows, "attention_mask", None)
    count = ids.size(0) * max(ids.size(1) - 1, 0) if mask is None else int(mask[:, 1:].bool().sum())
    if count == 0:
        raise _nothing_scored(windows, label)
    return count


def _nothing_scored(windows, label: str) -> ValueError:
    ids = windows.input_ids
    return ValueError(f"No token would be scored in the {ids.size(0)} evaluation windows of {ids.size(1)} "
                      f"tokens ({label}): every target position is padding or masked out, so the perplexity "
                      "would read 1.0. Give windows of at least 2 tokens whose attention mask keeps some text "
                      "(more evaluation text, or a window no longer than the documents).")


def mean_nll(total_nll: float, scored_tokens: int, windows, label: str = "perplexity",
             dtype: str = "float32") -> float:
    """Mean NLL per scored token; a ValueError when no token was scored or the loss is not finite.

    Zero scored tokens (every target is padding, or windows of one token) would otherwise read as
    perplexity 1.0, and a NaN loss as a number: neither is a result.
    """
    if scored_tokens == 0:
        raise _nothing_scored(windows, label)
    mean = total_nll / scored_tokens
    if not math.isfinite(mean):
        raise NonFiniteError(f"The next-token loss of {label} is {mean} on {scored_tokens} tokens: non-finite "
                             f"logits. Likely cause: {nonfinite_cause(dtype)}.")
    return mean


@torch.no_grad()
def forward_latency(model: nn.Module, input_ids: torch.Tensor, repeats: int = 3) -> float:
    """Seconds of the fastest of ``repeats`` forward passes over ``input_ids`` (B, T), after a warm-up.

    A like-for-like speed figure for comparing variants of one model on the same batch; the
    fastest pass is the one least disturbed by other work on the machine (as ``timeit`` advises).
    """
    ids = input_ids.to(input_device(model))
    model(input_ids=ids, use_cache=False)  # warm-up: allocations, lazy initialisation
    times = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        times.append(time.perf_counter() - started)
    return min(times)

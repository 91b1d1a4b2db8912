"""Per-window scores of one variant: next-token NLL, and its fidelity to a reference (the dense model).

One log-softmax per variant and batch gives everything: the NLL of each target, the KL divergence
from the reference's next-token distribution, and whether the top-1 prediction agrees with the
reference's. The reference's probabilities are kept for the batch while the other variants run, so
fidelity costs no forward pass. Sums are kept per window (float64), so that the intervals
(``ghosted.evaluation.intervals``) can resample windows and pair variants on the same ones.

Example:
    >>> ref = Reference.of(dense_logits, mask)                # once per batch
    >>> batch = score_logits(logits, input_ids, mask, ref)     # per variant: WindowScores of B windows
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ghosted.evaluation.intervals import Interval, IntervalConfig, paired_difference, ratio_interval


@dataclass
class WindowScores:
    """Sums per evaluation window (each a (N,) array); ``kl``/``agree`` None without a reference."""

    nll: np.ndarray  # summed next-token NLL per window (nats, float64)
    tokens: np.ndarray  # scored targets per window
    kl: np.ndarray | None = None  # summed KL(reference || variant) per window (nats)
    agree: np.ndarray | None = None  # targets where the variant's top-1 token is the reference's

    @classmethod
    def concat(cls, parts: list[WindowScores]) -> WindowScores:
        """The windows of every batch, in order."""
        def join(field):
            values = [getattr(p, field) for p in parts]
            return None if any(v is None for v in values) else np.concatenate(values)
        return cls(join("nll"), join("tokens"), join("kl"), join("agree"))

    @property
    def total_nll(self) -> float:
        return float(self.nll.sum())

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())


@dataclass
class Reference:
    """What the other variants are compared with, for one batch: the reference's next-token probabilities."""

    probs: torch.Tensor  # (B, T-1, V) float32
    neg_entropy: torch.Tensor  # (B, T-1): sum_v p log p
    top1: torch.Tensor  # (B, T-1) the reference's most likely next token

    @classmethod
    def of(cls, logprobs: torch.Tensor) -> Reference:
        """From the reference's log-probabilities (B, T-1, V), as ``score_logits`` returns them."""
        probs = logprobs.exp()  # (B, T-1, V)
        neg_entropy = _rowdot(probs, logprobs)  # (B, T-1)
        return cls(probs, neg_entropy, logprobs.argmax(-1))


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_v a[..., v] * b[..., v] for (B, T, V) tensors, without a (B, T, V) temporary."""
    B, T, V = a.shape
    return torch.bmm(a.reshape(B * T, 1, V), b.reshape(B * T, V, 1)).view(B, T)  # (B, T)


def score_logits(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor | None,
                 reference: Reference | None = None) -> tuple[WindowScores, torch.Tensor]:
    """(this batch's WindowScores, the log-probabilities (B, T-1, V) of targets 1..T-1).

    Padding targets (mask 0) are not scored. The NLL equals ``F.cross_entropy`` on the same logits
    (the same log-softmax, then the target's entry).
    """
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    targets = input_ids[:, 1:].to(logits.device)  # (B, T-1)
    keep = (torch.ones_like(targets, dtype=torch.bool) if mask is None
            else mask[:, 1:].to(logits.device).bool())  # (B, T-1)
    nll = -logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    scores = WindowScores(_per_window(nll, keep), keep.sum(1).cpu().numpy().astype(np.int64))
    if reference is not None:
        kl = reference.neg_entropy - _rowdot(reference.probs, logprobs)  # (B, T-1)
        scores.kl = _per_window(kl.clamp_min(0.0), keep)  # float32 rounding may dip a hair below 0
        scores.agree = _per_window((logprobs.argmax(-1) == reference.top1).float(), keep)
    return scores, logprobs


def _per_window(values: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """Float64 sum of ``values`` (B, T-1) over each window's scored targets: (B,)."""
    return (values.double() * keep).sum(1).cpu().numpy()


def summarize(scores: dict[str, WindowScores], baselines=("none", "ghost"),
              config: IntervalConfig = IntervalConfig()) -> dict[str, dict]:
    """Flat report fields per variant: perplexity's interval, KL and top-1 agreement (with theirs), and
    the paired perplexity difference from each of ``baselines`` that was scored (not from itself).

    Fields: ``ppl_low``/``ppl_high``; ``kl``, ``kl_low``, ``kl_high``; ``top1``, ``top1_low``, ``top1_high``
    (a fraction); per baseline b: ``d_<b>`` (Δppl variant - b), ``d_<b>_low``, ``d_<b>_high``,
    ``d_<b>_significant`` (False: the interval holds zero; None: too few windows to tell).
    """
    out = {}
    for name, s in scores.items():
        fields = _bounds("ppl", ratio_interval(s.nll, s.tokens, config, transform=np.exp))
        if s.kl is not None:
            kl, top1 = ratio_interval(s.kl, s.tokens, config), ratio_interval(s.agree, s.tokens, config)
            fields.update(kl=kl.estimate, **_bounds("kl", kl), top1=top1.estimate, **_bounds("top1", top1))
        for base in baselines:
            if base in scores and base != name:
                diff = paired_difference(s.nll, scores[base].nll, s.tokens, config)
                fields.update({f"d_{base}": diff.estimate, **_bounds(f"d_{base}", diff),
                               f"d_{base}_significant": diff.significant})
        out[name] = fields
    return out


def _bounds(prefix: str, interval: Interval) -> dict:
    return {f"{prefix}_low": interval.low, f"{prefix}_high": interval.high}

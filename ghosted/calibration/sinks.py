"""Attention sinks: massive-activation tokens that can swamp a least-squares boundary fit.

On many LLMs the first token of every sequence carries a huge residual-stream norm (an
"attention sink"). When that token's norm is *created inside* a removed block, it holds nearly all
of ‖Δ‖², and the paper's least-squares operator spends itself on that one token, degrading every
other one. The robust fit treats sink tokens apart: W is fitted on the other tokens, and sink
tokens get their own map (the calibration mean of X_post at the sink by default, or an affine
fit). This module detects sinks (by position and/or by norm), reports them per boundary, and
tells a recovered model which tokens are sinks at inference time, KV cache included: the sink is
the first token of the prompt, seen during prefill, never the first token of a decoding step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from ghosted.calibration.stats import BoundaryStats
from ghosted.calibration.collect import gap_text


@dataclass
class SinkRule:
    """Which tokens count as sinks. The same rule is used at calibration and at inference."""

    position: bool = True  # the first token of each sequence (position 0) is a sink
    norm_factor: float | None = None  # also tokens with ‖x‖ > factor × median calibration norm
    norm_threshold: float | None = None  # absolute ‖x‖ threshold, fixed from calibration data

    def describe(self) -> str:
        parts = ["first token"] if self.position else []
        if self.norm_factor:
            parts.append(f"‖x‖ > {self.norm_factor:g} × median")
        return " or ".join(parts) or "none"


class SinkDetector:
    """Callable flagging sink tokens of a calibration batch, and recording what it saw.

    Used as ``collect_stats(..., sink_detector=SinkDetector(rule))``. For the norm rule the
    threshold is factor × the median token norm of the first batch, then frozen, so that
    calibration and inference flag exactly the same tokens.
    """

    def __init__(self, rule: SinkRule):
        self.rule = rule
        self.position_counts: dict[int, int] = {}  # position -> number of flagged tokens there
        self.flagged = 0
        self.tokens = 0

    def __call__(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros_like(valid)  # (B, T) bool
        if self.rule.position:
            mask |= first_valid(valid)
        if self.rule.norm_factor:
            norms = x.float().norm(dim=-1)  # (B, T)
            if self.rule.norm_threshold is None:
                self.rule.norm_threshold = float(self.rule.norm_factor * norms[valid].median())
            mask |= norms > self.rule.norm_threshold
        mask &= valid
        self._record(mask)
        return mask

    def _record(self, mask: torch.Tensor) -> None:
        self.flagged += int(mask.sum())
        self.tokens += mask.numel()
        for pos in mask.nonzero()[:, 1].tolist():
            self.position_counts[pos] = self.position_counts.get(pos, 0) + 1


def first_valid(valid: torch.Tensor) -> torch.Tensor:
    """(B, T) bool marking the first valid (non-padding) token of each row."""
    cumulative = valid.long().cumsum(dim=1)  # (B, T)
    return (cumulative == 1) & valid


def sink_report(stats: dict, detector: SinkDetector | None = None) -> pd.DataFrame:
    """Per gap: sink tokens, their positions, and their share of ‖Δ‖², of XᵀX and of the norm."""
    rows = []
    for gap, s in stats.items():
        if s.sink is None:
            continue
        sink = s.sink
        tr = lambda m: float(torch.trace(m))  # noqa: E731
        y_sq = lambda t: tr(t.xtx) + 2 * tr(t.xtd) + tr(t.dtd)  # noqa: E731  tr(YᵀY), Y = X + Δ
        others = max(s.n_tokens - sink.n_tokens, 1)
        rows.append({
            "gap": gap_text(s), "sink_tokens": sink.n_tokens, "tokens": s.n_tokens,
            "positions": _positions(detector),
            "delta_share": tr(sink.dtd) / max(tr(s.dtd), 1e-300),
            "xtx_share": tr(sink.xtx) / max(tr(s.xtx), 1e-300),
            "sink_rms_norm_x": (tr(sink.xtx) / max(sink.n_tokens, 1)) ** 0.5,
            "sink_rms_norm_y": (y_sq(sink) / max(sink.n_tokens, 1)) ** 0.5,
            "other_rms_norm_x": ((tr(s.xtx) - tr(sink.xtx)) / others) ** 0.5,
            "other_rms_norm_y": ((y_sq(s) - y_sq(sink)) / others) ** 0.5,
        })
    return pd.DataFrame(rows)


def _positions(detector: SinkDetector | None) -> str:
    if detector is None or not detector.position_counts:
        return ""
    top = sorted(detector.position_counts.items(), key=lambda kv: -kv[1])[:8]
    return ", ".join(f"{pos} (×{count})" for pos, count in top)


@dataclass
class SinkMap:
    """What a sink token becomes at a boundary: a constant, or x·A + b."""

    constant: torch.Tensor  # (d,) calibration mean of X_post over sink tokens
    linear: torch.Tensor | None = None  # (d, d) A of the affine map, None for constant substitution
    ridge: float = 0.0  # ridge used for the affine map

    @property
    def kind(self) -> str:
        return "constant" if self.linear is None else "affine"


def fit_sink_map(sink: BoundaryStats, kind: str = "constant", ridge: float = 1.0) -> SinkMap:
    """Constant substitution (mean X_post) or a ridge affine fit on the sink tokens alone.

    The affine fit centres X and Y and shrinks A toward 0 (i.e. toward the constant) with
    ``ridge`` relative to the mean eigenvalue of the centred XᵀX, because there are usually far
    fewer sink tokens than dimensions.
    """
    n = max(sink.n_tokens, 1)
    mean_x, mean_y = sink.x_sum / n, sink.y_sum / n  # (d,)
    if kind == "constant":
        return SinkMap(constant=mean_y)
    if kind != "affine":
        raise ValueError(f"Unknown sink map {kind!r}; use 'constant' or 'affine'.")
    xtx_c = sink.xtx - n * torch.outer(mean_x, mean_x)  # (d, d) centred XᵀX
    xty_c = sink.xtx + sink.xtd - n * torch.outer(mean_x, mean_y)  # (d, d) centred XᵀY
    lam = ridge * float(torch.trace(xtx_c)) / sink.dim + 1e-12
    eye = torch.eye(sink.dim, dtype=xtx_c.dtype, device=xtx_c.device)
    linear = torch.linalg.solve(xtx_c + lam * eye, xty_c)  # (d, d)
    return SinkMap(constant=mean_y - mean_x @ linear, linear=linear, ridge=ridge)


def sink_map_error(sink: BoundaryStats, smap: SinkMap) -> float:
    """‖f(X) − Y‖² over sink tokens, from statistics only (for choosing the affine ridge)."""
    n = sink.n_tokens
    tr = torch.trace
    yty = tr(sink.xtx) + 2 * tr(sink.xtd) + tr(sink.dtd)
    c = smap.constant
    if smap.linear is None:  # Σ‖c − y‖² = n‖c‖² − 2 c·Σy + Σ‖y‖²
        return float(n * c @ c - 2 * c @ sink.y_sum + yty)
    a = smap.linear
    xty = sink.xtx + sink.xtd
    err = (tr(a.T @ sink.xtx @ a) + 2 * (sink.x_sum @ a) @ c + n * c @ c
           - 2 * tr(a.T @ xty) - 2 * c @ sink.y_sum + yty)
    return float(err)


@dataclass
class SinkContext:
    """Which tokens of the current forward pass are sinks; set by a pre-hook on the layer stack."""

    rule: SinkRule = field(default_factory=SinkRule)
    mask: torch.Tensor | None = None  # (B, T) bool for the current call, None if unknown

    def hook(self, module: nn.Module, args, kwargs):
        """Forward pre-hook (with kwargs) on the decoder stack: compute the position-sink mask."""
        self.mask = position_sinks(args, kwargs) if self.rule.position else None
        return None


def position_sinks(args, kwargs) -> torch.Tensor | None:
    """(B, T) mask of tokens at sequence position 0 for one stack call, KV cache aware."""
    position_ids = kwargs.get("position_ids")
    ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    shape = ids.shape if ids is not None else embeds.shape[:2]
    if position_ids is not None:
        return (position_ids == 0).expand(shape)
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    if past > 0:
        return torch.zeros(shape, dtype=torch.bool)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] == shape[-1]:
        return first_valid(mask.bool())
    out = torch.zeros(shape, dtype=torch.bool)
    out[:, 0] = True
    return out

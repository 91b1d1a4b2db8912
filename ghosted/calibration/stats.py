"""Streaming float64 sufficient statistics of one pruning boundary.

A boundary maps X = residual stream entering layer `start` to Y = residual stream entering
layer `end`; Δ = Y − X. Every closed-form recovery we compare (Ghost, ReplaceMe-LS) and every
boundary error needs only d×d second moments, so we accumulate those in float64 and never
keep activations: memory is O(d²) whatever the number of calibration tokens.

What cannot be written as sums is handled separately:
- LinearPatch's scale is a mean over sequences of per-sequence ratios, so we keep the running
  sum of those ratios and the number of sequences.
- ReplaceMe-cosine is an iterative fit that needs token rows, so we keep a bounded uniform
  reservoir of (m, Δ + m) rows (`TokenReservoir`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from ghosted.core.hadamard import has_hadamard, normalized_hadamard

_RATIO_FLOOR = 1e-12  # guards mean|x| = 0 in the LinearPatch per-sequence ratio

# Fields that add up over disjoint token sets (the sink split relies on exactly these).
_ADDITIVE = ("n_tokens", "xtx", "xtd", "dtd", "x_sum", "y_sum", "mtm", "mtd")


@dataclass
class TokenReservoir:
    """Uniform random sample of at most `capacity` token rows of (m, Δ + m), float32 on CPU.

    ReplaceMe-cosine needs token rows rather than moments; Algorithm R keeps every token
    offered so far with equal probability capacity/seen, in O(capacity·d) memory.
    """

    capacity: int  # maximum number of rows kept
    m: torch.Tensor  # (k, d) MLP-branch outputs of layer start−1, k = min(seen, capacity)
    target: torch.Tensor  # (k, d) Δ + m, ReplaceMe's regression target
    seen: int = 0  # number of tokens offered so far

    @classmethod
    def empty(cls, capacity: int, dim: int) -> TokenReservoir:
        """A reservoir with no rows yet."""
        rows = torch.zeros(0, dim, dtype=torch.float32)  # (0, d)
        return cls(capacity=capacity, m=rows, target=rows.clone())

    def offer(self, m_rows: torch.Tensor, target_rows: torch.Tensor, gen: torch.Generator) -> None:
        """Algorithm R over a batch of rows (N, d); the last writer to a slot wins, as in order."""
        n = m_rows.shape[0]
        index = self.seen + torch.arange(n, dtype=torch.float64)  # (N,) global token index
        draw = (torch.rand(n, generator=gen, dtype=torch.float64) * (index + 1)).floor()
        slot = torch.where(index < self.capacity, index, draw).long()  # (N,)
        accepted = (slot < self.capacity).nonzero().squeeze(1)  # (A,)
        winner = torch.full((self.capacity,), -1, dtype=torch.long)  # (capacity,)
        winner.scatter_reduce_(0, slot[accepted], accepted, reduce="amax")
        slots = (winner >= 0).nonzero().squeeze(1)  # (S,)
        rows = winner[slots].to(m_rows.device)  # (S,)
        self._grow(min(self.seen + n, self.capacity))
        self.m[slots] = m_rows[rows].float().cpu()
        self.target[slots] = target_rows[rows].float().cpu()
        self.seen += n

    def merge(self, other: TokenReservoir, seed: int = 0) -> TokenReservoir:
        """Uniform sample of the union: a hypergeometric share from each side's uniform sample."""
        capacity = min(self.capacity, other.capacity)
        size = min(capacity, self.seen + other.seen)
        rng = np.random.default_rng(seed)
        from_self = int(rng.hypergeometric(self.seen, other.seen, size)) if size else 0
        gen = torch.Generator().manual_seed(seed)
        pick_a = torch.randperm(len(self.m), generator=gen)[:from_self]
        pick_b = torch.randperm(len(other.m), generator=gen)[: size - from_self]
        return TokenReservoir(
            capacity=capacity,
            m=torch.cat([self.m[pick_a], other.m[pick_b]]),  # (size, d)
            target=torch.cat([self.target[pick_a], other.target[pick_b]]),  # (size, d)
            seen=self.seen + other.seen,
        )

    def copy(self) -> TokenReservoir:
        """Independent copy (the accumulator keeps sampling into its own)."""
        return replace(self, m=self.m.clone(), target=self.target.clone())

    def _grow(self, rows: int) -> None:
        extra = rows - self.m.shape[0]
        if extra > 0:
            pad = torch.zeros(extra, self.m.shape[1], dtype=torch.float32)  # (extra, d)
            self.m, self.target = torch.cat([self.m, pad]), torch.cat([self.target, pad])


@dataclass
class BoundaryStats:
    """Float64 sufficient statistics of X (entering `start`) → Y (entering `end`), Δ = Y − X."""

    start: int  # index of the first removed layer
    end: int  # index of the first kept layer after the gap
    dim: int  # hidden size d
    n_tokens: int  # number of (valid) tokens accumulated
    xtx: torch.Tensor  # (d, d) ΣXᵀX
    xtd: torch.Tensor  # (d, d) ΣXᵀΔ
    dtd: torch.Tensor  # (d, d) ΣΔᵀΔ
    x_sum: torch.Tensor  # (d,) ΣX over tokens
    y_sum: torch.Tensor  # (d,) ΣY over tokens
    n_samples: int = 0  # sequences contributing to the LinearPatch ratio sums
    lp_ratio_sum: torch.Tensor | None = None  # (d,) Σ_seq mean_t|y| / mean_t|x|
    lp_rot_ratio_sum: torch.Tensor | None = None  # (d,) same in the basis x@Hn, y@Hn
    mtm: torch.Tensor | None = None  # (d, d) ΣmᵀM, m = MLP output of layer start−1
    mtd: torch.Tensor | None = None  # (d, d) ΣmᵀΔ
    sink: BoundaryStats | None = None  # additive stats restricted to sink tokens
    position_dtd: torch.Tensor | None = None  # (T,) Σ over sequences of ‖Δ_t‖² at window position t
    position_tokens: torch.Tensor | None = None  # (T,) valid tokens seen at each window position
    replaceme_samples: TokenReservoir | None = None  # uniform sample of (m, Δ+m) rows

    @property
    def has_mlp(self) -> bool:
        """True when ReplaceMe statistics (m was given) are present."""
        return self.mtm is not None

    def merge(self, other: BoundaryStats) -> BoundaryStats:
        """Statistics of the union of two disjoint token sets (shards, fit + held-out)."""
        _check_compatible(self, other)
        sums = {name: _add(getattr(self, name), getattr(other, name)) for name in _ADDITIVE}
        return replace(
            self, **sums,
            n_samples=self.n_samples + other.n_samples,
            lp_ratio_sum=_add(self.lp_ratio_sum, other.lp_ratio_sum),
            lp_rot_ratio_sum=_add(self.lp_rot_ratio_sum, other.lp_rot_ratio_sum),
            sink=None if self.sink is None else self.sink.merge(other.sink),
            position_dtd=_add_padded(self.position_dtd, other.position_dtd),
            position_tokens=_add_padded(self.position_tokens, other.position_tokens),
            replaceme_samples=_merge_reservoirs(self.replaceme_samples, other.replaceme_samples),
        )

    def nonfinite_fields(self) -> list[str]:
        """Names (XᵀX, XᵀΔ, ΔᵀΔ, mᵀm, mᵀΔ) of the second moments holding NaN or inf; [] when all finite.

        NaN or inf anywhere in the activations propagates into these sums, so checking them once,
        after accumulation, catches every non-finite token at the cost of a few d x d reductions.
        """
        named = {"XᵀX": self.xtx, "XᵀΔ": self.xtd, "ΔᵀΔ": self.dtd, "mᵀm": self.mtm, "mᵀΔ": self.mtd}
        return [name for name, t in named.items() if t is not None and not bool(torch.isfinite(t).all())]

    def __add__(self, other: BoundaryStats) -> BoundaryStats:
        return self.merge(other)

    def sink_only(self) -> BoundaryStats:
        """Statistics of the sink tokens alone (raises if no sink mask was ever given)."""
        if self.sink is None:
            raise ValueError("these statistics carry no sink sub-statistics")
        return self.sink

    def without_sink(self) -> BoundaryStats:
        """Statistics of the non-sink tokens: total − sink for every additive field.

        LinearPatch ratios are per-sequence means, not sums, so they cannot be split; they are
        kept from the total. The reservoir and the per-position sums mix both token kinds, so they
        are dropped.
        """
        sink = self.sink_only()
        sums = {name: _sub(getattr(self, name), getattr(sink, name)) for name in _ADDITIVE}
        return replace(self, **sums, sink=None, replaceme_samples=None, position_dtd=None, position_tokens=None)

    def to(self, device: torch.device | str) -> BoundaryStats:
        """Copy of these statistics with every tensor on `device` (reservoir stays on CPU)."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {k: v.to(device) for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        return replace(self, **moved, sink=None if self.sink is None else self.sink.to(device))


class BoundaryAccumulator:
    """Accumulates `BoundaryStats` batch by batch without keeping any activation.

    Sink sub-statistics exist once any `update` passed a `sink` mask (earlier batches then
    count as sink-free). LinearPatch's rotated ratios need a Hadamard matrix of order d and
    are left out (None) when none exists.
    """

    def __init__(self, start: int, end: int, dim: int, *, device: torch.device | str = "cpu",
                 with_mlp: bool, lp: bool = True, reservoir_tokens: int = 0, seed: int = 0) -> None:
        self.start, self.end, self.dim = start, end, dim
        self.device = torch.device(device)
        self.with_mlp = with_mlp
        self.totals = _MomentSums(dim, self.device, with_mlp)
        self.sinks: _MomentSums | None = None  # created at the first update with a sink mask
        self.n_samples = 0
        self.position_dtd = torch.zeros(0, dtype=torch.float64, device=self.device)  # (T,) grows with T
        self.position_tokens = torch.zeros(0, dtype=torch.float64, device=self.device)  # (T,)
        zeros = torch.zeros(dim, dtype=torch.float64, device=self.device)  # (d,)
        rotate = lp and has_hadamard(dim)
        self.lp_ratio_sum = zeros.clone() if lp else None
        self.lp_rot_ratio_sum = zeros.clone() if rotate else None
        self.rotation = normalized_hadamard(dim).to(self.device) if rotate else None  # (d, d)
        use_reservoir = with_mlp and reservoir_tokens > 0
        self.reservoir = TokenReservoir.empty(reservoir_tokens, dim) if use_reservoir else None
        self.generator = torch.Generator().manual_seed(seed)  # drives reservoir sampling

    def update(self, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
               m: torch.Tensor | None = None, sink: torch.Tensor | None = None) -> None:
        """Add one batch. x, y, m: (B, T, d) any float dtype/device; valid, sink: (B, T) bool."""
        if self.with_mlp != (m is not None):
            state = "missing" if m is None else "given"
            raise ValueError(f"with_mlp={self.with_mlp} but m is {state}")
        x, y = self._float64(x), self._float64(y)  # (B, T, d)
        m = None if m is None else self._float64(m)  # (B, T, d)
        valid = valid.to(self.device, torch.bool)  # (B, T)
        delta = y - x  # (B, T, d), computed once for every sum below
        self.totals.add(x, y, delta, m, valid)
        delta_sq = torch.einsum("btd,btd->bt", delta, delta).masked_fill(~valid, 0.0)  # (B, T) ‖Δ_t‖²
        self._add_positions(delta_sq, valid)
        if sink is not None:
            if self.sinks is None:
                self.sinks = _MomentSums(self.dim, self.device, self.with_mlp)
            self.sinks.add(x, y, delta, m, valid & sink.to(self.device, torch.bool))
        if self.lp_ratio_sum is not None:
            self._add_linearpatch_ratios(x, y, valid)
        if self.reservoir is not None:
            m_rows = m[valid]  # (N, d)
            self.reservoir.offer(m_rows, delta[valid] + m_rows, self.generator)

    def finalize(self) -> BoundaryStats:
        """Snapshot of the statistics so far (tensors are copies; accumulation may continue)."""
        stats = BoundaryStats(
            start=self.start, end=self.end, dim=self.dim, **self.totals.snapshot(),
            n_samples=self.n_samples,
            lp_ratio_sum=_clone(self.lp_ratio_sum),
            lp_rot_ratio_sum=_clone(self.lp_rot_ratio_sum),
            replaceme_samples=None if self.reservoir is None else self.reservoir.copy(),
            position_dtd=self.position_dtd.clone(), position_tokens=self.position_tokens.clone(),
        )
        if self.sinks is not None:
            stats.sink = BoundaryStats(
                start=self.start, end=self.end, dim=self.dim, **self.sinks.snapshot()
            )
        return stats

    def _float64(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=torch.float64)

    def _add_positions(self, delta_sq: torch.Tensor, valid: torch.Tensor) -> None:
        """Add per-position sums over the batch; delta_sq, valid: (B, T)."""
        self.position_dtd = _add_padded(self.position_dtd, delta_sq.sum(0))  # (T,)
        self.position_tokens = _add_padded(self.position_tokens, valid.sum(0).to(torch.float64))  # (T,)

    def _add_linearpatch_ratios(self, x: torch.Tensor, y: torch.Tensor,
                                valid: torch.Tensor) -> None:
        """Per sequence: mean_t|y_tc| / mean_t|x_tc| over its valid tokens, in both bases."""
        has_tokens = valid.any(dim=1)  # (B,)
        self.lp_ratio_sum += _sequence_ratio(x, y, valid)[has_tokens].sum(0)
        if self.rotation is not None:
            x_rot, y_rot = x @ self.rotation, y @ self.rotation  # (B, T, d)
            self.lp_rot_ratio_sum += _sequence_ratio(x_rot, y_rot, valid)[has_tokens].sum(0)
        self.n_samples += int(has_tokens.sum())


class _MomentSums:
    """Running float64 sums over one token set (all valid tokens, or the sink tokens)."""

    def __init__(self, dim: int, device: torch.device, with_mlp: bool) -> None:
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        self.n_tokens = 0
        self.xtx, self.xtd, self.dtd = zeros(dim, dim), zeros(dim, dim), zeros(dim, dim)
        self.x_sum, self.y_sum = zeros(dim), zeros(dim)
        self.mtm = zeros(dim, dim) if with_mlp else None
        self.mtd = zeros(dim, dim) if with_mlp else None

    def add(self, x: torch.Tensor, y: torch.Tensor, delta: torch.Tensor, m: torch.Tensor | None,
            mask: torch.Tensor) -> None:
        """Add the tokens selected by mask (B, T) from x, y, Δ = y − x, m: (B, T, d) float64."""
        x, y, delta = x[mask], y[mask], delta[mask]  # (N, d)
        self.n_tokens += x.shape[0]
        self.xtx += x.T @ x  # (d, d)
        self.xtd += x.T @ delta  # (d, d)
        self.dtd += delta.T @ delta  # (d, d)
        self.x_sum += x.sum(0)  # (d,)
        self.y_sum += y.sum(0)  # (d,)
        if m is not None:
            m = m[mask]  # (N, d)
            self.mtm += m.T @ m  # (d, d)
            self.mtd += m.T @ delta  # (d, d)

    def snapshot(self) -> dict:
        """Copies of the additive fields, keyed like `BoundaryStats`."""
        return {name: _clone(getattr(self, name)) if name != "n_tokens" else self.n_tokens
                for name in _ADDITIVE}


def _sequence_ratio(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """mean_t|y| / max(mean_t|x|, floor) per sequence and channel over valid tokens: (B, d)."""
    weight = valid.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    count = weight.sum(1).clamp_min(1.0)  # (B, 1)
    mean_abs_x = (x.abs() * weight).sum(1) / count  # (B, d)
    mean_abs_y = (y.abs() * weight).sum(1) / count  # (B, d)
    return mean_abs_y / mean_abs_x.clamp_min(_RATIO_FLOOR)  # (B, d)


def _check_compatible(a: BoundaryStats, b: BoundaryStats) -> None:
    if (a.start, a.end, a.dim) != (b.start, b.end, b.dim):
        raise ValueError(f"cannot merge boundary {a.start}->{a.end} (d={a.dim}) "
                         f"with {b.start}->{b.end} (d={b.dim})")
    for name in ("mtm", "lp_ratio_sum", "lp_rot_ratio_sum", "sink"):
        if (getattr(a, name) is None) != (getattr(b, name) is None):
            raise ValueError(f"cannot merge: '{name}' is present in only one of the statistics")


def _add(a, b):  # None-propagating sum of two optional fields
    return None if a is None else a + b


def _add_padded(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """Sum of two 1-D per-position vectors of possibly different lengths (None if either is)."""
    if a is None or b is None:
        return None
    out = torch.zeros(max(len(a), len(b)), dtype=a.dtype, device=a.device)  # (max T,)
    out[: len(a)] += a
    out[: len(b)] += b.to(a.device)
    return out


def _sub(a, b):  # None-propagating difference of two optional fields
    return None if a is None else a - b


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:  # None-propagating copy
    return None if t is None else t.clone()


def _merge_reservoirs(a: TokenReservoir | None, b: TokenReservoir | None) -> TokenReservoir | None:
    """Merged reservoir, or None when one side has none (the union could not be uniform)."""
    if a is None or b is None:
        return None
    return a.merge(b)

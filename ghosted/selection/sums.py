"""Streaming sums for every similarity criterion and the recoverability score, in one pass.

A forward pass captures every boundary h_0 .. h_L (h_b = residual stream entering layer b; h_L is the
last layer's output *before* the final norm). Only valid (non-padding) tokens count. Per batch we add

- per-token cosines along the hidden axis between every pair of boundaries (a K×K matrix per token,
  K = L + 1; never a tokens×tokens matrix), their angular distances arccos(cos)/π, and the same on the
  last valid token of each sequence;
- the sequence-axis cosine of the paper's official code: ``torch.cosine_similarity(a, b)`` on (B, T, d)
  uses dim=1, so it is a cosine along the *sequence* per channel, averaged over channels;
- float64 Gram blocks h_iᵀh_j for the boundary pairs the requested blocks need (recoverability), and
  per block the same moments with each token weighted by 1/‖y_t‖² (token-normalised recoverability).

Memory never grows with the number of tokens: the similarity sums are K×K, the Gram blocks take
8·d²·P bytes for P stored pairs (``gram_bytes``), the weighted moments 3·8·d² bytes per block.
"""

from __future__ import annotations

import math

import torch

from ghosted.recovery.solvers import ghost_operator, relative_error, stream_error
from ghosted.calibration.stats import BoundaryStats

_NORM_FLOOR = 1e-8  # torch.cosine_similarity's eps: guards the cosine of an all-zero vector


def stack_boundaries(resid: dict[int, torch.Tensor], count: int, device: torch.device) -> torch.Tensor:
    """Boundaries 0..count-1 from a capture as one float64 tensor (B, T, K, d) on ``device``."""
    return torch.stack([resid[b].to(device=device, dtype=torch.float64) for b in range(count)], dim=2)


def last_valid_index(valid: torch.Tensor) -> torch.Tensor:
    """Position of the last valid token of each sequence (B,), for left or right padding."""
    positions = torch.arange(valid.shape[1], device=valid.device)  # (T,)
    return (valid.long() * positions).argmax(dim=1)  # (B,)


def token_cosines(rows: torch.Tensor) -> torch.Tensor:
    """Cosine along the hidden axis between every pair of boundaries, per token: (N, K, K)."""
    norms = rows.norm(dim=-1, keepdim=True)  # (N, K, 1)
    units = rows / norms.clamp_min(_NORM_FLOOR)  # (N, K, d)
    return units @ units.transpose(1, 2)  # (N, K, K)


def angular(cosines: torch.Tensor) -> torch.Tensor:
    """Angular distance arccos(cos)/π in [0, 1] (cos clamped into [-1, 1] first)."""
    return torch.arccos(cosines.clamp(-1.0, 1.0)) / math.pi


def sequence_axis_cosine(sequence: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over channels of the cosine along the sequence axis, for every boundary pair: (K, K).

    ``sequence`` is (T, K, d) and ``valid`` (T,); padding rows are zeroed, which removes them from
    every dot product and norm.
    """
    masked = sequence * valid[:, None, None]  # (T, K, d)
    dots = torch.einsum("tic,tjc->ijc", masked, masked)  # (K, K, d)
    norms = torch.diagonal(dots, dim1=0, dim2=1).T.clamp_min(0).sqrt()  # (K, d)
    scale = (norms[:, None, :] * norms[None, :, :]).clamp_min(_NORM_FLOOR)  # (K, K, d)
    return (dots / scale).mean(dim=-1)  # (K, K)


class SimilaritySums:
    """Running sums of the similarity criteria between every pair of boundaries."""

    def __init__(self, count: int, device: torch.device):
        zeros = lambda: torch.zeros(count, count, dtype=torch.float64, device=device)  # noqa: E731
        self.cosine = zeros()  # Σ_tokens cos(h_i, h_j), hidden axis
        self.angular = zeros()  # Σ_tokens arccos(cos)/π
        self.angular_last = zeros()  # Σ_sequences arccos(cos)/π on the last valid token
        self.sequence_cosine = zeros()  # Σ_sequences mean_channels cos along the sequence axis
        self.tokens = 0
        self.sequences = 0

    def add(self, stack: torch.Tensor, valid: torch.Tensor) -> None:
        """Add a batch: ``stack`` (B, T, K, d) float64, ``valid`` (B, T) bool."""
        rows = stack[valid]  # (N, K, d)
        cosines = token_cosines(rows)  # (N, K, K)
        self.cosine += cosines.sum(0)
        self.angular += angular(cosines).sum(0)
        self.tokens += rows.shape[0]
        has_tokens = valid.any(dim=1)  # (B,)
        last = last_valid_index(valid)[has_tokens]  # (S,)
        last_rows = stack[has_tokens.nonzero().squeeze(1), last]  # (S, K, d)
        self.angular_last += angular(token_cosines(last_rows)).sum(0)
        for b in has_tokens.nonzero().squeeze(1).tolist():
            self.sequence_cosine += sequence_axis_cosine(stack[b], valid[b].to(stack.dtype))
        self.sequences += int(has_tokens.sum())

    def means(self) -> dict[str, torch.Tensor]:
        """Each criterion as a (K, K) matrix of means (entry [i, j]: boundaries i and j)."""
        tokens, sequences = max(self.tokens, 1), max(self.sequences, 1)
        return {"cosine": self.cosine / tokens, "angular": self.angular / tokens,
                "angular_last": self.angular_last / sequences,
                "sequence_cosine": self.sequence_cosine / sequences}


def gram_pairs(blocks: list[tuple[int, int]]) -> dict[int, list[int]]:
    """Boundary i -> the boundaries j >= i whose Gram block h_iᵀh_j the blocks (start, end) need.

    A block needs h_sᵀh_s (XᵀX), h_sᵀh_e (XᵀY) and h_eᵀh_e (YᵀY).
    """
    pairs: dict[int, set[int]] = {}
    for start, end in blocks:
        pairs.setdefault(start, {start}).add(end)
        pairs.setdefault(end, {end})
    return {i: sorted(js) for i, js in sorted(pairs.items())}


def gram_bytes(blocks: list[tuple[int, int]], dim: int) -> int:
    """Memory the float64 Gram blocks of ``blocks`` take: 8·d² bytes per stored boundary pair.

    Example (SmolLM2, d = 576, 30 layers): every block of every n stores 495 pairs, 1.3 GB; only
    n = 7 and n = 11 store 75 pairs, 0.2 GB.
    """
    return 8 * dim * dim * sum(len(js) for js in gram_pairs(blocks).values())


class GramSums:
    """Float64 Σ_tokens h_iᵀh_j for the boundary pairs that some blocks need, plus Σ h_i."""

    def __init__(self, blocks: list[tuple[int, int]], count: int, dim: int, device: torch.device):
        self.pairs = gram_pairs(blocks)
        self.dim = dim
        self.sums = {i: torch.zeros(dim, len(js) * dim, dtype=torch.float64, device=device)
                     for i, js in self.pairs.items()}  # i -> (d, |js|·d) = [h_iᵀh_j for j in js]
        self.row_sums = torch.zeros(count, dim, dtype=torch.float64, device=device)  # (K, d) Σ h_b
        self.tokens = 0

    def add(self, stack: torch.Tensor, valid: torch.Tensor) -> None:
        """Add a batch: ``stack`` (B, T, K, d) float64, ``valid`` (B, T) bool."""
        rows = stack[valid]  # (N, K, d)
        for i, js in self.pairs.items():
            partners = rows[:, js].reshape(rows.shape[0], -1)  # (N, |js|·d)
            self.sums[i].addmm_(rows[:, i].T, partners)  # (d, |js|·d) += h_iᵀ[h_j ...]
        self.row_sums += rows.sum(0)
        self.tokens += rows.shape[0]

    def gram(self, i: int, j: int) -> torch.Tensor:
        """Σ h_iᵀh_j (d, d) for a stored pair i <= j."""
        k = self.pairs[i].index(j)
        return self.sums[i][:, k * self.dim:(k + 1) * self.dim]

    def boundary_stats(self, start: int, end: int) -> BoundaryStats:
        """X = h_start, Y = h_end, Δ = Y − X as the ``BoundaryStats`` every solver reads."""
        xtx, xty, yty = self.gram(start, start), self.gram(start, end), self.gram(end, end)  # (d, d)
        xtd = xty - xtx  # (d, d) XᵀΔ
        dtd = yty - xty - xty.T + xtx  # (d, d) ΔᵀΔ
        return BoundaryStats(start=start, end=end, dim=self.dim, n_tokens=self.tokens, xtx=xtx, xtd=xtd,
                             dtd=(dtd + dtd.T) / 2, x_sum=self.row_sums[start], y_sum=self.row_sums[end])

    @property
    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.sums.values())


class TokenWeightedSums:
    """Per block (start, end): Σ_t w_t·[x_tᵀx_t, x_tᵀy_t, y_tᵀy_t], w_t = 1/‖y_t‖², x = h_start, y = h_end.

    With these, Σ_t ‖x_t·M − δ_t‖²/‖y_t‖² is a quadratic form in M: every token counts equally, as in
    the cosine criteria, so a few tokens with huge Δ (attention sinks) cannot dominate the score.
    """

    def __init__(self, blocks: list[tuple[int, int]], dim: int, device: torch.device):
        self.sums = {block: torch.zeros(3, dim, dim, dtype=torch.float64, device=device) for block in blocks}
        self.tokens = 0

    def add(self, stack: torch.Tensor, valid: torch.Tensor) -> None:
        """Add a batch: ``stack`` (B, T, K, d) float64, ``valid`` (B, T) bool."""
        rows = stack[valid]  # (N, K, d)
        for (start, end), sums in self.sums.items():
            x, y = rows[:, start], rows[:, end]  # (N, d)
            weight = 1.0 / (y * y).sum(-1, keepdim=True).clamp_min(_NORM_FLOOR**2)  # (N, 1)
            sums[0].addmm_((x * weight).T, x)  # (d, d) Σ w xᵀx
            sums[1].addmm_((x * weight).T, y)  # (d, d) Σ w xᵀy
            sums[2].addmm_((y * weight).T, y)  # (d, d) Σ w yᵀy
        self.tokens += rows.shape[0]

    def mean_error(self, block: tuple[int, int], correction: torch.Tensor) -> float:
        """mean_t ‖x_t·M − δ_t‖²/‖y_t‖² for a correction M (d, d), δ = y − x."""
        xx, xy, yy = self.sums[block]  # (d, d) each
        xd = xy - xx  # (d, d) Σ w xᵀδ
        dd = yy - xy - xy.T + xx  # (d, d) Σ w δᵀδ
        total = (correction * (xx @ correction)).sum() - 2 * (correction * xd).sum() + torch.trace(dd)
        return max(float(total), 0.0) / max(self.tokens, 1)

    @staticmethod
    def bytes_for(blocks: list[tuple[int, int]], dim: int) -> int:
        return 3 * 8 * dim * dim * len(blocks)


def recoverability(fit: GramSums, heldout: GramSums | None, blocks: list[tuple[int, int]],
                   eps: float = 1e-6, solver: str = "solve", weighted: TokenWeightedSums | None = None
                   ) -> dict[tuple[int, int], dict[str, float]]:
    """(start, end) -> errors of the ghost operator M fitted on ``fit``, keyed by criterion name.

    "recoverability": ‖X·M − Δ‖²/‖Δ‖² with (XᵀX + εI)·M = XᵀΔ, the operator ``recover`` fits;
    "recoverability_heldout": the same M on held-out tokens (only with ``heldout``);
    "recoverability_token": mean_t ‖x_t·M − δ_t‖²/‖y_t‖² (only with ``weighted``). Blocks sharing a start
    share one Cholesky factor of XᵀX + εI, and the fit error needs no further product:
    ‖XM − Δ‖² = tr(ΔᵀΔ) − tr(MᵀXᵀΔ) − ε‖M‖². ``solver="pinv"`` (or a matrix that is not
    positive definite) falls back to ``ghost_operator`` block by block.
    """
    scores = {}
    for start, ends in _ends_by_start(blocks).items():
        corrections, factored = _corrections(fit, start, ends, eps, solver)
        for end, correction in zip(ends, corrections):
            stats = fit.boundary_stats(start, end)
            held = None if heldout is None else heldout.boundary_stats(start, end)
            errors = {"recoverability": _ridge_fit_error(stats, correction, eps) if factored
                      else _error(stats, correction)}
            if held is not None:
                errors["recoverability_heldout"] = _error(held, correction)
            if weighted is not None:
                errors["recoverability_token"] = weighted.mean_error((start, end), correction)
            scores[(start, end)] = errors
    return scores


def _ends_by_start(blocks: list[tuple[int, int]]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for start, end in blocks:
        grouped.setdefault(start, []).append(end)
    return grouped


def _corrections(fit: GramSums, start: int, ends: list[int], eps: float, solver: str
                 ) -> tuple[list[torch.Tensor], bool]:
    """(M (d, d) for each block (start, end) in ``ends``, whether they came from one Cholesky factor)."""
    xtx = fit.gram(start, start)  # (d, d)
    eye = torch.eye(fit.dim, dtype=xtx.dtype, device=xtx.device)  # (d, d)
    factor, info = torch.linalg.cholesky_ex(xtx + eps * eye)  # (d, d) lower triangular
    if solver != "solve" or int(info) != 0:
        return [ghost_operator(fit.boundary_stats(start, end), eps=eps, solver=solver) - eye for end in ends], False
    rhs = torch.cat([fit.boundary_stats(start, end).xtd for end in ends], dim=1)  # (d, k·d) XᵀΔ per block
    return list(torch.cholesky_solve(rhs, factor).split(fit.dim, dim=1)), True  # k × (d, d)


def _ridge_fit_error(stats: BoundaryStats, correction: torch.Tensor, eps: float) -> float:
    """Relative fit error of the ridge solution M of (XᵀX + εI)M = XᵀΔ, without forming (XᵀX)·M."""
    total = float(torch.trace(stats.dtd))
    explained = float((correction * stats.xtd).sum() + eps * (correction * correction).sum())
    return max(total - explained, 0.0) / total


def _error(stats: BoundaryStats, correction: torch.Tensor) -> float:
    """‖X·M − Δ‖²/‖Δ‖² on ``stats``' tokens for a correction M = W − I."""
    eye = torch.eye(stats.dim, dtype=correction.dtype, device=correction.device)  # (d, d)
    return relative_error(stats, stream_error(stats, eye + correction))

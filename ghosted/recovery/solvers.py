"""Recovery operators and boundary errors computed from `BoundaryStats` alone.

Conventions: activations are row vectors, an operator acts on the right (x ↦ x·W).
- Full-stream operators W (Ghost, LinearPatch) replace the residual stream X by X·W.
- MLP-branch operators T (ReplaceMe) replace m by m·T, so the boundary becomes
  X ↦ X + m·(T − I).
Everything returned is float64 on the device of the statistics.
"""
from __future__ import annotations

import warnings
from typing import Literal

import torch

from ghosted.core.guards import (FLOAT16_HINT, IllConditionedFitWarning, NonFiniteError, check_eps, gap_label,
                                 ill_conditioned_message)
from ghosted.core.hadamard import normalized_hadamard
from ghosted.calibration.stats import BoundaryStats

_SINGULAR_RCOND = 1e-12  # λ_min/λ_max below which mᵀm is treated as singular (σ ratio 1e-6)


def ghost_operator(stats: BoundaryStats, eps: float = 1e-6,
                   solver: Literal["solve", "pinv"] = "solve", rcond: float = 1e-6) -> torch.Tensor:
    """Ghost operator W = I + M with M = argmin ‖X·M − Δ‖ (the paper's unconstrained optimum).

    "solve": (XᵀX + εI)·M = XᵀΔ with an absolute ε, as in the released code.
    "pinv": M = X⁺Δ, minimum-norm, with singular values of X below rcond·σ_max cut.
    Both act as the identity on directions the calibration never excites (exactly for pinv).
    A non-finite or negative ``eps``, non-finite statistics, or a non-finite result raise a
    ValueError naming the gap (see ``ghosted.core.guards``).
    """
    eps = check_eps(eps)
    if solver not in ("solve", "pinv"):
        raise ValueError(f"unknown solver {solver!r}; use 'solve' or 'pinv'")
    require_finite(stats)
    eye = _eye_like(stats.xtx)
    if solver == "solve":
        try:
            correction = torch.linalg.solve(stats.xtx + eps * eye, stats.xtd)  # (d, d)
        except torch.linalg.LinAlgError as err:
            raise ValueError(f"The ghost solve of gap {_gap(stats)} failed: XᵀX + εI is singular (ε = {eps:g}, "
                             f"{stats.n_tokens:,} tokens for width {stats.dim}). Use eps > 0, solver='pinv' or "
                             "more calibration tokens.") from err
    else:
        correction = _gram_pinv(stats.xtx, rcond) @ stats.xtd  # (d, d)
    return require_finite_operator(eye + correction, stats, f"ghost operator (eps = {eps:g}, solver {solver!r})")


def require_finite(stats: BoundaryStats) -> None:
    """Raise ``NonFiniteError`` naming the gap when XᵀX, XᵀΔ, ΔᵀΔ (or mᵀm, mᵀΔ) hold NaN or inf."""
    bad = stats.nonfinite_fields()
    if bad:
        raise NonFiniteError(f"Non-finite calibration statistics at gap {_gap(stats)} ({', '.join(bad)} hold "
                             f"NaN or inf): the model produced non-finite activations on the calibration "
                             f"windows; {FLOAT16_HINT}.")


def require_finite_operator(operator: torch.Tensor, stats: BoundaryStats, what: str) -> torch.Tensor:
    """``operator`` unchanged when finite; otherwise a ``NonFiniteError`` naming the gap and the fit."""
    if not bool(torch.isfinite(operator).all()):
        raise NonFiniteError(f"The {what} of gap {_gap(stats)} is not finite although its statistics are: "
                             f"the solve broke down ({stats.n_tokens:,} tokens for width {stats.dim}). Use a "
                             "larger eps, solver='pinv' or more calibration tokens.")
    return operator


def condition_number(stats: BoundaryStats, eps: float) -> float:
    """cond(XᵀX + εI) = λ_max / λ_min in float64 (inf when the matrix is not positive definite)."""
    eigenvalues = torch.linalg.eigvalsh(stats.xtx + eps * _eye_like(stats.xtx))  # (d,) ascending
    smallest, largest = float(eigenvalues[0]), float(eigenvalues[-1])
    return largest / smallest if smallest > 0 else float("inf")


def warn_if_ill_conditioned(stats: BoundaryStats, eps: float = 1e-6, seq_len: int | None = None,
                            stacklevel: int = 2) -> str | None:
    """Warn (``IllConditionedFitWarning``) when the ghost fit of this gap cannot be trusted.

    That is: fewer calibration tokens than the width (XᵀX rank-deficient, the operator overfits),
    or cond(XᵀX + εI) above ``guards.MAX_CONDITION``. Returns the message, or None when the fit is
    sound. ``seq_len`` lets the message say how many sequences would be enough.
    """
    eps = check_eps(eps)
    require_finite(stats)
    condition = float("inf") if stats.n_tokens < stats.dim else condition_number(stats, eps)
    message = ill_conditioned_message(stats.start, stats.end, stats.dim, stats.n_tokens, condition, eps, seq_len)
    if message:
        warnings.warn(message, IllConditionedFitWarning, stacklevel=stacklevel)
    return message


def _gap(stats: BoundaryStats) -> str:
    return gap_label(stats.start, stats.end)


def linearpatch_operator(stats: BoundaryStats, rotate: bool) -> torch.Tensor:
    """LinearPatch W = diag(s) (Diag) or Hn·diag(s)·Hnᵀ (Rotate), s = mean per-sequence ratio."""
    ratio_sum = stats.lp_rot_ratio_sum if rotate else stats.lp_ratio_sum
    if ratio_sum is None or stats.n_samples == 0:
        kind = "rotated " if rotate else ""
        raise ValueError(f"no {kind}LinearPatch ratios in these statistics (accumulated with "
                         f"lp=False, no Hadamard of order {stats.dim}, or no samples)")
    scale = require_finite_operator(ratio_sum / stats.n_samples, stats, "LinearPatch scale")  # (d,)
    if not rotate:
        return torch.diag(scale)  # (d, d)
    h = normalized_hadamard(stats.dim).to(scale.device)  # (d, d)
    return (h * scale) @ h.T  # (d, d) = H·diag(s)·Hᵀ


def replaceme_ls(stats: BoundaryStats, ridge: float = 0.0) -> torch.Tensor:
    """ReplaceMe-LS T = (mᵀm + ridge·I)⁻¹·mᵀ(Δ + m), by `solve`, never an explicit inverse.

    If mᵀm + ridge·I is singular, falls back (with a warning) to the least-squares solution
    closest to the identity, T = I + (mᵀm)⁺·mᵀΔ.
    """
    ridge = check_eps(ridge, "ridge")
    mtm, mtd = _require_mlp(stats)
    require_finite(stats)
    eye = _eye_like(mtm)
    lhs = mtm + ridge * eye  # (d, d)
    eigenvalues = torch.linalg.eigvalsh(lhs)  # (d,) ascending
    if eigenvalues[0] > _SINGULAR_RCOND * eigenvalues[-1].clamp_min(1e-300):
        return require_finite_operator(torch.linalg.solve(lhs, mtm + mtd), stats, "ReplaceMe-LS map")  # (d, d)
    warnings.warn("mᵀm is singular: ReplaceMe-LS falls back to the pseudo-inverse solution "
                  "(identity on directions m never excites)", RuntimeWarning, stacklevel=2)
    return require_finite_operator(eye + _gram_pinv(lhs, rcond=1e-6) @ mtd, stats, "ReplaceMe-LS map")


def replaceme_cosine(samples_m: torch.Tensor, samples_target: torch.Tensor, *, epochs: int = 10,
                     lr: float = 1e-4, batch_tokens: int = 1024, seed: int = 0,
                     init: torch.Tensor | None = None) -> torch.Tensor:
    """ReplaceMe-cosine: T minimising 1 − mean_t cos(m_t·T, target_t) by Adam (float32).

    The target is Δ + m, ReplaceMe's default (non-"accurate") mode, in which the attention
    output and residual are ignored. Starts from the identity (or `init`); a fixed seed
    gives the same T. Hyper-parameter defaults are ReplaceMe's.
    """
    m = samples_m.float()  # (N, d)
    target = samples_target.to(m)  # (N, d)
    start = torch.eye(m.shape[1]) if init is None else init.detach().float()
    transform = start.clone().to(m.device).requires_grad_(True)  # (d, d)
    adam = _Adam(transform, lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(m.shape[0], generator=gen).to(m.device)  # (N,)
        for batch in order.split(batch_tokens):
            loss = cosine_loss(m[batch], target[batch], transform)
            (grad,) = torch.autograd.grad(loss, transform)
            adam.step(grad)
    return transform.detach().double()


class _Adam:
    """Plain Adam (torch's defaults β = (0.9, 0.999), eps = 1e-8) on one tensor.

    Written out because `torch.optim` takes seconds to import on first use.
    """

    def __init__(self, param: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.param, self.lr, self.betas, self.eps = param, lr, betas, eps
        self.first = torch.zeros_like(param)  # running mean of gradients
        self.second = torch.zeros_like(param)  # running mean of squared gradients
        self.steps = 0

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        beta1, beta2 = self.betas
        self.steps += 1
        self.first.lerp_(grad, 1 - beta1)
        self.second.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        first_hat = self.first / (1 - beta1**self.steps)
        second_hat = self.second / (1 - beta2**self.steps)
        self.param -= self.lr * first_hat / (second_hat.sqrt() + self.eps)


def cosine_loss(m: torch.Tensor, target: torch.Tensor, transform: torch.Tensor) -> torch.Tensor:
    """1 − mean_t cos(m_t·T, target_t), ReplaceMe's cosine objective."""
    return 1.0 - torch.nn.functional.cosine_similarity(m @ transform, target, dim=-1).mean()


def stream_error(stats: BoundaryStats, w: torch.Tensor) -> float:
    """‖X·W − Y‖²_F from statistics: with M = W − I, tr(MᵀXᵀXM) − 2tr(MᵀXᵀΔ) + tr(ΔᵀΔ).

    Clamped at 0 (round-off can make an exact fit slightly negative).
    """
    correction = w.to(stats.xtx) - _eye_like(stats.xtx)  # (d, d)
    return _quadratic_error(stats.xtx, stats.xtd, stats.dtd, correction)


def mlp_branch_error(stats: BoundaryStats, t: torch.Tensor) -> float:
    """‖X + m·(T − I) − Y‖²_F = ‖m·(T − I) − Δ‖²_F from statistics (ReplaceMe's boundary error)."""
    mtm, mtd = _require_mlp(stats)
    correction = t.to(mtm) - _eye_like(mtm)  # (d, d)
    return _quadratic_error(mtm, mtd, stats.dtd, correction)


def relative_error(stats: BoundaryStats, error: float) -> float:
    """error / ‖Δ‖²_F: 1 for the plain pruned model (W = I), 0 for a perfect patch."""
    return error / float(torch.trace(stats.dtd))


def residual_gram(stats: BoundaryStats, correction: torch.Tensor) -> torch.Tensor:
    """RᵀR (d, d) for R = Δ − X·M, M = W − I the full-stream correction (for spectra)."""
    return _residual_gram(stats.xtx, stats.xtd, stats.dtd, correction.to(stats.xtx))


def mlp_residual_gram(stats: BoundaryStats, correction: torch.Tensor) -> torch.Tensor:
    """RᵀR (d, d) for R = Δ − m·M, M = T − I the MLP-branch correction (for spectra)."""
    mtm, mtd = _require_mlp(stats)
    return _residual_gram(mtm, mtd, stats.dtd, correction.to(mtm))


def _quadratic_error(ata: torch.Tensor, atd: torch.Tensor, dtd: torch.Tensor,
                     correction: torch.Tensor) -> float:
    """‖A·M − Δ‖²_F from AᵀA, AᵀΔ, ΔᵀΔ; tr(MᵀGM) as a sum of elementwise products."""
    quadratic = (correction * (ata @ correction)).sum()
    cross = (correction * atd).sum()
    return max(float(quadratic - 2.0 * cross + torch.trace(dtd)), 0.0)


def _residual_gram(ata: torch.Tensor, atd: torch.Tensor, dtd: torch.Tensor,
                   correction: torch.Tensor) -> torch.Tensor:
    """(Δ − AM)ᵀ(Δ − AM) = ΔᵀΔ − ΔᵀAM − MᵀAᵀΔ + MᵀAᵀAM, symmetrised against round-off."""
    cross = atd.T @ correction  # (d, d) ΔᵀA·M
    gram = dtd - cross - cross.T + correction.T @ ata @ correction  # (d, d)
    return (gram + gram.T) / 2


def _gram_pinv(gram: torch.Tensor, rcond: float) -> torch.Tensor:
    """(AᵀA)⁺ from the Gram matrix, cutting singular values σ = √λ below rcond·σ_max."""
    eigenvalues, vectors = torch.linalg.eigh(gram)  # (d,), (d, d)
    sigma = eigenvalues.clamp_min(0).sqrt()  # (d,)
    keep = sigma > rcond * sigma.max()  # (d,)
    inverse = torch.where(keep, 1.0 / eigenvalues.where(keep, torch.ones_like(eigenvalues)), 0.0)
    return (vectors * inverse) @ vectors.T  # (d, d)


def _require_mlp(stats: BoundaryStats) -> tuple[torch.Tensor, torch.Tensor]:
    if stats.mtm is None or stats.mtd is None:
        raise ValueError("ReplaceMe needs MLP-branch statistics: "
                         "accumulate with with_mlp=True and pass m")
    return stats.mtm, stats.mtd


def _eye_like(matrix: torch.Tensor) -> torch.Tensor:
    return torch.eye(matrix.shape[0], dtype=matrix.dtype, device=matrix.device)  # (d, d)

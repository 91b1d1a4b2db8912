"""Low-rank ghost: the best rank-R correction M under the paper's least-squares objective.

``ghost`` fits W = I + M with M = argmin ‖X·M − Δ‖² + ε‖M‖² (d² parameters). ``ghost-lowrank``
solves the same problem with rank(M) ≤ R and stores M = U·V (2·d·R parameters): reduced-rank
regression, in closed form from the statistics every method already gathers (XᵀX, XᵀΔ).

Derivation. Let A = XᵀX + εI (symmetric positive definite for ε > 0), B = XᵀΔ and
M_full = A⁻¹B (the ghost correction). Up to a constant the objective is

    tr(MᵀAM) − 2·tr(MᵀB) = ‖A^{1/2}M − A^{-1/2}B‖²_F − tr(BᵀA⁻¹B),

and A^{-1/2}B = A^{1/2}M_full =: T. Since A^{1/2} is invertible, Z = A^{1/2}M has the rank of M, so
the problem is min ‖Z − T‖²_F over rank(Z) ≤ R: by Eckart–Young, Z* = T·V_R·V_Rᵀ with V_R the top-R
right singular vectors of T. Hence M* = A^{-1/2}Z* = M_full·V_R·V_Rᵀ. The right singular vectors
of T are the eigenvectors of TᵀT = M_fullᵀ·A·M_full (= BᵀA⁻¹B), so no square root is needed:
U = M_full·V_R (d, R) and V = V_Rᵀ (R, d). With R = d, V_R·V_Rᵀ = I and M* = M_full (``ghost``).
With ε = 0, TᵀT = (X·M_full)ᵀ(X·M_full): V_R are the top right singular vectors of X·M_full.
"""

from __future__ import annotations

import torch

from ghosted.recovery import solvers as solve
from ghosted.calibration.stats import BoundaryStats


def default_rank(dim: int) -> int:
    """d/4 (at least 1): half the parameters of the full d x d map."""
    return max(1, dim // 4)


def lowrank_factors(stats: BoundaryStats, rank: int, eps: float = 1e-6, solver: str = "solve",
                    rcond: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal rank-``rank`` correction M = U·V, float64: (U (d, R), V (R, d)).

    ``eps``, ``solver`` and ``rcond`` are those of ``solvers.ghost_operator`` (which gives M_full).
    """
    if not 1 <= rank <= stats.dim:
        raise ValueError(f"--rank must be in 1..{stats.dim} (the hidden size); got {rank}.")
    eye = torch.eye(stats.dim, dtype=stats.xtx.dtype, device=stats.xtx.device)  # (d, d)
    full = solve.ghost_operator(stats, eps=eps, solver=solver, rcond=rcond) - eye  # (d, d) M_full
    weighted = full.T @ (stats.xtx + eps * eye) @ full  # (d, d) TᵀT = M_fullᵀ A M_full
    weighted = (weighted + weighted.T) / 2  # symmetric against round-off
    _, vectors = torch.linalg.eigh(weighted)  # ascending eigenvalues
    top = vectors[:, -rank:].flip(1)  # (d, R) V_R, largest first
    return full @ top, top.T.contiguous()  # (d, R), (R, d)


def lowrank_operator(stats: BoundaryStats, rank: int, **options) -> torch.Tensor:
    """The dense equivalent W = I + U·V (d, d), float64, for errors and spectra."""
    left, right = lowrank_factors(stats, rank, **options)
    return torch.eye(stats.dim, dtype=left.dtype, device=left.device) + left @ right

"""Diagnostics of a boundary: spectra of Δ and of fit residuals, operator asymmetry, errors.

Everything is computed from `BoundaryStats` (no activations). An operator is passed as
(kind, matrix): kind "stream" for a full-stream W (Ghost, LinearPatch, identity) or "mlp"
for an MLP-branch T (ReplaceMe). Frames are tidy (one row per observation) for plotting.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import torch

from ghosted.solve import (
    mlp_branch_error,
    mlp_residual_gram,
    relative_error,
    residual_gram,
    stream_error,
)
from ghosted.stats import BoundaryStats

OperatorKind = Literal["stream", "mlp"]
Operators = dict[str, tuple[OperatorKind, torch.Tensor]]  # method name -> (kind, matrix)

PRUNED = "pruned"  # method label of the unpatched boundary (W = I, residual = Δ)


def delta_spectrum(stats: BoundaryStats) -> np.ndarray:
    """Singular values of Δ (descending): √eig(ΔᵀΔ), clamped at 0."""
    return _singular_values_from_gram(stats.dtd)


def residual_spectrum(stats: BoundaryStats, op: torch.Tensor,
                      kind: OperatorKind = "stream") -> np.ndarray:
    """Singular values (descending) of the fit residual Δ − X(W − I) or Δ − m(T − I)."""
    correction = op.to(stats.dtd) - torch.eye(stats.dim, dtype=stats.dtd.dtype,
                                              device=stats.dtd.device)  # (d, d)
    if kind == "stream":
        return _singular_values_from_gram(residual_gram(stats, correction))
    if kind == "mlp":
        return _singular_values_from_gram(mlp_residual_gram(stats, correction))
    raise ValueError(f"unknown operator kind {kind!r}; use 'stream' or 'mlp'")


def antisymmetric_share(matrix: torch.Tensor) -> dict[str, float]:
    """Share of M in its antisymmetric part A = (M − Mᵀ)/2.

    The paper's "47 %" does not say which ratio it is, so both are given:
    norm_ratio = ‖A‖_F / ‖M‖_F and energy_ratio = norm_ratio² (= ‖A‖²/‖M‖², since
    ‖M‖² = ‖S‖² + ‖A‖² for the symmetric part S). NaN for M = 0.
    """
    m = matrix.to(torch.float64)  # (d, d)
    total = float(torch.linalg.matrix_norm(m))
    if total == 0.0:
        return {"norm_ratio": float("nan"), "energy_ratio": float("nan")}
    antisym = float(torch.linalg.matrix_norm((m - m.T) / 2)) / total
    return {"norm_ratio": antisym, "energy_ratio": antisym**2}


def spectra_frame(stats: BoundaryStats, ops: Operators,
                  include_pruned: bool = True) -> pd.DataFrame:
    """Long frame (boundary, method, index, singular_value) of residual spectra per method.

    With include_pruned, the spectrum of Δ itself is added as method "pruned".
    """
    spectra = {PRUNED: delta_spectrum(stats)} if include_pruned else {}
    for name, (kind, matrix) in ops.items():
        spectra[name] = residual_spectrum(stats, matrix, kind)
    rows = [
        pd.DataFrame({"boundary": boundary_label(stats), "method": name,
                      "index": np.arange(len(values)), "singular_value": values})
        for name, values in spectra.items()
    ]
    return pd.concat(rows, ignore_index=True) if rows else _empty(
        ["boundary", "method", "index", "singular_value"])


def error_frame(fit_stats: BoundaryStats, heldout_stats: BoundaryStats | None,
                ops: Operators, include_pruned: bool = True) -> pd.DataFrame:
    """Boundary errors per method and split ("fit" / "heldout").

    Columns: boundary, method, split, error (‖XW − Y‖²), relative_error (error/‖Δ‖²) and
    removed_fraction (1 − relative_error, the share of the gap the patch closes).
    With include_pruned, the identity (no patch, relative error 1) is added as "pruned".
    """
    splits = {"fit": fit_stats} | ({"heldout": heldout_stats} if heldout_stats is not None else {})
    eye = torch.eye(fit_stats.dim, dtype=torch.float64)
    all_ops = ({PRUNED: ("stream", eye)} if include_pruned else {}) | dict(ops)
    rows = []
    for split, stats in splits.items():
        for name, (kind, matrix) in all_ops.items():
            error = _operator_error(stats, kind, matrix)
            rel = relative_error(stats, error)
            rows.append({"boundary": boundary_label(stats), "method": name, "split": split,
                         "error": error, "relative_error": rel, "removed_fraction": 1.0 - rel})
    columns = ["boundary", "method", "split", "error", "relative_error", "removed_fraction"]
    return pd.DataFrame(rows, columns=columns)


def boundary_label(stats: BoundaryStats) -> str:
    """Label of a boundary, e.g. "23-30" for removed layers [23, 30)."""
    return f"{stats.start}-{stats.end}"


def _operator_error(stats: BoundaryStats, kind: OperatorKind, matrix: torch.Tensor) -> float:
    if kind == "stream":
        return stream_error(stats, matrix)
    if kind == "mlp":
        return mlp_branch_error(stats, matrix)
    raise ValueError(f"unknown operator kind {kind!r}; use 'stream' or 'mlp'")


def _singular_values_from_gram(gram: torch.Tensor) -> np.ndarray:
    """√eig(G) descending, for a symmetric PSD Gram matrix G = AᵀA (round-off clamped at 0)."""
    eigenvalues = torch.linalg.eigvalsh(gram.to(torch.float64))  # (d,) ascending
    return eigenvalues.clamp_min(0).sqrt().flip(0).cpu().numpy()


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in columns})

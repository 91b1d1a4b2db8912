"""Residual analysis of fitted gaps from statistics alone: errors, spectra, asymmetry.

Every method's boundary map is summarised by the Gram matrix RᵀR of its residual R = (what the
next kept layer receives) − X_post over the calibration tokens, computed in closed form from the
float64 statistics, sink tokens included. Its trace is the boundary error; the square roots of its
eigenvalues are the residual's singular values. An operator alone can also be read: the spectrum of Δ or
of a fit residual (kind "stream" for a full-stream W, "mlp" for an MLP-branch T), and the share of a
matrix in its antisymmetric part.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ghosted.operators.assembly import GapFit
from ghosted.calibration.sinks import SinkMap
from ghosted.calibration.collect import gap_text
from ghosted.recovery.solvers import mlp_residual_gram, residual_gram
from ghosted.calibration.stats import BoundaryStats


def _y_gram(s: BoundaryStats) -> torch.Tensor:
    """YᵀY with Y = X + Δ."""
    return s.xtx + s.xtd + s.xtd.T + s.dtd


def sink_residual_gram(sink: BoundaryStats, smap: SinkMap) -> torch.Tensor:
    """RᵀR over sink tokens for R = f(X) − Y, f a constant or x·A + b."""
    n, c = sink.n_tokens, smap.constant.to(sink.xtx)  # c: (d,), on the statistics' device
    xty = sink.xtx + sink.xtd  # (d, d)
    gram = _y_gram(sink) + n * torch.outer(c, c) - torch.outer(c, sink.y_sum) - torch.outer(sink.y_sum, c)
    if smap.linear is not None:
        a = smap.linear.to(sink.xtx)  # (d, d)
        ax = a.T @ sink.x_sum  # (d,)
        gram = gram + a.T @ sink.xtx @ a - a.T @ xty - xty.T @ a + torch.outer(ax, c) + torch.outer(c, ax)
    return gram


def residual_gram_of(fit: GapFit | None, stats: BoundaryStats) -> torch.Tensor:
    """RᵀR of a gap's recovery (None: plain pruning, R = −Δ). The fit's maps are read on the statistics'
    device and dtype: a map solved from the CPU token sample (ReplaceMe-cosine) meets GPU statistics."""
    if fit is None:
        return stats.dtd
    eye = torch.eye(stats.dim, dtype=stats.dtd.dtype, device=stats.dtd.device)
    branch = None if fit.branch is None else fit.branch.to(eye)  # (d, d)
    stream = eye if fit.stream is None else fit.stream.to(eye)  # (d, d)
    if fit.sink_map is None:
        if branch is not None:
            return mlp_residual_gram(stats, branch - eye)
        return residual_gram(stats, stream - eye)
    clean = stats.without_sink()
    if branch is not None:
        ordinary = mlp_residual_gram(clean, branch - eye)
    else:
        ordinary = residual_gram(clean, stream - eye)
    return ordinary + sink_residual_gram(stats.sink_only(), fit.sink_map)


def singular_values(gram: torch.Tensor) -> np.ndarray:
    """√eig(G) descending, for a symmetric PSD Gram matrix G = AᵀA (round-off clamped at 0)."""
    return torch.linalg.eigvalsh(gram.double()).clamp_min(0).sqrt().flip(0).cpu().numpy()


def delta_spectrum(stats: BoundaryStats) -> np.ndarray:
    """Singular values of Δ (descending): √eig(ΔᵀΔ), clamped at 0."""
    return singular_values(stats.dtd)


def residual_spectrum(stats: BoundaryStats, op: torch.Tensor, kind: str = "stream") -> np.ndarray:
    """Singular values (descending) of the fit residual Δ − X(W − I) (kind "stream") or Δ − m(T − I) ("mlp")."""
    correction = op.to(stats.dtd) - torch.eye(stats.dim, dtype=stats.dtd.dtype,
                                              device=stats.dtd.device)  # (d, d)
    if kind == "stream":
        return singular_values(residual_gram(stats, correction))
    if kind == "mlp":
        return singular_values(mlp_residual_gram(stats, correction))
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


def error_rows(method: str, gap, fit: GapFit | None, stats: BoundaryStats, split: str) -> dict:
    """One row of the error frame: absolute and relative boundary error, share of ‖Δ‖² removed, ‖Δ‖²."""
    error = float(torch.trace(residual_gram_of(fit, stats)).clamp_min(0))
    delta = float(torch.trace(stats.dtd))
    rel = error / delta if delta > 0 else float("nan")
    return {"gap": gap_text(gap), "method": method, "split": split, "error": error,
            "relative_error": rel, "removed_fraction": 1.0 - rel, "tokens": stats.n_tokens, "delta_sq": delta}


def spectrum_frame(method: str, gap, fit: GapFit | None, stats: BoundaryStats) -> pd.DataFrame:
    values = singular_values(residual_gram_of(fit, stats))
    return pd.DataFrame({"gap": gap_text(gap), "method": method,
                         "index": np.arange(len(values)), "singular_value": values})


def asymmetry_row(method: str, gap, weight: torch.Tensor) -> dict:
    eye = torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device)
    return {"method": method, "gap": gap_text(gap), **antisymmetric_share(weight - eye)}


def token_share_frame(stats: BoundaryStats) -> pd.DataFrame:
    """Share of ‖Δ‖² carried by sink tokens vs the others, per gap (for the app's explanation)."""
    if stats.sink is None:
        return pd.DataFrame()
    total, sink = float(torch.trace(stats.dtd)), float(torch.trace(stats.sink.dtd))
    return pd.DataFrame([
        {"gap": gap_text(stats), "tokens": "sink", "count": stats.sink.n_tokens,
         "delta_share": sink / total, "per_token_share": sink / total / max(stats.sink.n_tokens, 1)},
        {"gap": gap_text(stats), "tokens": "other", "count": stats.n_tokens - stats.sink.n_tokens,
         "delta_share": 1 - sink / total,
         "per_token_share": (1 - sink / total) / max(stats.n_tokens - stats.sink.n_tokens, 1)},
    ])


def position_share_frame(stats: BoundaryStats) -> pd.DataFrame:
    """Per window position: its share of ‖Δ‖² and the RMS norm of Δ there (where the mismatch sits)."""
    if stats.position_dtd is None or not len(stats.position_dtd):
        return pd.DataFrame()
    dtd, count = stats.position_dtd.double().cpu(), stats.position_tokens.double().cpu()  # (T,), (T,)
    total = float(dtd.sum())
    return pd.DataFrame({"gap": gap_text(stats), "position": np.arange(len(dtd)),
                         "delta_share": (dtd / total).numpy() if total > 0 else np.nan,
                         "rms_delta": (dtd / count.clamp_min(1)).sqrt().numpy(), "tokens": count.numpy()})


def sink_spectra_frame(stats: BoundaryStats) -> pd.DataFrame:
    """Singular values of Δ over all tokens, without the sink tokens, and over the sinks alone."""
    if stats.sink is None:
        return pd.DataFrame()
    grams = {"all tokens": stats.dtd, "without sinks": stats.dtd - stats.sink.dtd, "sinks only": stats.sink.dtd}
    return pd.concat([pd.DataFrame({"gap": gap_text(stats), "tokens": name,
                                    "index": np.arange(stats.dim), "singular_value": singular_values(gram)})
                      for name, gram in grams.items()], ignore_index=True)


def removed_shares(errors: pd.DataFrame) -> pd.DataFrame:
    """Share of ‖Δ‖² each method removes over all its gaps: 1 − (total boundary error) / (total ‖Δ‖²).

    ``errors`` is ``RecoveryRun.errors()`` (rows "pruned" hold ‖Δ‖² per gap and split). Errors add over
    gaps, so the run's total is the sum of each gap's error over the sum of each gap's ‖Δ‖² (the plainly
    pruned model's), not a mean of the per-gap shares. One row per fitted method (in the frame's order),
    one column per split present ("fit", "heldout"); 1 = every gap fully restored, 0 = plain pruning.
    """
    from ghosted.recovery.methods import BASELINE_METHOD, label_of

    pruned = label_of(BASELINE_METHOD)  # the plainly pruned model's rows
    delta = errors[errors.method == pruned].set_index(["gap", "split"]).error  # ‖Δ‖² per gap
    frame = errors[errors.method != pruned]
    sums = frame.groupby(["method", "split"], sort=False).error.sum()
    totals = frame.drop_duplicates(["method", "gap", "split"]).join(
        delta.rename("delta"), on=["gap", "split"]).groupby(["method", "split"], sort=False).delta.sum()
    removed = (1 - sums / totals).rename("removed").reset_index()
    table = removed.pivot(index="method", columns="split", values="removed")
    return table.reindex(list(dict.fromkeys(frame.method))).reset_index()


def directions_holding(singular_values, share: float = 0.9) -> int:
    """How many leading directions carry ``share`` of the energy Σσ² (σ sorted largest first).

    Small against the width: the discrepancy is concentrated in a few directions; near it: spread out.
    """
    values = np.sort(np.asarray(singular_values, dtype=np.float64))[::-1]
    energy = np.cumsum(values**2) / max(float((values**2).sum()), 1e-300)
    return int((energy < share).sum()) + 1

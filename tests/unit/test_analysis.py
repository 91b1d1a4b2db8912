"""Spectra, asymmetry and error frames computed from statistics match direct computations."""
from __future__ import annotations

import math

import numpy as np
import torch

from ghosted.analysis import (
    antisymmetric_share,
    delta_spectrum,
    error_frame,
    residual_spectrum,
    spectra_frame,
)
from ghosted.solve import ghost_operator, linearpatch_operator, replaceme_ls
from ghosted.stats import BoundaryAccumulator, BoundaryStats

D = 8


def boundary(seed: int = 0, n: int = 240) -> tuple[BoundaryStats, tuple[torch.Tensor, ...]]:
    """Statistics and rows (x, y, m) of a fixed synthetic boundary (m = X·P); seed picks tokens."""
    maps = torch.Generator().manual_seed(100)
    w = torch.eye(D) + 0.3 * torch.randn(D, D, generator=maps, dtype=torch.float64)
    p = torch.randn(D, D, generator=maps, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=gen, dtype=torch.float64) * torch.logspace(0, 1, D)
    y = x @ w + 0.2 * torch.randn(n, D, generator=gen, dtype=torch.float64)
    m = x @ p
    acc = BoundaryAccumulator(23, 30, D, with_mlp=True)
    shape = (4, n // 4, D)
    acc.update(x.reshape(shape), y.reshape(shape), torch.ones(shape[:2], dtype=torch.bool),
               m=m.reshape(shape))
    return acc.finalize(), (x, y, m)


def numpy_singular_values(a: torch.Tensor) -> np.ndarray:
    return np.linalg.svd(a.numpy(), compute_uv=False)


def test_delta_spectrum_equals_numpy_svd():
    stats, (x, y, _) = boundary()
    expected = numpy_singular_values(y - x)
    np.testing.assert_allclose(delta_spectrum(stats), expected, rtol=1e-8, atol=1e-8 * expected[0])


def test_residual_spectrum_equals_numpy_svd():
    stats, (x, y, m) = boundary()
    w, t = ghost_operator(stats), replaceme_ls(stats)
    eye = torch.eye(D, dtype=torch.float64)
    stream_expected = numpy_singular_values(y - x - x @ (w - eye))
    mlp_expected = numpy_singular_values(y - x - m @ (t - eye))
    got_stream, got_mlp = residual_spectrum(stats, w), residual_spectrum(stats, t, kind="mlp")
    np.testing.assert_allclose(got_stream, stream_expected, atol=1e-6 * stream_expected[0])
    np.testing.assert_allclose(got_mlp, mlp_expected, atol=1e-6 * mlp_expected[0])
    assert np.all(np.diff(got_stream) <= 0)  # descending


def test_antisymmetric_share_extremes():
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(D, D, generator=gen, dtype=torch.float64)
    assert antisymmetric_share(a + a.T)["norm_ratio"] == 0.0
    share = antisymmetric_share(a - a.T)
    assert math.isclose(share["norm_ratio"], 1.0) and math.isclose(share["energy_ratio"], 1.0)
    mixed = antisymmetric_share(a)
    assert math.isclose(mixed["energy_ratio"], mixed["norm_ratio"] ** 2)
    assert math.isnan(antisymmetric_share(torch.zeros(D, D))["norm_ratio"])


def operators(stats: BoundaryStats) -> dict:
    return {
        "ghost": ("stream", ghost_operator(stats)),
        "linearpatch": ("stream", linearpatch_operator(stats, rotate=True)),
        "replaceme_ls": ("mlp", replaceme_ls(stats)),
    }


def test_spectra_frame_is_tidy():
    stats, _ = boundary()
    frame = spectra_frame(stats, operators(stats))
    assert list(frame.columns) == ["boundary", "method", "index", "singular_value"]
    assert len(frame) == 4 * D  # pruned + three methods
    assert set(frame["boundary"]) == {"23-30"}
    pruned = frame[frame["method"] == "pruned"]["singular_value"].to_numpy()
    np.testing.assert_allclose(pruned, delta_spectrum(stats))


def test_error_frame_fit_and_heldout():
    fit, _ = boundary(seed=0)
    heldout, _ = boundary(seed=9)  # same boundary, other tokens
    frame = error_frame(fit, heldout, operators(fit))
    columns = ["boundary", "method", "split", "error", "relative_error", "removed_fraction"]
    assert list(frame.columns) == columns
    assert len(frame) == 2 * 4  # two splits × (pruned + three methods)
    pruned = frame[frame["method"] == "pruned"]
    np.testing.assert_allclose(pruned["relative_error"], 1.0)
    np.testing.assert_allclose(frame["removed_fraction"], 1.0 - frame["relative_error"])
    fit_rows = frame[frame["split"] == "fit"].set_index("method")["error"]
    assert fit_rows["ghost"] <= fit_rows.min() * (1 + 1e-9)
    heldout_rows = frame[frame["split"] == "heldout"].set_index("method")
    assert heldout_rows.loc["ghost", "removed_fraction"] > 0.5  # generalises to new tokens
    only_fit = error_frame(fit, None, operators(fit), include_pruned=False)
    assert set(only_fit["split"]) == {"fit"} and len(only_fit) == 3

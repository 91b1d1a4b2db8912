"""Spectra and asymmetry computed from statistics match direct computations."""
from __future__ import annotations

import math

import numpy as np
import torch

from ghosted.recovery.diagnostics import antisymmetric_share, delta_spectrum, residual_spectrum
from ghosted.recovery.solvers import ghost_operator, replaceme_ls
from ghosted.calibration.stats import BoundaryAccumulator, BoundaryStats

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

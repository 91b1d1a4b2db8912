"""Closed-form recovery operators and boundary errors from statistics."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ghosted.core.hadamard import normalized_hadamard
from ghosted.recovery.solvers import (
    cosine_loss,
    ghost_operator,
    linearpatch_operator,
    mlp_branch_error,
    relative_error,
    replaceme_cosine,
    replaceme_ls,
    stream_error,
)
from ghosted.calibration.stats import BoundaryAccumulator, BoundaryStats

D = 12  # tiny hidden size whose Hadamard is a Paley matrix


def stats_of(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor | None = None,
             sequences: int = 4, reservoir_tokens: int = 0) -> BoundaryStats:
    """Statistics of token rows (N, d), split into `sequences` equal sequences."""
    n, d = x.shape
    shape = (sequences, n // sequences, d)
    acc = BoundaryAccumulator(2, 4, d, with_mlp=m is not None, reservoir_tokens=reservoir_tokens)
    valid = torch.ones(shape[:2], dtype=torch.bool)
    acc.update(x.reshape(shape), y.reshape(shape), valid,
               m=None if m is None else m.reshape(shape))
    return acc.finalize()


def synthetic(n: int = 400, d: int = D, noise: float = 0.1, seed: int = 0):
    """X with unequal channel scales, a non-symmetric true map, and m = X·P."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.logspace(0, 1, d)
    w_true = torch.eye(d) + 0.3 * torch.randn(d, d, generator=gen, dtype=torch.float64)
    y = x @ w_true + noise * torch.randn(n, d, generator=gen, dtype=torch.float64)
    m = x @ torch.randn(d, d, generator=gen, dtype=torch.float64) / d**0.5
    return x, y, m, w_true


def test_ghost_equals_numpy_lstsq():
    x, y, _, _ = synthetic()
    expected = np.linalg.lstsq(x.numpy(), y.numpy(), rcond=None)[0]
    for solver in ("solve", "pinv"):
        w = ghost_operator(stats_of(x, y), solver=solver)
        assert w.dtype == torch.float64
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-7, atol=1e-9)


def test_ghost_recovers_a_known_map_without_noise():
    x, _, _, w_true = synthetic(noise=0.0)
    for solver in ("solve", "pinv"):
        w = ghost_operator(stats_of(x, x @ w_true), solver=solver)
        torch.testing.assert_close(w, w_true, rtol=0, atol=1e-8)


def test_ghost_is_identity_on_unexcited_directions():
    gen = torch.Generator().manual_seed(1)
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64)).Q  # (d, d)
    excited, unexcited = basis[:, :5], basis[:, 5:]  # (d, 5), (d, d-5)
    x = torch.randn(200, 5, generator=gen, dtype=torch.float64) @ excited.T * 3  # (N, d), rank 5
    y = x @ (torch.eye(D) + torch.randn(D, D, generator=gen, dtype=torch.float64))  # (N, d)
    stats = stats_of(x, y)
    exact = ghost_operator(stats, solver="pinv")
    ridge = ghost_operator(stats, solver="solve")
    torch.testing.assert_close(unexcited.T @ exact, unexcited.T, rtol=0, atol=1e-10)
    torch.testing.assert_close(unexcited.T @ ridge, unexcited.T, rtol=0, atol=1e-5)
    for w in (exact, ridge):  # and still fits what the calibration does excite
        assert stream_error(stats, w) < 1e-8 * float(torch.trace(stats.dtd))


def test_error_from_stats_equals_direct_error():
    x, y, m, _ = synthetic()
    stats = stats_of(x, y, m)
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(D, D, generator=gen, dtype=torch.float64)
    t = torch.randn(D, D, generator=gen, dtype=torch.float64)
    direct_stream = float(((x @ w - y) ** 2).sum())
    direct_mlp = float(((x + m @ (t - torch.eye(D)) - y) ** 2).sum())
    assert stream_error(stats, w) == pytest.approx(direct_stream, rel=1e-10)
    assert mlp_branch_error(stats, t) == pytest.approx(direct_mlp, rel=1e-10)
    identity_error = stream_error(stats, torch.eye(D))
    assert relative_error(stats, identity_error) == pytest.approx(1.0, rel=1e-12)


def test_ghost_beats_every_constrained_family():
    """m = X·P makes the MLP-branch family a subset of the full-stream one, so ghost ≤ all."""
    x, y, m, _ = synthetic()
    stats = stats_of(x, y, m)
    ghost = stream_error(stats, ghost_operator(stats, solver="pinv"))
    gen = torch.Generator().manual_seed(3)
    h = normalized_hadamard(D)
    random_diag = torch.diag(torch.rand(D, generator=gen, dtype=torch.float64) + 0.5)
    competitors = {
        "identity": stream_error(stats, torch.eye(D)),
        "lp_diag": stream_error(stats, linearpatch_operator(stats, rotate=False)),
        "lp_rotate": stream_error(stats, linearpatch_operator(stats, rotate=True)),
        "random_diag": stream_error(stats, random_diag),
        "random_hdh": stream_error(stats, h @ random_diag @ h.T),
        "replaceme_ls": mlp_branch_error(stats, replaceme_ls(stats)),
    }
    for name, error in competitors.items():  # relative slack only for float64 round-off
        assert ghost <= error * (1 + 1e-9), name
    assert ghost < 0.5 * competitors["lp_rotate"]  # and the gap is real, not round-off


def test_linearpatch_operator_shapes():
    x, y, _, _ = synthetic()
    stats = stats_of(x, y)
    scale = stats.lp_rot_ratio_sum / stats.n_samples
    rotate = linearpatch_operator(stats, rotate=True)
    torch.testing.assert_close(rotate, rotate.T)  # symmetric by construction
    torch.testing.assert_close(torch.linalg.eigvalsh(rotate), scale.sort().values)
    diag = linearpatch_operator(stats, rotate=False)
    torch.testing.assert_close(diag, torch.diag(stats.lp_ratio_sum / stats.n_samples))


def test_replaceme_ls_equals_numpy_lstsq():
    x, y, m, _ = synthetic()
    expected = np.linalg.lstsq(m.numpy(), (y - x + m).numpy(), rcond=None)[0]
    t = replaceme_ls(stats_of(x, y, m))
    np.testing.assert_allclose(t.numpy(), expected, rtol=1e-7, atol=1e-9)


def test_replaceme_ls_falls_back_when_singular():
    x, y, m, _ = synthetic()
    m[:, 3] = 0.0  # channel 3 never excited: mᵀm singular
    stats = stats_of(x, y, m)
    with pytest.warns(RuntimeWarning, match="singular"):
        t = replaceme_ls(stats)
    assert torch.isfinite(t).all()
    expected = np.linalg.lstsq(m.numpy(), (y - x + m).numpy(), rcond=None)[0]
    direct = float(((m.numpy() @ expected - (y - x + m).numpy()) ** 2).sum())
    assert mlp_branch_error(stats, t) == pytest.approx(direct, rel=1e-8)
    ridge = replaceme_ls(stats, ridge=1e-3)  # a ridge makes it solvable again
    assert torch.isfinite(ridge).all()


def test_replaceme_cosine_improves_and_is_deterministic():
    gen = torch.Generator().manual_seed(4)
    m = torch.randn(256, 8, generator=gen)  # (N, d)
    target = m @ (torch.eye(8) + torch.randn(8, 8, generator=gen))  # (N, d)
    kwargs = dict(epochs=4, lr=1e-2, batch_tokens=64, seed=5)
    t = replaceme_cosine(m, target, **kwargs)
    assert t.dtype == torch.float64
    assert cosine_loss(m, target, t.float()) < cosine_loss(m, target, torch.eye(8)) - 0.05
    assert torch.equal(t, replaceme_cosine(m, target, **kwargs))  # seeded determinism (same machine, same thread count)


def test_replaceme_cosine_runs_on_the_stats_reservoir():
    x, y, m, _ = synthetic(n=96)
    sample = stats_of(x, y, m, reservoir_tokens=32).replaceme_samples
    t = replaceme_cosine(sample.m, sample.target, epochs=1)
    assert t.shape == (D, D)


def test_errors_need_mlp_stats_and_known_solver():
    x, y, _, _ = synthetic()
    stats = stats_of(x, y)
    with pytest.raises(ValueError, match="with_mlp"):
        replaceme_ls(stats)
    with pytest.raises(ValueError, match="solver"):
        ghost_operator(stats, solver="qr")

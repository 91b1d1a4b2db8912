"""Hadamard matrices: H·Hᵀ = n·I for the hidden sizes of real models, clear errors otherwise."""
from __future__ import annotations

import pytest
import torch

from ghosted.core.hadamard import _factorisation, hadamard, has_hadamard, normalized_hadamard

PALEY_CORES = [1, 12, 20, 28, 36, 40, 44, 52, 60]  # 28, 52: Paley II over GF(13), GF(25)
MODEL_SIZES = [576, 640, 896, 960, 1536]  # checked with a full H·Hᵀ product
LARGE_SIZES = [2048, 2560, 3072, 4096, 5120]  # checked through their Kronecker structure


def assert_hadamard(h: torch.Tensor) -> None:
    n = h.shape[0]
    hf = h.to(torch.float32)  # ±1 sums up to n are exact in float32
    assert torch.equal(hf.abs(), torch.ones(n, n))
    assert torch.equal(hf @ hf.T, n * torch.eye(n))


@pytest.mark.parametrize("n", PALEY_CORES + [2, 4, 8, 24, 48, 100, 196])
def test_small_orders_are_hadamard(n):
    assert_hadamard(hadamard(n))


@pytest.mark.parametrize("n", MODEL_SIZES)
def test_model_sizes_are_hadamard(n):
    assert_hadamard(hadamard(n))


@pytest.mark.parametrize("n", LARGE_SIZES)
def test_large_sizes_are_kronecker_of_hadamard_factors(n):
    """(A⊗B)(A⊗B)ᵀ = AAᵀ⊗BBᵀ, so exact factors prove the property; sampled rows double-check."""
    q, power = _factorisation(n)
    h = hadamard(n, torch.float32)  # (n, n)
    assert_hadamard(hadamard(q))
    assert torch.equal(h, torch.kron(hadamard(q, torch.float32), hadamard(power, torch.float32)))
    rows = torch.randperm(n)[:64]
    assert torch.equal(h[rows] @ h.T, n * torch.eye(n)[rows])


def test_power_of_two_factor_is_plain_sylvester():
    h = hadamard(2**8)
    assert torch.equal(h, h.T)  # Sylvester matrices are symmetric
    assert _factorisation(4096) == (1, 4096)


def test_normalized_is_orthogonal_and_results_are_fresh_copies():
    hn = normalized_hadamard(12)
    torch.testing.assert_close(hn @ hn.T, torch.eye(12, dtype=torch.float64))
    hn.zero_()
    assert normalized_hadamard(12).abs().sum() > 0
    assert hadamard(12, torch.float32).dtype == torch.float32


@pytest.mark.parametrize("n", [0, 3, 6, 10, 92])
def test_impossible_order_names_n(n):
    assert not has_hadamard(n)
    with pytest.raises(ValueError, match=f"n={n}"):
        hadamard(n)

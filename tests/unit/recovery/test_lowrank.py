"""Low-rank ghost: the reduced-rank optimum against brute force, its operator, export and KV cache."""

import types

import numpy as np
import pytest
import torch

from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.models.loading import read_recipe
from ghosted.recovery.lowrank import default_rank, lowrank_factors, lowrank_operator
from ghosted.operators.modules import LowRankOperator
from ghosted.operators.sites import operators_of
from ghosted.recovery.fitting import METHODS, RecoveryConfig, recover
from ghosted.recovery.solvers import ghost_operator
from ghosted.calibration.stats import BoundaryAccumulator
from tests.tiny import random_ids, tiny_model


def problem(d: int, n: int = 40, seed: int = 0):
    """Random X (n, d) and Y = X·W_true + noise, and their statistics."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = x @ torch.randn(d, d, generator=gen, dtype=torch.float64) + 0.1 * torch.randn(n, d, generator=gen,
                                                                                         dtype=torch.float64)
    acc = BoundaryAccumulator(0, 1, d, with_mlp=False, lp=False)
    acc.update(x[None], y[None], torch.ones(1, n, dtype=torch.bool))
    return x, y - x, acc.finalize()


def objective(x, delta, m, eps):
    return float(((x @ m - delta) ** 2).sum() + eps * (m**2).sum())


def best_by_gradient_descent(x, delta, rank, eps, starts=6, steps=800, seed=0):
    """The lowest objective over many random rank-R factorisations U·V, each refined by Adam."""
    gen = torch.Generator().manual_seed(seed)
    best = np.inf
    for _ in range(starts):
        u = torch.randn(x.shape[1], rank, generator=gen, dtype=torch.float64).requires_grad_(True)
        v = torch.randn(rank, x.shape[1], generator=gen, dtype=torch.float64).requires_grad_(True)
        opt = torch.optim.Adam([u, v], lr=0.05)
        for _ in range(steps):
            opt.zero_grad()
            loss = ((x @ (u @ v) - delta) ** 2).sum() + eps * ((u @ v) ** 2).sum()
            loss.backward()
            opt.step()
        best = min(best, objective(x, delta, (u @ v).detach(), eps))
    return best


@pytest.mark.parametrize("d, rank, eps", [(4, 1, 1e-6), (5, 2, 0.5), (6, 3, 1e-6)])
def test_closed_form_is_the_rank_constrained_optimum(d, rank, eps):
    x, delta, stats = problem(d)
    left, right = lowrank_factors(stats, rank, eps=eps)
    closed = objective(x, delta, left @ right, eps)
    searched = best_by_gradient_descent(x, delta, rank, eps)
    assert closed <= searched * (1 + 1e-6) + 1e-9  # no factorisation found does better
    assert closed == pytest.approx(searched, rel=1e-3)  # and the search reaches it
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):  # nor does any rank-R map whose factors are perturbed around the optimum
        u = left + 0.05 * torch.randn(d, rank, generator=gen, dtype=torch.float64)
        v = right + 0.05 * torch.randn(rank, d, generator=gen, dtype=torch.float64)
        assert objective(x, delta, u @ v, eps) >= closed - 1e-9


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_without_ridge_it_truncates_the_svd_of_the_explicit_token_matrix(rank):
    x, delta, stats = problem(6, seed=rank)
    full = np.linalg.lstsq(x.numpy(), delta.numpy(), rcond=None)[0]  # (d, d) M_full
    _, _, vt = np.linalg.svd(x.numpy() @ full)  # right singular vectors of X·M_full
    expected = full @ vt[:rank].T @ vt[:rank]
    left, right = lowrank_factors(stats, rank, eps=0.0)
    np.testing.assert_allclose((left @ right).numpy(), expected, atol=1e-8)


def test_full_rank_equals_ghost_and_parameters_are_2dR():
    _, _, stats = problem(6)
    torch.testing.assert_close(lowrank_operator(stats, 6), ghost_operator(stats), rtol=1e-9, atol=1e-9)
    left, right = lowrank_factors(stats, 2)
    op = LowRankOperator(left, right)
    assert sum(p.numel() for p in op.parameters()) == 2 * 6 * 2
    h = torch.randn(2, 3, 6)
    torch.testing.assert_close(op(h), (h.double() @ op.dense()).float(), rtol=1e-5, atol=1e-5)
    assert default_rank(576) == 144 and default_rank(3) == 1
    with pytest.raises(ValueError, match="rank"):
        lowrank_factors(stats, 7)


def windows(n=8, t=24, seed=0):
    ids = random_ids(n, t, seed)
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})


def test_recover_lowrank_full_rank_matches_ghost_and_beats_nothing():
    model = tiny_model("llama")
    run = recover(model, "2-3", ["none", "ghost", "ghost-lowrank"], windows(), config=RecoveryConfig(rank=32))
    ids = random_ids(2, 16, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(run.results["ghost-lowrank"].model(ids).logits,
                                   run.results["ghost"].model(ids).logits, rtol=1e-4, atol=1e-4)
    low = recover(model, "2-3", ["ghost-lowrank"], windows(), config=RecoveryConfig(rank=4))
    ops = [op for _, _, op in operators_of(low.results["ghost-lowrank"].model)]
    assert len(ops) == 1 and isinstance(ops[0], LowRankOperator) and ops[0].rank == 4
    errors = low.errors()
    assert errors.query("method == 'ghost-lowrank' and split == 'fit'").relative_error.iloc[0] < 1.0


def test_lowrank_generates_with_kv_cache_and_round_trips(tmp_path):
    model = tiny_model("llama")
    run = recover(model, "2-3", ["ghost-lowrank"], windows(), config=RecoveryConfig(rank=3))
    recovered = run.results["ghost-lowrank"].model
    ids = random_ids(1, 6, seed=7)
    cached = recovered.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                use_cache=True)
    plain = recovered.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                               use_cache=False)
    assert torch.equal(cached, plain)
    folder = save_recovered(recovered, tmp_path / "lr", recipe=run)
    loaded = load_recovered(folder, device="cpu").model
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, recovered(ids).logits)
    entry = read_recipe(folder)["operators"][0]
    assert entry["kind"] == "lowrank" and entry["rank"] == 3 and entry["dim"] == 32
    assert "ghost-lowrank" in METHODS


def test_robust_lowrank_full_rank_matches_ghost_robust_and_round_trips(tmp_path):
    model = tiny_model("llama")
    calib, held = windows(), windows(4, seed=2)
    full = recover(model, "2-3", ["ghost-robust", "ghost-lowrank-robust"], calib, held,
                   RecoveryConfig(rank=32, sink_map="affine"))
    ids = random_ids(2, 16, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(full.results["ghost-lowrank-robust"].model(ids).logits,
                                   full.results["ghost-robust"].model(ids).logits, rtol=1e-4, atol=1e-4)
    run = recover(model, "2-3", ["ghost-lowrank-robust"], calib, held, RecoveryConfig(rank=3))
    recovered = run.results["ghost-lowrank-robust"].model
    prompt = random_ids(1, 6, seed=7)
    mask = torch.ones_like(prompt)
    assert torch.equal(recovered.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False),
                       recovered.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                          use_cache=False))
    folder = save_recovered(recovered, tmp_path / "rlr", recipe=run)
    loaded = load_recovered(folder, device="cpu").model
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, recovered(ids).logits)
    entry = read_recipe(folder)["operators"][0]
    assert entry["kind"] == "robust-lowrank" and entry["rank"] == 3 and "sink_rule" in entry

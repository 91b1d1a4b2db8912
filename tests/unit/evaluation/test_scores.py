"""Per-window scores against a direct computation: NLL, KL from the reference, top-1 agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ghosted.evaluation.scores import Reference, WindowScores, score_logits, summarize


def direct(ref_logits, logits, ids, mask):
    """Token by token, in float64: KL(p_ref || p), agreement of argmaxes, NLL of the target."""
    kl, agree, nll = np.zeros(ids.size(0)), np.zeros(ids.size(0)), np.zeros(ids.size(0))
    for b in range(ids.size(0)):
        for t in range(ids.size(1) - 1):
            if not mask[b, t + 1]:
                continue
            p = torch.softmax(ref_logits[b, t].double(), -1)
            q = torch.softmax(logits[b, t].double(), -1)
            kl[b] += float((p * (p.log() - q.log())).sum())
            agree[b] += float(p.argmax() == q.argmax())
            nll[b] -= float(q[ids[b, t + 1]].log())
    return kl, agree, nll


def test_kl_agreement_and_nll_match_a_direct_computation():
    gen = torch.Generator().manual_seed(0)
    B, T, V = 3, 9, 50
    ref_logits = 3 * torch.randn(B, T, V, generator=gen)
    logits = ref_logits + torch.randn(B, T, V, generator=gen)  # close to the reference: some agreement
    ids = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0  # padding is not scored
    _, ref_lp = score_logits(ref_logits, ids, mask)
    got, _ = score_logits(logits, ids, mask, Reference.of(ref_lp))
    kl, agree, nll = direct(ref_logits, logits, ids, mask)
    assert got.tokens.tolist() == [8, 5, 8]
    np.testing.assert_allclose(got.kl, kl, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got.agree, agree)
    np.testing.assert_allclose(got.nll, nll, rtol=1e-5)
    assert 0 < agree.sum() < got.tokens.sum()


def test_nll_equals_cross_entropy():
    gen = torch.Generator().manual_seed(1)
    logits, ids = torch.randn(2, 7, 30, generator=gen), torch.randint(0, 30, (2, 7), generator=gen)
    got, _ = score_logits(logits, ids, None)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 30), ids[:, 1:].reshape(-1), reduction="sum")
    assert got.total_nll == pytest.approx(float(expected), rel=1e-6)
    assert got.kl is None and got.total_tokens == 12


def test_summary_fields():
    scores = {name: WindowScores(np.array(nll), np.array([10, 10, 10]), np.array(kl), np.array([9.0, 8, 10]))
              for name, nll, kl in [("dense", [20.0, 25, 22], [0.0, 0, 0]), ("none", [30.0, 38, 33], [5.0, 6, 5]),
                                    ("ghost", [25.0, 30, 27], [2.0, 3, 2])]}
    out = summarize(scores)
    assert set(out["dense"]) >= {"ppl_low", "ppl_high", "kl", "top1", "d_none", "d_ghost_significant"}
    assert out["ghost"]["d_none"] == pytest.approx(np.exp(82 / 30) - np.exp(101 / 30))
    assert out["ghost"]["d_none_significant"] is True and "d_ghost" not in out["ghost"]
    assert out["none"]["kl"] == pytest.approx(16 / 30) and out["none"]["top1"] == pytest.approx(0.9)

"""ghost-auto decides with its uncertainty: the simpler candidate unless a more complex one's held-out
gain is significant on its paired interval, and too little held-out text keeps no operator."""

from __future__ import annotations

import types

import numpy as np
import torch

from ghosted.evaluation.scores import WindowScores
from ghosted.recovery.auto import MIN_HELDOUT_WINDOWS, decide
from ghosted.recovery.fitting import recover
from tests.tiny import random_ids, tiny_model


def scores(per_token_nll) -> WindowScores:
    nll = np.asarray(per_token_nll, dtype=float)
    return WindowScores(nll * 100, np.full(len(nll), 100))


def test_a_clear_gain_is_taken_and_a_noisy_one_is_not():
    rng = np.random.default_rng(0)
    base = rng.normal(4.0, 0.3, 12)
    trials = {"none": scores(base), "paper": scores(base - 0.2 + rng.normal(0, 0.01, 12)),  # clear gain
              "robust": scores(base - 0.2 + rng.normal(0, 0.3, 12))}  # about as good, but noisy
    pick, fields = decide(trials)
    assert pick == "paper"
    assert fields["gain_paper_against"] == "none" and fields["gain_paper_high"] < 0
    assert fields["gain_robust_against"] == "paper" and fields["gain_robust_low"] < 0 < fields["gain_robust_high"]


def test_a_lower_mean_that_is_not_significant_keeps_the_simpler():
    rng = np.random.default_rng(1)
    base = rng.normal(4.0, 0.3, 8)
    trials = {"none": scores(base), "paper": scores(base + rng.normal(-0.01, 0.2, 8)),
              "robust": scores(base + rng.normal(-0.01, 0.2, 8))}
    pick, fields = decide(trials)
    assert pick == "none"
    assert fields["gain_paper_low"] < 0 < fields["gain_paper_high"]


def test_too_little_heldout_text_keeps_no_operator_and_says_so():
    trials = {c: scores([4.0 - d] * (MIN_HELDOUT_WINDOWS - 1)) for c, d in
              (("none", 0.0), ("paper", 0.5), ("robust", 1.0))}
    pick, fields = decide(trials)
    assert pick == "none" and fields["gain_robust_low"] is None
    model = tiny_model("llama", layers=6)
    ids = random_ids(8, 16, 0)
    calib = types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})
    held_ids = random_ids(2, 16, 1)
    held = types.SimpleNamespace(input_ids=held_ids, attention_mask=torch.ones_like(held_ids), protocol={})
    run = recover(model, "2-3", ["none", "ghost-auto"], calib, held)
    (row,) = run.results["ghost-auto"].choices
    assert row["chosen"] == "none" and "too little held-out text" in row["reason"]
    assert run.results["ghost-auto"].fits == {}


def test_the_whole_set_is_put_to_the_test_each_gap_passed(monkeypatch):
    """Many small gaps, none significant alone (every gap kept no operator), while the paper's fit at
    every gap is significantly better on the held-out windows: the paper's fit everywhere is kept and each
    row says why. A gain that is not significant for the whole set leaves the choices as they were."""
    from ghosted.recovery import auto

    rng = np.random.default_rng(2)
    base = rng.normal(4.0, 0.3, 12)
    paper_fits = {"gap": "the paper's operator"}
    for shift, replaced in ((-0.2, True), (0.0, False)):
        paper = scores(base + shift + rng.normal(0, 0.01 if replaced else 0.2, 12))
        monkeypatch.setattr(auto, "_heldout", lambda ctx, fits, name, paper=paper: paper)
        rows = [{"chosen": "none", "reason": "gap"} for _ in range(3)]
        fits, note = auto._auto_safeguard(None, "ghost-auto", {}, rows, scores(base), "the paper's fit everywhere",
                                          lambda: paper_fits)
        if replaced:
            assert fits == paper_fits and "the paper's fit everywhere" in note
            assert all(r["chosen"] == "paper" and "replaced" in r["reason"] for r in rows)
        else:
            assert fits == {} and note == "" and all(r["chosen"] == "none" for r in rows)

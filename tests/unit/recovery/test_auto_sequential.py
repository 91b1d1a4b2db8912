"""ghost-auto in sequential mode (each gap's candidates fitted on the model patched upstream), and
--ghost-mode sequential never silently ignored, on a tiny model with three gaps."""

from __future__ import annotations

import types

import pytest
import torch

from ghosted.recovery import methods as registry
from ghosted.calibration.collect import Gap
from ghosted.evaluation.perplexity import perplexity
from ghosted.recovery.auto import AUTO_CANDIDATES
from ghosted.recovery.fitting import RecoveryConfig, recover
from tests.tiny import random_ids, tiny_model
from tests.tolerance import TINY_MODEL_TOL

DROP = "1,3-4"  # three layer gaps: 1-2, 3-4, 4-5
SEQUENTIAL = RecoveryConfig(ghost_mode="sequential")


def windows(n: int, seed: int, length: int = 24):
    ids = random_ids(n, length, seed)
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})


@pytest.fixture(scope="module")
def runs():
    """The same cut recovered in sequential and in independent mode (same windows)."""
    torch.manual_seed(0)
    model = tiny_model("llama", layers=6)
    calib, held = windows(8, 0), windows(4, 1)
    seq = recover(model, DROP, ["none", "ghost", "ghost-auto", "linearpatch-diag"], calib, held, SEQUENTIAL)
    ind = recover(model, DROP, ["ghost-auto"], calib, held)
    return types.SimpleNamespace(seq=seq, ind=ind, held=held)


def heldout_nll(run, method, held) -> float:
    return perplexity(run.results[method].model, held).nll


def test_sequential_auto_is_never_worse_than_no_recovery_and_ghost_only_without_significance(runs):
    from ghosted.recovery.auto import significant_gain

    auto = heldout_nll(runs.seq, "ghost-auto", runs.held)
    # the same float32 forward passes on both sides of each comparison: round-off only
    assert auto <= heldout_nll(runs.seq, "none", runs.held) * (1 + TINY_MODEL_TOL)
    if auto > heldout_nll(runs.seq, "ghost", runs.held) * (1 + TINY_MODEL_TOL):
        # sequential ghost predicts the held-out windows better, but not significantly: the simpler is kept
        scores = {m: perplexity(runs.seq.results[m].model, runs.held).scores for m in ("ghost", "ghost-auto")}
        gain = significant_gain(scores["ghost"], scores["ghost-auto"])
        assert gain is None or not gain.high < 0


def test_sequential_auto_reports_each_choice_and_its_losses(runs):
    result = runs.seq.results["ghost-auto"]
    rows = result.choices
    assert [r["gap"] for r in rows] == ["1", "3", "4"]  # one gap per removed layer
    for row in rows:
        assert row["method"] == "ghost-auto" and row["chosen"] in AUTO_CANDIDATES
        losses = {c: row[f"nll_{c}"] for c in AUTO_CANDIDATES}
        assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
        assert "patched upstream" in row["reason"]
        if "replaced" not in row["reason"]:  # the gap-by-gap pick: none unless a gain is significant
            assert row["chosen"] == "none" or row[f"gain_{row['chosen']}_high"] < 0
            assert losses[row["chosen"]] <= losses["none"]
    operated = {Gap(int(r["gap"]), int(r["gap"]) + 1) for r in rows if r["chosen"] != "none"}
    assert set(result.fits) == operated  # a gap where no operator won carries none
    assert any("sequential" in note for note in result.notes)


def test_sequential_auto_fits_downstream_gaps_on_the_patched_stream(runs):
    # sequential ghost patches every gap (ghost-auto may keep none on these 4 held-out windows); its
    # statistics come from the same upstream-patched passes ghost-auto's candidates are fitted on
    seq, ind = runs.seq.results["ghost"], runs.ind.results["ghost-auto"]
    first = Gap(1, 2)
    # nothing upstream of the first gap: the same statistics as independent mode (float64 sums of the
    # same float32 states, another pass: round-off only)
    torch.testing.assert_close(seq.stats[first].xtx, ind.stats[first].xtx, rtol=TINY_MODEL_TOL, atol=0)
    # downstream of a patched gap, the candidates are fitted on other statistics than independent mode's
    second = Gap(3, 4)
    assert not torch.allclose(seq.stats[second].xtx, ind.stats[second].xtx, rtol=1e-3)


def test_a_method_without_sequential_mode_says_so(runs):
    assert not registry.REGISTRY["linearpatch-diag"].sequential
    assert any("no sequential mode" in n for n in runs.seq.results["linearpatch-diag"].notes)
    for name in ("ghost", "ghost-auto", "none"):
        assert not any("no sequential mode" in n for n in runs.seq.results[name].notes), name
    assert not any("no sequential mode" in n for n in runs.ind.results["ghost-auto"].notes)


def test_sequential_auto_needs_heldout_windows():
    with pytest.raises(ValueError, match="held-out"):
        recover(tiny_model("llama", layers=6), DROP, ["ghost-auto"], windows(4, 0), None, SEQUENTIAL)

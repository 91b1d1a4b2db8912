"""The logit lens and per-token losses: the last boundary reads the model's own logits, on every family."""

from __future__ import annotations

import pytest
import torch

from ghosted.evaluation.lens import boundary_logits, logit_lens, token_losses
from ghosted.evaluation.perplexity import model_logits
from ghosted.models.pruning import prune
from ghosted.recovery.fitting import recover
from ghosted.data.windows import TokenWindows
from tests.tiny import FAMILIES, CharTokenizer, random_ids, tiny_model


@pytest.mark.parametrize("family", FAMILIES)
def test_lens_at_the_last_boundary_is_the_models_own_logits(family):
    model = tiny_model(family, layers=4)
    ids = random_ids(1, 12, 3)  # (1, 12)
    own = model_logits(model, ids)[0]  # (12, V)
    for position in (-1, 5):
        read = boundary_logits(model, ids, position)
        assert sorted(read) == [0, 1, 2, 3, 4]
        torch.testing.assert_close(read[4], own[position].float(), rtol=1e-5, atol=1e-5)
    pruned = prune(model, "1-2")
    own = model_logits(pruned, ids)[0]
    read = boundary_logits(pruned, ids, -1, depth=4)
    assert sorted(read) == [0, 3, 4]  # the dense numbering: boundaries 1 and 2 are inside the cut
    torch.testing.assert_close(read[4], own[-1].float(), rtol=1e-5, atol=1e-5)


def test_lens_of_a_recovered_model_reads_its_operator():
    model = tiny_model("llama", layers=6)
    calib = random_ids(6, 16, 0)
    run = recover(model, "2-3", ["none", "ghost"], TokenWindows(calib, torch.ones_like(calib), {}))
    ghost = run.results["ghost"].model
    ids = random_ids(1, 10, 4)
    read = boundary_logits(ghost, ids, -1, depth=6)
    torch.testing.assert_close(read[6], model_logits(ghost, ids)[0, -1].float(), rtol=1e-5, atol=1e-5)
    table = logit_lens({"dense": model, "pruned": run.results["none"].model, "ghost": ghost}, CharTokenizer(),
                       "abcdefgh")
    assert table.boundary.tolist() == list(range(7))
    assert table.loc[table.boundary == 2, "pruned"].isna().all() and table["dense"].notna().all()
    assert ((table["dense p"] > 0) & (table["dense p"] <= 1)).all()


def test_token_losses_against_the_reference():
    model = tiny_model("llama", layers=6)
    pruned = prune(model, "2-3")
    losses = token_losses({"dense": model, "pruned": pruned}, CharTokenizer(), "hello world, hello")
    frame = losses.frame
    assert len(frame) == len("hello world, hello") - 1
    assert (frame["pruned Δ"] == frame["pruned"] - frame["dense"]).all()
    hurt = losses.most_hurt("pruned", 3)
    assert len(hurt) == 3 and hurt["pruned Δ"].is_monotonic_decreasing
    assert losses.most_repaired("dense", "pruned", 2).repaired.iloc[0] == pytest.approx(frame["pruned Δ"].max())
    with pytest.raises(ValueError, match="reference"):
        token_losses({"pruned": pruned}, CharTokenizer(), "abc")
    with pytest.raises(ValueError, match="no token"):
        token_losses({"dense": model}, CharTokenizer(), "")


def test_first_departure_of_generations():
    from ghosted.evaluation.generation import departures, first_departure

    tok = CharTokenizer()
    assert first_departure("abcdef", "abcXef", tok) == 3
    assert first_departure("abc", "abc", tok) is None
    assert first_departure("abc", "abcd", tok) == 3  # a longer text departs where the shorter one ends
    assert departures({"dense": ["abc", "xy"], "pruned": ["abd", "xy"]}, tok) == {"pruned": [2, None]}
    assert departures({"pruned": ["abc"]}, tok) == {}

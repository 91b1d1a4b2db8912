"""Which windows a selection is scored on: the spec's, drawn in one place, or the caller's."""

from __future__ import annotations

import pytest

import ghosted
from ghosted.experiments.spec import ExperimentSpec
from ghosted.selection.rules import select
from tests.tiny import tiny_loaded


def test_a_loaded_model_without_windows_is_scored_on_the_specs_calibration_windows():
    lm = tiny_loaded(layers=6)
    fit, heldout = ExperimentSpec().calibration.windows(lm.tokenizer)  # 32 fitted, 8 held out
    assert ghosted.select(lm, "block_influence", 2) == select(lm.model, "block_influence", 2, fit, heldout)


def test_a_model_without_windows_is_refused_by_the_rule_itself():
    with pytest.raises(ValueError, match="needs calibration windows"):
        select(tiny_loaded(layers=6).model, "block_influence", 2)

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


def test_the_influence_dry_run_plans_from_the_spec_its_flags_give(tmp_path, capsys):
    from ghosted.cli import main
    from tests.tiny import tiny_model_folder

    folder = tiny_model_folder(tmp_path / "tiny")
    args = ["influence", "--model", str(folder), "--calib-seqs", "5", "--heldout-seqs", "2", "--seq-len", "16",
            "--batch-size", "3", "--metrics", "block_influence", "--n-values", "2", "--out-dir",
            str(tmp_path / "out"), "--dry-run"]
    assert main(args) == 0
    plan = capsys.readouterr().out
    assert "5 x 16 tokens fitted + 2 held-out windows, seed 0: 7 windows, 3 batches of 3" in plan
    assert "criteria: block_influence" in plan and "block sizes n: 2" in plan
    assert not (tmp_path / "out").exists()  # a plan writes nothing

"""``python -m ghosted influence`` and ``python -m ghosted run --select`` on the bundled model.

Token counts are tiny (a few hundred tokens): these check wiring, files and agreement with the
library, not the quality of any criterion.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ghosted.cli import main
from ghosted.cli.influence import _recoverability_n, parse_metrics
from ghosted.selection.criteria import CRITERIA, InfluenceConfig, influence
from ghosted.data.windows import split_calibration
from ghosted.selection.rules import select
from ghosted.data.windows import calibration_windows

TEXT = ["--calib-seqs", "2", "--seq-len", "48", "--heldout-seqs", "1"]


@pytest.mark.slow
def test_influence_cli_writes_every_single_pass_criterion(tmp_path, capsys):
    out = tmp_path / "influence"
    assert main(["influence", *TEXT, "--n-values", "1,29", "--out-dir", str(out)]) == 0
    blocks, layers = pd.read_csv(out / "blocks.csv"), pd.read_csv(out / "layers.csv")
    block_metrics = {m for m, c in CRITERIA.items() if c.kind == "block"}
    assert set(blocks.metric) == block_metrics
    assert sorted(set(blocks.n)) == [1, 29]
    assert len(blocks[(blocks.metric == "streamline_cosine") & (blocks.n == 29)]) == 2  # starts 0 and 1
    assert set(layers.metric) == {"block_influence", "seqcos_shortgpt"} and len(layers) == 60
    report = json.loads((out / "influence.json").read_text())
    assert report["meta"]["tokens"] == 2 * 48 and report["meta"]["heldout_tokens"] == 48
    chosen = pd.read_csv(out / "selections.csv")
    assert {"metric", "n", "layers", "reason"} <= set(chosen.columns)
    printed = capsys.readouterr().out
    assert "recoverability" in printed and "block_influence" in printed


@pytest.mark.slow
def test_influence_cli_rejects_unknown_criteria(tmp_path, capsys):
    assert main(["influence", *TEXT, "--metrics", "bogus", "--out-dir", str(tmp_path)]) == 2
    assert "Unknown criterion" in capsys.readouterr().err


@pytest.mark.slow
def test_run_select_records_the_choice_and_why(bundled, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", *TEXT, "--select", "block_influence", "--n", "3", "--methods", "none",
                 "--eval-tokens", "64", "--eval-seq-len", "32", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    calib = calibration_windows(bundled.tokenizer, "bundled:news", 3, 48, 0)
    fit, held = split_calibration(calib, 1)
    direct = influence(bundled.model, fit, InfluenceConfig(metrics=["block_influence"], n_values=[3]),
                       heldout=held)
    layers, reason = select(direct, "block_influence", 3)
    assert report["dropped"] == layers and report["selection"]["layers"] == layers
    assert report["selection"]["reason"] == reason and report["config"]["select"] == "block_influence"
    assert "selected by block_influence" in capsys.readouterr().out


@pytest.mark.slow
def test_run_refuses_drop_and_select_together(tmp_path, capsys):
    assert main(["run", *TEXT, "--select", "recoverability", "--n", "3", "--drop", "3-5",
                 "--methods", "none", "--eval-tokens", "64", "--eval-seq-len", "32"]) == 2
    assert "either" in capsys.readouterr().err


def test_recoverability_block_sizes_default_to_the_paper_ratios():
    assert _recoverability_n("auto", None, 30) == [7, 10]  # 7/32 and 11/32 of 30 layers
    assert _recoverability_n("auto", None, 32) == [7, 11]
    assert _recoverability_n("auto", [3, 4], 30) is None  # follows explicit --n-values
    assert _recoverability_n("all", None, 30) is None
    assert _recoverability_n("5-6", None, 30) == [5, 6]


def test_metric_groups_expand():
    assert "recoverability_heldout" in parse_metrics("single", with_heldout=True)
    assert "recoverability_heldout" not in parse_metrics("single", with_heldout=False)
    assert parse_metrics("all", True) == list(CRITERIA)
    assert parse_metrics("sleb,taylor,sleb", True) == ["sleb", "taylor"]

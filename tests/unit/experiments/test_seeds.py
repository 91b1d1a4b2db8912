"""--seeds: the experiment over several calibration draws, each method's mean and spread."""

from __future__ import annotations

import statistics

import pytest

from ghosted.experiments.run import run_experiment
from ghosted.experiments.spec import ExperimentSpec
from ghosted.experiments.seeds import format_seeds, run_seeds, summarize_seeds
from tests.tiny import tiny_loaded

RUN = dict(drop="2-3", methods=["dense", "none", "ghost"], calib_seqs=4, seq_len=32, heldout_seqs=2,
           eval_tokens=64, eval_seq_len=32, batch_size=2, device="cpu", dtype="float32")


def test_each_seed_is_the_run_with_that_seed_and_the_summary_is_their_spread():
    lm = tiny_loaded(6)
    report = run_seeds(ExperimentSpec().with_options(**RUN), 2, loaded=lm)
    per_seed = report["seeds"]["perplexities"]
    assert list(per_seed) == [0, 1]
    again, _ = run_experiment(ExperimentSpec().with_options(**RUN, seed=1), loaded=lm)
    assert per_seed[1] == {e["method"]: e["ppl"] for e in again["results"]}
    assert per_seed[0]["dense"] == per_seed[1]["dense"]  # the dense model does not depend on the draw
    assert per_seed[0]["ghost"] != per_seed[1]["ghost"]
    ghost = report["seeds"]["summary"]["ghost"]
    assert ghost["mean"] == pytest.approx(statistics.fmean([per_seed[0]["ghost"], per_seed[1]["ghost"]]))
    assert ghost["std"] > 0 and ghost["min"] <= ghost["mean"] <= ghost["max"]
    assert "over 2 calibration draws" in format_seeds(report)


def test_one_seed_has_no_spread_and_bad_counts_are_refused():
    assert summarize_seeds({0: {"ghost": 5.0}})["ghost"]["std"] is None
    with pytest.raises(ValueError, match="at least 1"):
        run_seeds(ExperimentSpec().with_options(**RUN), 0, loaded=tiny_loaded(6))

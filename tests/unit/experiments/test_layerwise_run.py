"""``--layerwise`` / ``layerwise=True``: a run reads the checkpoint layer by layer and gives the whole model's numbers.

Every method that fits from calibration statistics (ghost and its variants, LinearPatch, ReplaceMe in its
hooked form, cosine ReplaceMe from the reservoir, ghost-auto on held-out statistics) and the perplexity,
KL and top-1 of every variant are compared with the same run on the model in memory.
"""

from __future__ import annotations

import math

import pytest

import ghosted
from ghosted.experiments.run import run_experiment
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.lazy import LayerwiseUnsupported, lazy_of
from tests.tiny import tiny_model_folder
from tests.tolerance import TINY_MODEL_TOL

METHODS = ["dense", "none", "ghost", "ghost-robust", "ghost-auto", "linearpatch-diag", "replaceme-ls",
           "replaceme-cos", "ghost-lowrank"]
RUN = dict(drop="2-3", methods=METHODS, calib_seqs=4, seq_len=32, heldout_seqs=2, eval_tokens=96,
           eval_seq_len=32, batch_size=2, device="cpu", dtype="float32", cache=False, fold=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tiny_model_folder(tmp_path_factory.mktemp("tiny")))


def _rows(report: dict) -> dict[str, dict]:
    return {row["method"]: row for row in report["results"]}


@pytest.mark.parametrize("mode", ["independent", "sequential"])
def test_a_layerwise_run_gives_the_whole_models_numbers(folder, mode):
    whole, _ = run_experiment(ExperimentSpec().with_options(model=folder, ghost_mode=mode, **RUN))
    layerwise, run = run_experiment(ExperimentSpec().with_options(model=folder, ghost_mode=mode, layerwise=True,
                                                                  **RUN))
    assert lazy_of(run.results["ghost"].model) is not None  # it really ran layer by layer
    want, got = _rows(whole), _rows(layerwise)
    assert set(got) == set(want) == set(METHODS)
    for method in METHODS:
        for key in ("ppl", "kl", "top1"):
            if want[method].get(key) is not None:
                assert math.isclose(got[method][key], want[method][key], rel_tol=TINY_MODEL_TOL,
                                    abs_tol=TINY_MODEL_TOL), (method, key)


def test_api_load_layerwise_evaluates_and_refuses_whole_model_steps_clearly(folder):
    lm = ghosted.load(folder, layerwise=True)
    assert lm.extra["layerwise"] and lazy_of(lm.model) is not None
    whole = ghosted.load(folder)
    got, want = ghosted.evaluate(lm, tokens=96, seq_len=32), ghosted.evaluate(whole, tokens=96, seq_len=32)
    assert math.isclose(got.ppl, want.ppl, rel_tol=TINY_MODEL_TOL)
    with pytest.raises(LayerwiseUnsupported, match="read layer by layer .* generation runs the whole model"):
        ghosted.generate(lm, lm.tokenizer, ["w3 w4"], max_new_tokens=2)


def test_dry_run_prints_the_layerwise_memory_plan(folder, capsys):
    from ghosted.cli import main

    main(["run", "--model", folder, "--drop", "2-3", "--methods", "dense,none,ghost", "--seq-len", "32",
          "--eval-seq-len", "32", "--eval-tokens", "256", "--layerwise", "--dry-run"])
    out = capsys.readouterr().out
    assert "layer-wise: 6 layers of up to" in out
    assert "calibration: 32 windows in 1 group(s)" in out and "perplexity x3: 8 windows" in out
    assert "peak ~" in out and "at 1,000 MB/s" in out

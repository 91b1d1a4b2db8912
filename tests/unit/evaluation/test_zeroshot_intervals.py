"""Zero-shot accuracies carry a 95 % interval: a bootstrap over examples (bundled-lastword) and
±1.96·stderr (lm-evaluation-harness), checked against the binomial closed form on synthetic answers."""

import math

import numpy as np
import pandas as pd
import pytest

from ghosted.evaluation.lastword import LastWordScore, mean_stderr
from ghosted.evaluation.zeroshot import TaskRun, _harness_metrics, lastword_rows, task_columns

N, P = 400, 0.3  # synthetic examples and the share answered right


def _score(seed: int = 0) -> LastWordScore:
    rng = np.random.default_rng(seed)
    correct = [bool(c) for c in rng.permutation(np.arange(N) < int(P * N))]  # exactly P * N right answers
    logprobs = rng.normal(-3.0, 1.0, N).tolist()
    acc, acc_err = mean_stderr([float(c) for c in correct])
    ll, ll_err = mean_stderr(logprobs)
    return LastWordScore(acc, acc_err, ll, ll_err, N, 0.0, correct, logprobs)


def test_lastword_bootstrap_interval_matches_the_binomial_closed_form():
    acc, ll = lastword_rows("ghost", _score(), "bundled-lastword")
    half = 1.96 * math.sqrt(P * (1 - P) / N)  # binomial standard error of a share, 95 %
    assert acc["value"] == pytest.approx(P)
    assert acc["low"] == pytest.approx(P - half, abs=0.1 * half)  # a bootstrap, not the formula: within 10 %
    assert acc["high"] == pytest.approx(P + half, abs=0.1 * half)
    assert ll["low"] < ll["value"] < ll["high"]


def test_lastword_interval_is_seeded():
    assert lastword_rows("a", _score(), "t") == lastword_rows("a", _score(), "t")


def test_harness_interval_is_196_standard_errors():
    stderr = math.sqrt(P * (1 - P) / (N - 1))  # lm-eval's sample stderr of a 0/1 mean
    results = {"arc_easy": {"acc,none": P, "acc_stderr,none": stderr, "acc_norm,none": 0.35}}
    acc, norm = _harness_metrics("ghost", results, ["arc_easy"], {"arc_easy": N})
    assert (acc["low"], acc["high"]) == pytest.approx((P - 1.96 * stderr, P + 1.96 * stderr), rel=1e-4)
    assert norm["low"] is None and norm["high"] is None and math.isnan(norm["stderr"])  # no stderr: no interval


def test_report_json_and_cli_table_carry_the_interval():
    frame = pd.DataFrame(lastword_rows("dense", _score(), "bundled-lastword"))
    scores = TaskRun(frame, {}, {}).metrics_of("dense")["bundled-lastword"]
    assert {"acc", "acc_stderr", "acc_low", "acc_high"} <= set(scores)
    assert scores["acc_low"] < scores["acc"] < scores["acc_high"]
    report = {"protocol": {"tasks": [{"task": "bundled-lastword", "metrics": ["acc", "loglikelihood"]}]},
              "results": [{"method": "dense", "tasks": {"bundled-lastword": scores}}]}
    _, (cell,) = task_columns(report)
    assert cell.split() == [f"{100 * P:.2f}", f"[{100 * scores['acc_low']:.2f},", f"{100 * scores['acc_high']:.2f}]"]


def test_grid_task_table_shows_the_interval():
    from ghosted.grid.report import task_markdown

    rows = [{**r, "selection": "manual", "n": 2, "layers": "3-4"}
            for r in lastword_rows("ghost", _score(), "bundled-lastword")]
    text = task_markdown(pd.DataFrame(rows))
    acc = rows[0]
    assert f"| manual | 2 | 3-4 | {100 * P:.1f} [{100 * acc['low']:.1f}, {100 * acc['high']:.1f}] |" in text

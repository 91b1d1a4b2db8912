"""The numbers do not depend on the thread count, within the tolerance rule of tests/tolerance.py.

CI runs the suite once, with whatever thread count the machine gives. This test recomputes a
representative set of numbers (block criteria and a recoverability over a padded batch, a ghost
operator fitted from statistics, a perplexity) in a subprocess with another thread count and
compares them with the same numbers computed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny import random_ids, tiny_model
from tests.tolerance import TINY_MODEL_TOL, assert_close_on_scale

ROOT = Path(__file__).resolve().parents[3]
GAP = (2, 4)  # layers 2-3 removed


def numbers() -> dict:
    """Block influence, recoverability, a ghost operator and a perplexity of a tiny llama."""
    from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
    from ghosted.evaluation.perplexity import perplexity
    from ghosted.selection.criteria import InfluenceConfig, influence
    from ghosted.recovery.solvers import ghost_operator
    from ghosted.data.windows import TokenWindows

    torch.manual_seed(0)
    model = tiny_model("llama", layers=6)
    ids = random_ids(4, 24, seed=3)
    mask = torch.ones_like(ids)
    mask[3, 15:] = 0  # one right-padded sequence
    windows = TokenWindows(ids, mask, {"source": "test"})
    cfg = InfluenceConfig(metrics=["block_influence", "recoverability"], n_values=[1, 2], batch_size=3)
    report = influence(model, windows, cfg)
    stats = collect_stats(model, windows, [Gap(*GAP)], CalibrationConfig(replaceme=False, linearpatch=False))[Gap(*GAP)]
    return {"threads": torch.get_num_threads(),
            "block_influence": report.layer_values("block_influence").tolist(),
            "recoverability": report.matrix("recoverability")[2].dropna().tolist(),
            "operator": ghost_operator(stats).tolist(),
            "xtx_cond": float(torch.linalg.cond(stats.xtx)),
            "ppl": perplexity(model, windows, batch_size=3).ppl}


def numbers_with_threads(threads: int) -> dict:
    """``numbers()`` in a fresh interpreter whose OpenMP / MKL / torch thread count is ``threads``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1"}
    code = (f"import json, torch; torch.set_num_threads({threads}); from tests.unit.core.test_threads import numbers; "
            "print(json.dumps(numbers()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.filterwarnings("ignore")
def test_numbers_do_not_depend_on_torchs_thread_count_in_one_process():
    """The fast twin of the test below: torch's own thread count changed in this process."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = numbers()
        torch.set_num_threads(2)
        two = numbers()
    finally:
        torch.set_num_threads(before)
    assert (one["threads"], two["threads"]) == (1, 2)
    assert two["block_influence"] == pytest.approx(one["block_influence"], abs=TINY_MODEL_TOL)
    assert two["ppl"] == pytest.approx(one["ppl"], rel=TINY_MODEL_TOL)
    assert_close_on_scale(torch.tensor(two["operator"], dtype=torch.float64),
                          torch.tensor(one["operator"], dtype=torch.float64), TINY_MODEL_TOL * one["xtx_cond"])


@pytest.mark.slow  # a second interpreter, so that OpenMP and MKL start with another count too
@pytest.mark.filterwarnings("ignore")
def test_numbers_do_not_depend_on_the_thread_count():
    here = numbers()
    other_count = 1 if torch.get_num_threads() > 1 else 2  # always a different count than ours
    other = numbers_with_threads(other_count)
    assert other["threads"] == other_count != here["threads"]
    # cosine-based and [0, 1] ratios of float32 hidden states: absolute on their scale of 1
    assert other["block_influence"] == pytest.approx(here["block_influence"], abs=TINY_MODEL_TOL)
    assert other["recoverability"] == pytest.approx(here["recoverability"], abs=TINY_MODEL_TOL)
    assert other["ppl"] == pytest.approx(here["ppl"], rel=TINY_MODEL_TOL)
    # one solve on float64 sums of float32 states: round-off amplified by at most cond(XᵀX)
    solve_tol = TINY_MODEL_TOL * here["xtx_cond"]
    assert_close_on_scale(torch.tensor(other["operator"], dtype=torch.float64),
                          torch.tensor(here["operator"], dtype=torch.float64), solve_tol)

"""bench's fits go through a Session: the same operators and models as calling ``recover`` directly."""

from __future__ import annotations

import torch

from bench._common import session_fit
from ghosted.data.windows import calibration_windows, split_calibration
from ghosted.recovery.fitting import RecoveryConfig, recover
from tests.tiny import tiny_loaded


def _windows(lm):
    return split_calibration(calibration_windows(lm.tokenizer, "bundled:news", 6, 32, 0), 2)


def _same(a, b) -> bool:
    return set(a.results) == set(b.results) and all(
        torch.equal(a.results[m].operators[g], b.results[m].operators[g])
        for m in a.results for g in a.results[m].operators)


def test_a_bench_fit_is_recover_with_the_defaults():
    lm = tiny_loaded()
    fit, held = _windows(lm)
    methods = ["none", "ghost", "ghost-robust", "linearpatch-diag"]
    assert _same(session_fit(lm, "2-3", methods, fit, held), recover(lm.model, "2-3", methods, fit, held))


def test_a_bench_setting_is_the_recovery_setting_of_that_name():
    lm = tiny_loaded()
    fit, held = _windows(lm)
    low = session_fit(lm, "2-3", ["ghost-lowrank"], fit, held, rank=3)
    direct = recover(lm.model, "2-3", ["ghost-lowrank"], fit, held, RecoveryConfig(rank=3))
    assert _same(low, direct) and low.statistics == direct.statistics

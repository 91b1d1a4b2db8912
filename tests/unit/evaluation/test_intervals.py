"""The bootstrap intervals against closed forms on synthetic data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ghosted.evaluation.intervals import (IntervalConfig, mean_interval, normal_interval, paired_difference,
                                          ratio_interval)


def test_mean_of_normal_data_matches_the_closed_form():
    rng = np.random.default_rng(7)
    values = rng.normal(3.0, 2.0, size=2000)
    got = mean_interval(values, IntervalConfig(resamples=4000, seed=1))
    half = 1.96 * values.std(ddof=1) / math.sqrt(len(values))
    assert got.estimate == pytest.approx(values.mean())
    # the percentile bootstrap of a mean of normal data is mean ± 1.96 s/√n, up to resampling noise
    assert got.low == pytest.approx(values.mean() - half, abs=0.1 * half)
    assert got.high == pytest.approx(values.mean() + half, abs=0.1 * half)


def test_bernoulli_accuracy_matches_the_closed_form():
    rng = np.random.default_rng(3)
    correct = (rng.random(1500) < 0.3).astype(float)
    got = mean_interval(correct, IntervalConfig(resamples=4000))
    p = correct.mean()
    half = 1.96 * math.sqrt(p * (1 - p) / len(correct))
    assert (got.low, got.high) == pytest.approx((p - half, p + half), abs=0.1 * half)


def test_ratio_of_sums_weights_windows_by_tokens():
    sums, counts = np.array([10.0, 30.0]), np.array([10, 10])
    assert ratio_interval(sums, counts).estimate == pytest.approx(2.0)
    assert ratio_interval(sums, counts, transform=np.exp).estimate == pytest.approx(math.exp(2.0))
    one = ratio_interval([4.0], [2])  # one window: no interval, never a zero-width one
    assert one.estimate == 2.0 and not one.known and one.significant is None


def test_paired_difference_cancels_shared_variation():
    """Two variants that differ by a constant on hard and easy windows alike: the paired interval is
    tight and excludes zero, although each variant's own interval is wide and they overlap."""
    rng = np.random.default_rng(0)
    counts = np.full(40, 100.0)
    base = rng.normal(3.0, 0.5, 40) * counts  # hard and easy windows
    better = base - 0.01 * counts + rng.normal(0, 0.05, 40)
    a, b = ratio_interval(better, counts), ratio_interval(base, counts)
    assert a.high > b.low  # the unpaired intervals overlap
    diff = paired_difference(better, base, counts, transform=lambda x: x)
    assert diff.estimate == pytest.approx(-0.01, abs=2e-3)
    assert diff.high < 0 and diff.significant
    same = paired_difference(base, base, counts)
    assert same.estimate == 0 and same.low == same.high == 0  # identical variants: zero, exactly


def test_paired_difference_of_noise_is_not_significant():
    rng = np.random.default_rng(5)
    counts = np.full(30, 50.0)
    a, b = rng.normal(2.0, 0.3, 30) * counts, rng.normal(2.0, 0.3, 30) * counts
    diff = paired_difference(a, b, counts)
    assert diff.holds(0.0) and diff.significant is False


def test_seeded_and_reproducible():
    values = np.arange(20.0)
    assert mean_interval(values, IntervalConfig(seed=4)) == mean_interval(values, IntervalConfig(seed=4))


def test_normal_interval_and_bad_input():
    got = normal_interval(0.5, 0.01, 100)
    assert (got.low, got.high) == pytest.approx((0.5 - 0.0196, 0.5 + 0.0196), abs=1e-5)
    assert not normal_interval(0.5, None, 100).known
    with pytest.raises(ValueError, match="same windows"):
        paired_difference([1.0, 2.0], [1.0], [1, 1])
    with pytest.raises(ValueError, match="one length"):
        ratio_interval([1.0, 2.0], [1])

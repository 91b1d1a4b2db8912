"""Seeded bootstrap intervals: perplexity, accuracy, fidelity to the dense model, paired differences.

Why: a table of single perplexities says nothing about which differences are real. Every variant of
a model is scored on the very same evaluation windows, so

  * a variant's own number (perplexity, KL, top-1 agreement) gets a percentile bootstrap interval
    over windows (the unit that is drawn; tokens inside a window are not independent), and
  * a difference between two variants gets a *paired* interval: each resample takes the same
    windows for both, so the variation the two share (hard windows are hard for both) cancels.

A difference whose interval holds zero is not significant at that level. Resampling is seeded and
uses the same window indices for every variant of one evaluation, so the numbers are reproducible
and every comparison in a table rests on the same resamples.

Example:
    >>> ppl = ratio_interval(nll_sums, token_counts, transform=np.exp)   # Interval(27.1, 26.0, 28.4)
    >>> diff = paired_difference(ghost_nll, none_nll, token_counts)        # Δppl ghost - pruned
    >>> diff.significant
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class IntervalConfig:
    """How intervals are drawn."""

    resamples: int = 2000  # bootstrap resamples: the 2.5 % / 97.5 % bounds move < 5 % of the width past this
    level: float = 0.95  # two-sided coverage
    seed: int = 0  # resampling seed: the same windows are drawn for every variant of one evaluation


@dataclass(frozen=True)
class Interval:
    """An estimate with its bootstrap interval; ``low``/``high`` None when it cannot be estimated (< 2 units)."""

    estimate: float
    low: float | None
    high: float | None
    units: int  # windows (or documents) resampled
    level: float = 0.95

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval (True when the interval is unknown: nothing is shown)."""
        return not self.known or self.low <= value <= self.high

    @property
    def significant(self) -> bool | None:
        """For a difference: True when the interval excludes zero, None when it could not be estimated."""
        return None if not self.known else not self.holds(0.0)

    def __str__(self) -> str:
        if not self.known:
            return f"{self.estimate:.4g} [no interval: {self.units} unit(s)]"
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}]"


def resample_indices(units: int, config: IntervalConfig = IntervalConfig()) -> np.ndarray:
    """(resamples, units) window indices drawn with replacement, from ``config.seed`` alone."""
    rng = np.random.default_rng(config.seed)
    return rng.integers(0, units, size=(config.resamples, units))


def _bounds(samples: np.ndarray, level: float) -> tuple[float, float]:
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def ratio_interval(sums, counts, config: IntervalConfig = IntervalConfig(),
                   transform: Callable | None = None) -> Interval:
    """``transform(sum(sums) / sum(counts))`` with its bootstrap interval over units (windows).

    The ratio of sums weights each unit by its tokens, exactly as the point estimate does (a mean NLL
    per token, a KL per token, an agreement rate). ``transform=np.exp`` turns a mean NLL into perplexity
    (any function that maps numpy arrays elementwise).
    """
    sums, counts = _as_arrays(sums, counts)
    transform = transform or _identity
    estimate = float(transform(sums.sum() / counts.sum()))
    if len(sums) < 2:
        return Interval(estimate, None, None, len(sums), config.level)
    idx = resample_indices(len(sums), config)  # (R, n)
    samples = transform(sums[idx].sum(1) / counts[idx].sum(1))  # (R,)
    return Interval(estimate, *_bounds(samples, config.level), len(sums), config.level)


def mean_interval(values, config: IntervalConfig = IntervalConfig()) -> Interval:
    """The mean of ``values`` (one per unit: a document's 0/1 correctness, say) with its bootstrap interval."""
    values = np.asarray(values, dtype=np.float64)
    return ratio_interval(values, np.ones_like(values), config)


def paired_difference(sums_a, sums_b, counts, config: IntervalConfig = IntervalConfig(),
                      transform: Callable | None = np.exp) -> Interval:
    """``transform(mean_a) - transform(mean_b)`` with a paired interval: both means on the same resample.

    ``sums_a``/``sums_b``: per-window sums of two variants on the same windows, ``counts`` the tokens
    each window scores (the same for both). With ``transform=np.exp`` (the default) this is a perplexity
    difference; ``transform=None`` gives the difference of the means themselves (a ΔNLL).
    """
    transform = transform or _identity
    sums_a, counts = _as_arrays(sums_a, counts)
    sums_b = np.asarray(sums_b, dtype=np.float64)
    if sums_b.shape != sums_a.shape:
        raise ValueError(f"A paired difference needs the same windows for both variants; got {sums_a.shape} "
                         f"and {sums_b.shape} per-window sums.")
    total = counts.sum()
    estimate = float(transform(sums_a.sum() / total) - transform(sums_b.sum() / total))
    if len(counts) < 2:
        return Interval(estimate, None, None, len(counts), config.level)
    idx = resample_indices(len(counts), config)  # (R, n)
    tokens = counts[idx].sum(1)  # (R,)
    samples = transform(sums_a[idx].sum(1) / tokens) - transform(sums_b[idx].sum(1) / tokens)  # (R,)
    return Interval(estimate, *_bounds(samples, config.level), len(counts), config.level)


def normal_interval(estimate: float, stderr: float | None, units: int, level: float = 0.95) -> Interval:
    """``estimate ± z·stderr`` for a score that comes with only its standard error (a harness task)."""
    if stderr is None or not math.isfinite(stderr) or units < 2:
        return Interval(estimate, None, None, units, level)
    z = NormalDist().inv_cdf(0.5 + level / 2)  # the two-sided normal quantile
    return Interval(estimate, estimate - z * stderr, estimate + z * stderr, units, level)


def _as_arrays(sums, counts) -> tuple[np.ndarray, np.ndarray]:
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if sums.ndim != 1 or sums.shape != counts.shape:
        raise ValueError(f"Per-unit sums and counts must be two 1-D arrays of one length; got {sums.shape} "
                         f"and {counts.shape}.")
    if len(sums) == 0 or counts.sum() <= 0:
        raise ValueError("An interval needs at least one unit with a scored token; none was given.")
    return sums, counts


def _identity(x):
    return x

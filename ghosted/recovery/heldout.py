"""Choosing between fits on held-out calibration windows: their next-token NLL and the significance rule.

``ghost-auto`` and ``layer-ls`` decide with the same rule: the simpler fit is kept unless the more
complex one lowers the held-out NLL and the paired bootstrap interval of the change over held-out
windows (``ghosted.evaluation.intervals``) lies wholly below zero. With fewer than
``MIN_HELDOUT_WINDOWS`` held-out windows nothing can be told apart.
"""

from __future__ import annotations

from torch import nn

from ghosted.evaluation.intervals import Interval, IntervalConfig, paired_difference
from ghosted.evaluation.scores import WindowScores

MIN_HELDOUT_WINDOWS = 4  # below this a bootstrap over windows has at most 10 distinct resamples: no interval
AUTO_INTERVALS = IntervalConfig()  # paired bootstrap of held-out NLL differences (95 %, seeded)


def heldout_scores(models: dict[str, nn.Module], windows, batch_size: int) -> dict[str, WindowScores]:
    """Per-window NLL sums of each model on ``windows`` in one pass: the layers every model holds as the
    same objects run once for all (``shared_prefix``, equal to scoring each alone)."""
    from ghosted.evaluation.shared_prefix import perplexities

    scored = perplexities(models, windows, batch_size=batch_size, reference=None, baselines=())
    return {label: result.scores for label, result in scored.items()}


def mean_nll(scores: WindowScores) -> float:
    return scores.total_nll / scores.total_tokens


def significant_gain(candidate: WindowScores, simpler: WindowScores) -> Interval | None:
    """The held-out NLL change of ``candidate`` against ``simpler`` (paired over windows), or None when
    there are too few held-out windows to put an interval on it."""
    if len(simpler.nll) < MIN_HELDOUT_WINDOWS:
        return None
    return paired_difference(candidate.nll, simpler.nll, simpler.tokens, AUTO_INTERVALS, transform=None)


def wins(candidate: WindowScores, simpler: WindowScores) -> tuple[bool, Interval | None]:
    """(whether ``candidate`` replaces ``simpler``: lower held-out NLL, interval wholly below zero; the
    interval, None with too few windows)."""
    gain = significant_gain(candidate, simpler)
    better = gain is not None and gain.known and gain.estimate < 0 and gain.high < 0
    return better, gain

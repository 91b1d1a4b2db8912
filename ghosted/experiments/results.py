"""The app's results, typed: what a job returns and the shared store keeps (read-only once stored).

``ghosted.experiments.workbench`` computes them from its requests; ``ghosted.experiments.codecs`` gives the
plain-JSON form of those that are kept on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from ghosted.experiments.spec import ExperimentSpec


@dataclass(frozen=True)
class Influence:
    """An influence report and the windows it was measured on."""

    model: str  # model key
    report: object  # ghosted.selection.criteria.InfluenceReport
    protocol: dict  # the windows' protocol


@dataclass(frozen=True)
class Evaluation:
    """Perplexity, size and latency of every variant, and the evaluation protocol."""

    table: pd.DataFrame  # one row per variant
    protocol: dict  # source, part, windows, tokens scored, dtype, device


@dataclass(frozen=True)
class ZeroShot:
    """Zero-shot accuracy of every variant."""

    frame: pd.DataFrame  # accuracy per variant and task
    protocols: dict  # task -> its protocol
    skipped: dict  # task -> why it was skipped
    notes: list  # one line per skipped task


@dataclass(frozen=True)
class Generations:
    """Each variant's continuation of each prompt."""

    prompts: list  # the prompts, in order
    outputs: dict  # variant -> one continuation per prompt
    departures: dict = field(default_factory=dict)  # variant -> per prompt, the token where its greedy text
    # first departs from dense's (None: not within the tokens generated); dense itself has none


@dataclass
class FittedRun:
    """One calibration and every method fitted on it, with what was measured on it since.

    The store holds the shared run (read-only, with nothing measured); a session sees a copy with its
    own ``evaluation``, ``zeroshot`` and ``generations`` (``with_results``)."""

    model: str  # key of the model it was fitted on
    run: object  # ghosted.recovery.fitting.RecoveryRun: the operators and the recovered models
    config: ExperimentSpec  # the settings, as ``python -m ghosted run`` takes them (``run --recipe``)
    layers: list[int]  # the dropped layers
    methods: list[str]  # "none" (plain pruning) first, then every fitted method
    frames: dict[str, pd.DataFrame]  # the run's tidy frames for display (errors, spectra, sinks, ...)
    protocol: dict  # the calibration windows (source, part, count, length, seed)
    heldout_protocol: dict | None  # the held-out windows; None when none were held out
    seconds: float  # wall time of the calibration and every fit
    evaluation: Evaluation | None = None  # Compare page: perplexity, size and latency
    zeroshot: ZeroShot | None = None  # Compare page: zero-shot accuracy
    generations: Generations | None = None  # Compare page: continuations of each variant

    def with_results(self, **results) -> FittedRun:
        """A session's view: the shared run with that session's measurements."""
        return replace(self, **results)

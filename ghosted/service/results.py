"""The app's results, typed: what a job returns and the shared store keeps (read-only once stored).

``ghosted.service.workbench`` computes them from its requests; ``ghosted.service.codecs`` gives the
plain-JSON form of those that are kept on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from ghosted.service.comparison import VariantTable, span
from ghosted.experiments.spec import ExperimentSpec


@dataclass(frozen=True)
class Influence:
    """An influence report and the windows it was measured on."""

    model: str  # model key
    report: object  # ghosted.selection.criteria.InfluenceReport
    protocol: dict  # the windows' protocol


@dataclass(frozen=True)
class Evaluation:
    """Perplexity, fidelity to dense, size and latency of every variant, and the evaluation protocol."""

    table: VariantTable  # one typed row per variant
    protocol: dict  # source, part, windows, tokens scored, dtype, device


@dataclass(frozen=True)
class AccuracyBars:
    """One group of the accuracy chart: a task (or the average over tasks), one bar per variant, in %."""

    name: str  # the task, or "average"
    labels: list  # the variants
    values: list  # accuracy (%)
    above: list | None  # the 95 % interval above and below each value (%); None: not drawn (the average)
    below: list | None


@dataclass(frozen=True)
class ZeroShot:
    """Zero-shot accuracy of every variant."""

    frame: pd.DataFrame  # accuracy per variant and task (TaskRun.frame: model, task, metric, value, stderr,
    # low, high; fractions)
    protocols: dict  # task -> its protocol
    skipped: dict  # task -> why it was skipped
    notes: list  # one line per skipped task

    @property
    def accuracy(self) -> pd.DataFrame:
        """The rows of the accuracy metric (one per variant and task)."""
        return self.frame[self.frame.metric == "acc"] if len(self.frame) else self.frame

    def table(self, intervals: bool = False) -> pd.DataFrame:
        """Accuracy per variant (rows, ``label``) and task (columns), in %, plus "average" over tasks when
        there are several; ``intervals``: each task's 95 % interval beside it ("<task> 95 %")."""
        acc = self.accuracy
        models, tasks = list(dict.fromkeys(acc.model)), list(dict.fromkeys(acc.task))
        table = acc.pivot_table(index="model", columns="task", values="value", sort=False) * 100
        table = table.reindex(index=models, columns=tasks)
        average = table.mean(axis=1)
        table = table.round(2)
        if intervals and {"low", "high"} <= set(acc):
            for task in tasks:
                rows = acc[acc.task == task].set_index("model")
                cells = [span(100 * rows.low.get(m), 100 * rows.high.get(m)) if m in rows.index else ""
                         for m in models]
                table.insert(table.columns.get_loc(task) + 1, f"{task} 95 %", cells)
        if len(tasks) > 1:
            table["average"] = average.round(2)
        return table.rename_axis(index="label", columns=None).reset_index()

    def bars(self) -> list[AccuracyBars]:
        """The accuracy chart's groups: one per task with its 95 % interval (±1.96 standard errors where
        none is stored), then the average over tasks when there are several."""
        acc = self.accuracy
        tasks = list(dict.fromkeys(acc.task))
        groups = [_task_bars(task, acc[acc.task == task]) for task in tasks]
        if len(tasks) > 1:
            mean = acc.groupby("model", sort=False).value.mean()
            groups.append(AccuracyBars("average", list(mean.index), (100 * mean).tolist(), None, None))
        return groups


def _task_bars(task: str, rows: pd.DataFrame) -> AccuracyBars:
    """One task's accuracies (in %) with the 95 % interval; ±1.96·stderr where none is stored."""
    if {"low", "high"} <= set(rows):
        low, high = rows.low.fillna(rows.value - 1.96 * rows.stderr), rows.high.fillna(rows.value + 1.96 * rows.stderr)
    else:  # a result stored before the intervals
        low, high = rows.value - 1.96 * rows.stderr, rows.value + 1.96 * rows.stderr
    return AccuracyBars(task, rows.model.tolist(), (100 * rows.value).tolist(),
                        (100 * (high - rows.value)).fillna(0).tolist(), (100 * (rows.value - low)).fillna(0).tolist())


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

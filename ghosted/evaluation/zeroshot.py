"""Optional zero-shot accuracy through lm-evaluation-harness, on in-memory (pruned, recovered) models.

The paper scores nine commonsense tasks zero-shot with ``acc,none`` (not acc_norm), batch 8. Here
each model is wrapped in lm-eval's ``HFLM(pretrained=<model>, tokenizer=...)`` without being saved,
so every recovered variant can be scored as it is. lm-eval is an extra (``pip install -r
requirements-eval.txt``); its tasks download their data from the Hugging Face hub, so a task whose
data cannot be loaded (offline, no access) is skipped with a clear message instead of failing the run.
Local tasks (YAML files) are added with ``include_path``, as in lm-eval's ``TaskManager``.

Example:
    >>> res = zero_shot({"ghost": run.results["ghost"].model}, tokenizer, ZeroShotConfig(limit=100))
    >>> res.frame            # model, task, metric, value, stderr
    >>> res.skipped          # {"race": "could not load its data: ..."}
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import pandas as pd
from torch import nn

from ghosted.core.progress import Progress, counted, message

PAPER_TASKS = ["arc_easy", "arc_challenge", "hellaswag", "winogrande", "boolq", "openbookqa", "rte",
               "copa", "race"]  # the paper's nine zero-shot tasks (lm-eval names)


class ZeroShotUnavailable(RuntimeError):
    """lm-evaluation-harness is not installed."""


@dataclass
class ZeroShotConfig:
    """What to score and how (defaults: the paper's protocol)."""

    tasks: list[str] = field(default_factory=lambda: list(PAPER_TASKS))  # lm-eval task names
    metric: str = "acc,none"  # the paper's metric for every task (its code never uses acc_norm)
    num_fewshot: int = 0  # zero-shot
    batch_size: int = 8  # as the paper
    limit: int | float | None = None  # examples per task (None: all; <1: a fraction), for quick looks
    include_path: str | None = None  # a folder of extra task YAMLs (local data, offline tests)
    include_defaults: bool = True  # also index lm-eval's built-in tasks (takes a while; off: local only)
    bootstrap_iters: int = 1000  # for the standard errors (0: none)
    seed: int = 0  # lm-eval's python / numpy / torch / few-shot seeds


@dataclass
class ZeroShotResult:
    """Scores per (model, task), the tasks skipped and why, and the mean over scored tasks."""

    frame: pd.DataFrame  # columns: model, task, metric, value, stderr
    skipped: dict[str, str]  # task -> why it was skipped

    def mean(self) -> pd.Series:
        """Simple mean over tasks per model (the paper's "AVG"), in percent."""
        return self.frame.groupby("model", sort=False)["value"].mean() * 100


def _lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ZeroShotUnavailable("Zero-shot accuracy needs lm-evaluation-harness: "
                                  "pip install -r requirements-eval.txt (lm-eval 0.4.x).") from err
    return lm_eval, HFLM, TaskManager


def loadable_tasks(names: list[str], task_manager) -> tuple[list[str], dict[str, str]]:
    """(tasks whose definition and data load, {task: why not} for the others)."""
    ok, skipped = [], {}
    for name in names:
        if name not in task_manager.all_tasks:
            skipped[name] = "unknown task name for this lm-eval version"
            continue
        try:
            task_manager.load([name])  # builds the task, which downloads (or reads cached) data
            ok.append(name)
        except Exception as err:  # noqa: BLE001 - datasets raises many kinds when offline
            skipped[name] = f"could not load its data ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
    return ok, skipped


def zero_shot(models: dict[str, nn.Module], tokenizer, config: ZeroShotConfig | None = None,
              progress: Progress | None = None) -> ZeroShotResult:
    """Zero-shot accuracy of each in-memory model on ``config.tasks``; models are not modified.

    ``progress`` gets one message per skipped task and per model scored (``result.skipped`` keeps the
    skipped tasks and why).
    """
    cfg = config or ZeroShotConfig()
    lm_eval, HFLM, TaskManager = _lm_eval()
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    manager = TaskManager(include_path=cfg.include_path, include_defaults=cfg.include_defaults)
    tasks, skipped = loadable_tasks(cfg.tasks, manager)
    for task, why in skipped.items():
        message(progress, f"zero-shot: skipping {task}: {why}")
    rows = []
    for name, model in models.items() if tasks else []:
        message(progress, f"zero-shot: {name} on {', '.join(tasks)}")
        out = _simple_evaluate(lm_eval, HFLM, model, tokenizer, tasks, manager, cfg)
        rows += _rows(name, out["results"], tasks, cfg.metric)
    return ZeroShotResult(pd.DataFrame(rows, columns=["model", "task", "metric", "value", "stderr"]), skipped)


def _simple_evaluate(lm_eval, HFLM, model, tokenizer, tasks: list[str], manager, cfg: ZeroShotConfig) -> dict:
    """lm-eval's ``simple_evaluate`` on one in-memory model (wrapped, not saved), seeded by ``cfg``."""
    wrapped = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=cfg.batch_size)
    return lm_eval.simple_evaluate(
        model=wrapped, tasks=tasks, num_fewshot=cfg.num_fewshot, limit=cfg.limit, task_manager=manager,
        log_samples=False, bootstrap_iters=cfg.bootstrap_iters, random_seed=cfg.seed,
        numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed)


def _rows(model: str, results: dict, tasks: list[str], metric: str) -> list[dict]:
    base, _, filt = metric.partition(",")
    stderr_key = f"{base}_stderr,{filt}" if filt else f"{base}_stderr"
    rows = []
    for task in tasks:
        scores = results.get(task, {})
        if metric not in scores:
            raise KeyError(f"{task} reports no {metric!r}; it reports {sorted(scores)}.")
        err = scores.get(stderr_key)
        rows.append({"model": model, "task": task, "metric": metric, "value": float(scores[metric]),
                     "stderr": float(err) if isinstance(err, (int, float)) else math.nan})
    return rows


# --- Tasks from the CLI and the app: bundled tasks (Ghosted's scorer) and lm-eval tasks side by side ---

METRICS = ("acc", "acc_norm", "loglikelihood")  # reported where a task has them, each with its stderr
FRAME_COLUMNS = ["model", "task", "metric", "value", "stderr", "low", "high"]  # low/high: the 95 % interval


@dataclass
class TaskRun:
    """Task scores of several models: tidy frame, one protocol per task, tasks skipped and why."""

    frame: pd.DataFrame  # columns: model, task, metric ("acc", "acc_norm", "loglikelihood"), value, stderr, low, high
    protocols: dict[str, dict]  # task -> task, version, examples, num_fewshot, metric(s), scorer
    skipped: dict[str, str]  # task -> why it was not scored

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(self.frame.task))

    def accuracy(self) -> pd.DataFrame:
        """Rows model x task with acc and its stderr (fractions), in the order scored."""
        return self.frame[self.frame.metric == "acc"].reset_index(drop=True)

    def average(self) -> pd.Series:
        """Mean accuracy over tasks per model (the paper's "AVG"), as a fraction."""
        return self.accuracy().groupby("model", sort=False)["value"].mean()

    def metrics_of(self, model: str) -> dict[str, dict[str, float]]:
        """{task: {metric: value, metric_stderr, metric_low, metric_high}} of one model, for a JSON report
        entry (low/high: the 95 % interval, None where it is not known)."""
        out: dict[str, dict[str, float]] = {}
        for row in self.frame[self.frame.model == model].itertuples():
            scores = out.setdefault(row.task, {})
            scores.update({row.metric: row.value, f"{row.metric}_stderr": row.stderr,
                           f"{row.metric}_low": _known(getattr(row, "low", None)),
                           f"{row.metric}_high": _known(getattr(row, "high", None))})
        return out


def _known(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def parse_tasks(text: str | list[str] | None) -> list[str]:
    """"bundled-lastword, arc_easy" -> ["bundled-lastword", "arc_easy"] (order kept, duplicates dropped)."""
    items = text.split(",") if isinstance(text, str) else (text or [])
    return list(dict.fromkeys(t.strip() for t in items if t and t.strip()))


def evaluate_tasks(models: dict[str, nn.Module], tokenizer, tasks: list[str], limit: int | None = None,
                   num_fewshot: int = 0, batch_size: int = 8, progress: Progress | None = None,
                   ghosted_scorer: bool = True) -> TaskRun:
    """Score every model on ``tasks``; a task that cannot be run is skipped (``TaskRun.skipped`` says
    why), not an error.

    ``bundled-lastword`` at zero shots is scored by ``ghosted.evaluation.lastword`` (the shared prefix of the
    variants runs once per batch); every other task, and the bundled one with few-shot examples,
    goes through lm-evaluation-harness one model at a time (``HFLM`` on the in-memory model);
    ``ghosted_scorer=False`` sends the bundled task through lm-evaluation-harness too.
    """
    from ghosted.evaluation.tasks import BUNDLED_TASKS

    own = [t for t in tasks if t in BUNDLED_TASKS and num_fewshot == 0 and ghosted_scorer]
    frames, protocols, skipped = [], {}, {}
    for task in own:
        frames.append(_bundled_rows(models, tokenizer, limit, batch_size, progress))
        protocols[task] = _lastword_protocol(limit)
    others = [t for t in tasks if t not in own]
    if others:
        frame, more, why = _harness_rows(models, tokenizer, others, limit, num_fewshot, batch_size, progress)
        frames.append(frame)
        protocols.update(more)
        skipped.update(why)
    frame = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else \
        pd.DataFrame(columns=FRAME_COLUMNS)
    return TaskRun(frame, protocols, skipped)


def _lastword_protocol(limit: int | None) -> dict:
    from ghosted.evaluation.lastword import protocol

    return protocol(limit)


def _bundled_rows(models, tokenizer, limit, batch_size, progress) -> pd.DataFrame:
    """``bundled-lastword`` through Ghosted's shared-prefix scorer, as frame rows; each score's 95 %
    interval is a seeded bootstrap over the examples (``intervals.mean_interval``)."""
    from ghosted.evaluation.lastword import TASK, score_lastword

    scores = score_lastword(models, tokenizer, limit=limit, batch_size=batch_size, progress=progress)
    return pd.DataFrame([row for name, s in scores.items() for row in lastword_rows(name, s, TASK)],
                        columns=FRAME_COLUMNS)


def lastword_rows(model: str, score, task: str) -> list[dict]:
    """A ``LastWordScore``'s acc and loglikelihood rows, each with its bootstrap interval over examples."""
    from ghosted.evaluation.intervals import mean_interval

    metrics = score.as_metrics()
    rows = []
    for metric, values in (("acc", [float(c) for c in score.correct]), ("loglikelihood", score.logprobs)):
        interval = mean_interval(values) if values else None
        rows.append({"model": model, "task": task, "metric": metric, "value": metrics[metric],
                     "stderr": metrics[f"{metric}_stderr"], "low": interval.low if interval else None,
                     "high": interval.high if interval else None})
    return rows


def _harness_rows(models, tokenizer, tasks, limit, num_fewshot, batch_size, progress
                  ) -> tuple[pd.DataFrame, dict[str, dict], dict[str, str]]:
    """lm-eval tasks, one model at a time: (rows, protocols, {task: why skipped})."""
    from ghosted.evaluation.tasks import BUNDLED_TASKS, TASKS_DIR

    try:
        lm_eval, HFLM, TaskManager = _lm_eval()
    except ZeroShotUnavailable as err:
        return pd.DataFrame(columns=FRAME_COLUMNS), {}, {t: str(err) for t in tasks}
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=any(t not in BUNDLED_TASKS for t in tasks))
    ok, skipped = loadable_tasks(tasks, manager)
    cfg = ZeroShotConfig(tasks=ok, num_fewshot=num_fewshot, batch_size=batch_size, limit=limit)
    rows, protocols = [], {}
    for name, model in counted(list(models.items()) if ok else [], progress, f"lm-eval {', '.join(ok)}"):
        out = _simple_evaluate(lm_eval, HFLM, model, tokenizer, ok, manager, cfg)
        rows += _harness_metrics(name, out["results"], ok, _examples(out))
        protocols = {t: _harness_protocol(t, out, num_fewshot) for t in ok}
    return pd.DataFrame(rows, columns=FRAME_COLUMNS), protocols, skipped


def _examples(out: dict) -> dict[str, int]:
    """Task -> examples scored, from lm-eval's output (0 where it does not say)."""
    return {task: int(n.get("effective") or 0) for task, n in out.get("n-samples", {}).items()}


def _harness_metrics(model: str, results: dict, tasks: list[str], examples: dict[str, int] | None = None
                     ) -> list[dict]:
    """Rows for acc, acc_norm and loglikelihood (filter "none"), where the task reports them; the 95 %
    interval is ±1.96·stderr where lm-eval reports a stderr (``intervals.normal_interval``)."""
    from ghosted.evaluation.intervals import normal_interval

    rows = []
    for task in tasks:
        scores = results.get(task, {})
        for metric in METRICS:
            if f"{metric},none" in scores:
                err = scores.get(f"{metric}_stderr,none")
                value = float(scores[f"{metric},none"])
                stderr = float(err) if isinstance(err, (int, float)) else math.nan
                units = (examples or {}).get(task) or 2  # a stderr lm-eval reports stands for >= 2 examples
                interval = normal_interval(value, stderr, units)
                rows.append({"model": model, "task": task, "metric": metric, "value": value, "stderr": stderr,
                             "low": interval.low, "high": interval.high})
    return rows


def _harness_protocol(task: str, out: dict, num_fewshot: int) -> dict:
    """Task, version, examples scored, few-shot count and metrics, from lm-eval's output."""
    scores = out["results"].get(task, {})
    return {"task": task, "version": out.get("versions", {}).get(task),
            "examples": out.get("n-samples", {}).get(task, {}).get("effective"),
            "num_fewshot": out.get("n-shot", {}).get(task, num_fewshot), "metric": "acc",
            "metrics": [m for m in METRICS if f"{m},none" in scores],
            "scorer": f"lm-evaluation-harness {_harness_version()}"}


def _harness_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "(version unknown)"


def add_task_results(report: dict, models: dict[str, nn.Module], tokenizer, tasks: list[str],
                     limit: int | None = None, num_fewshot: int = 0, batch_size: int = 8,
                     progress: Progress | None = None) -> TaskRun | None:
    """Score ``tasks`` and put them in a run report: per entry ``tasks`` (+ ``task_average``), the
    protocols under ``protocol.tasks`` and the skipped tasks under ``tasks_skipped``."""
    if not tasks:
        return None
    run = evaluate_tasks(models, tokenizer, tasks, limit, num_fewshot, batch_size, progress)
    average = run.average()
    for entry in report["results"]:
        entry["tasks"] = run.metrics_of(entry["method"])
        if len(run.tasks) > 1 and entry["method"] in average:
            entry["task_average"] = float(average[entry["method"]])
    report["protocol"]["tasks"] = list(run.protocols.values())
    report["tasks_skipped"] = run.skipped
    return run


def task_columns(report: dict) -> tuple[str, list[str]]:
    """(header, one cell string per result entry): accuracy (and normalised accuracy where the task
    has it) in % per task with its 95 % interval (± stderr where no interval is known), and the average
    accuracy over tasks."""
    columns = [(p["task"], m) for p in report.get("protocol", {}).get("tasks", [])
               for m in ("acc", "acc_norm") if m in (p.get("metrics") or ["acc"])]
    if not columns:
        return "", [""] * len(report["results"])
    average = any("task_average" in e for e in report["results"])
    header = "".join(f"{(m + ' ' + t)[:26]:>28}" for t, m in columns) + (f"{'acc avg':>10}" if average else "")
    cells = []
    for e in report["results"]:
        scores = e.get("tasks", {})
        text = "".join(f"{_pct(scores.get(t, {}), m):>28}" for t, m in columns)
        if average:
            text += f"{_pct({'acc': e.get('task_average')}, 'acc'):>10}"
        cells.append(text)
    return header, cells


def task_protocol_lines(report: dict) -> list[str]:
    """One line per task scored and per task skipped, for the printed report."""
    lines = [f"zero-shot: {p['task']} v{p.get('version')}, {p.get('examples')} examples, {p.get('num_fewshot')}-shot, "
             f"{'/'.join(p.get('metrics') or [p.get('metric')])} (% [95 % interval]), scored by {p.get('scorer')}"
             for p in report.get("protocol", {}).get("tasks", [])]
    return lines + [f"zero-shot: skipped {t}: {why}" for t, why in report.get("tasks_skipped", {}).items()]


def _pct(scores: dict, metric: str) -> str:
    """A score in %, with its interval "[low, high]" (or "± stderr" when only that is known)."""
    value, low, high = (scores.get(metric + k) for k in ("", "_low", "_high"))
    if value is None:
        return "n/a"
    if low is not None and high is not None:
        return f"{100 * value:.2f} [{100 * low:.2f}, {100 * high:.2f}]"
    stderr = scores.get(metric + "_stderr")
    return f"{100 * value:.2f}" + ("" if stderr is None or math.isnan(stderr) else f" ± {100 * stderr:.2f}")

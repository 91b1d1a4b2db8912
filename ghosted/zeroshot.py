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
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from torch import nn

PAPER_TASKS = ["arc_easy", "arc_challenge", "hellaswag", "winogrande", "boolq", "openbookqa", "rte",
               "copa", "race"]  # the paper's nine zero-shot tasks (lm-eval names)
Progress = Callable[[str], None]  # one line per model


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
    """Zero-shot accuracy of each in-memory model on ``config.tasks``; models are not modified."""
    cfg = config or ZeroShotConfig()
    lm_eval, HFLM, TaskManager = _lm_eval()
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    manager = TaskManager(include_path=cfg.include_path, include_defaults=cfg.include_defaults)
    tasks, skipped = loadable_tasks(cfg.tasks, manager)
    for task, why in skipped.items():
        (progress or print)(f"zero-shot: skipping {task}: {why}")
    rows = []
    for name, model in models.items() if tasks else []:
        if progress:
            progress(f"zero-shot: {name} on {', '.join(tasks)}")
        wrapped = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=cfg.batch_size)
        out = lm_eval.simple_evaluate(
            model=wrapped, tasks=tasks, num_fewshot=cfg.num_fewshot, limit=cfg.limit, task_manager=manager,
            log_samples=False, bootstrap_iters=cfg.bootstrap_iters, random_seed=cfg.seed,
            numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed)
        rows += _rows(name, out["results"], tasks, cfg.metric)
    return ZeroShotResult(pd.DataFrame(rows, columns=["model", "task", "metric", "value", "stderr"]), skipped)


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

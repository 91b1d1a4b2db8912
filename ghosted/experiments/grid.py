"""The reproduction grid: selection criterion x layers removed x every recovery method, on two texts.

The paper's perplexity table (its Table 3) compares methods across criteria (LLM-Streamline,
ShortGPT) and pruning ratios (7 and 11 of 32 layers). This module runs the same grid on one model:

  1. one calibration draw (fit + held-out windows) serves everything;
  2. one influence pass scores every criterion for every n, then each (criterion, n) picks its layers;
  3. per distinct layer set, one ``recover`` call fits every method from a single calibration pass;
  4. per evaluation text, ``shared_prefix.perplexities`` scores all recovered models, sharing the
     layers before the first patched one; the dense model is scored once per text.

``GridResult.frame`` is tidy (one row per setting x method x text); ``markdown()`` renders the table
that docs/REPRODUCTION.md embeds, ``save()`` writes grid.csv, grid.md and grid.json.

Finished work is kept: with an output folder, every finished part (the layers each selection chose,
the dense rows, each layer set's cell) is appended to ``grid.jsonl`` as it finishes and the csv/md/json
files are rewritten; ``resume=True`` takes every part whose key and settings match from that journal
instead of computing it again, and a Ctrl-C leaves the finished cells on disk.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from torch import nn

from ghosted.experiments import validate
from ghosted.core.progress import Progress, Say, lines
from ghosted.evaluation.perplexity import perplexity
from ghosted.models.loading import LoadedModel, load_model
from ghosted.experiments.spec import ExperimentSpec
from ghosted.experiments.run import result_entry
from ghosted.models.loading import versions
from ghosted.models.pruning import format_layers
from ghosted.recovery.fitting import BRANCH_METHODS, METHODS, recover
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.data.windows import TokenWindows, capped_evaluation_windows

ALIASES = {  # the paper's selections, as its released code computes them (sequence-axis cosine)
    "streamline": "seqcos_streamline",
    "shortgpt": "seqcos_shortgpt",
}


def grid_base() -> ExperimentSpec:
    """The settings every cell of the grid shares: a run's defaults, with every method and 8192 tokens
    per evaluation text."""
    return ExperimentSpec().with_options(methods=["dense", *METHODS], eval_tokens=8192)


GRID_AXES = ("selections", "n_values", "evals")  # what the grid varies, besides the methods


@dataclass
class GridConfig:
    """The grid: the shared experiment settings (``base``) and the axes. Defaults: the paper's grid, its
    protocol scaled down to fit a CPU. ``base.layers`` is unused (the axes choose the layers)."""

    base: ExperimentSpec = field(default_factory=grid_base)  # model, calibration, evaluation size, methods
    selections: list[str] = field(default_factory=lambda: ["streamline", "shortgpt"])  # ALIASES keys
    # or any ghosted.selection.criteria.CRITERIA name (e.g. streamline_cosine, block_influence)
    n_values: list[int] = field(default_factory=lambda: [7, 11])  # layers removed (paper: 7 and 11 of 32)
    evals: list[str] = field(default_factory=lambda: ["bundled:wiki", "bundled:news"])  # (paper: WikiText-2, PTB, C4)

    @classmethod
    def of(cls, **options) -> GridConfig:
        """A grid from flat names: its axes, and the spec's flat names (``calib_seqs=8``) over ``grid_base()``."""
        axes = {name: list(options.pop(name)) for name in GRID_AXES if name in options}
        return cls(base=grid_base().with_options(**options), **axes)

    def flat(self) -> SimpleNamespace:
        """The base's settings and the axes under the command line's flat names (for the checks)."""
        return SimpleNamespace(**self.base.options(), **{name: getattr(self, name) for name in GRID_AXES})

    def criterion(self, selection: str) -> str:
        from ghosted.selection.criteria import resolve_criterion

        return resolve_criterion(selection)  # ALIASES, and the other names people use (bi, angular, ...)


@dataclass
class GridResult:
    """One row per (selection, n, method, evaluation text), plus the protocol and timings."""

    frame: pd.DataFrame
    meta: dict
    tasks: pd.DataFrame | None = None  # zero-shot scores: selection, n, layers, model (method), task, metric, ...

    def markdown(self) -> str:
        return to_markdown(self.frame, self.meta) + task_markdown(self.tasks)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write grid.csv (tidy rows), grid.md (tables) and grid.json (rows + meta) into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "grid.csv", out / "grid.md", out / "grid.json"]
        self.frame.to_csv(paths[0], index=False)
        paths[1].write_text(self.markdown() + "\n")
        rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                for r in self.frame.to_dict("records")]
        tasks = [] if self.tasks is None else self.tasks.to_dict("records")
        paths[2].write_text(json.dumps({"meta": self.meta, "rows": rows, "tasks": tasks}, indent=2, default=str))
        if tasks:
            paths.append(out / "grid_tasks.csv")
            self.tasks.to_csv(paths[-1], index=False)
        return paths


def choose_layers(model: nn.Module, cfg: GridConfig, fit, held, progress: Progress | None = None
                  ) -> dict[tuple[str, int], tuple[list[int], str]]:
    """(selection, n) -> (layers, reason), every criterion from one influence pass."""
    from ghosted.selection.criteria import InfluenceConfig, influence
    from ghosted.selection.rules import select

    criteria = list(dict.fromkeys(cfg.criterion(s) for s in cfg.selections))
    report = influence(model, fit, InfluenceConfig(metrics=criteria, n_values=list(cfg.n_values),
                                                   batch_size=cfg.base.calibration.batch_size), heldout=held,
                       progress=progress)
    return {(s, n): select(report, cfg.criterion(s), n) for s in cfg.selections for n in cfg.n_values}


def applicable(methods: list[str], layers: list[int]) -> tuple[list[str], list[str]]:
    """(methods that can recover ``layers``, notes on those that cannot)."""
    if 0 not in layers:
        return methods, []
    skipped = [m for m in methods if m in BRANCH_METHODS]
    note = [f"{', '.join(skipped)}: no layer before layer 0 to carry ReplaceMe's map"] if skipped else []
    return [m for m in methods if m not in BRANCH_METHODS], note


def evaluate_setting(model: nn.Module, layers: list[int], methods: list[str], fit, held,
                     evals: dict[str, TokenWindows], cfg: GridConfig, progress: Progress | None, tokenizer=None
                     ) -> tuple[list[dict], dict, object]:
    """Rows (method x text) for one layer set: one calibration pass, shared-prefix evaluation; and the
    zero-shot scores of every method (a ``TaskRun``, None without tasks)."""
    started = time.perf_counter()
    run = recover(model, layers, methods, fit, held, cfg.base.recovery_config(), progress=progress,
                  cache=cfg.base.calibration.cache)
    fitted = time.perf_counter()
    errors = run.errors()
    models = {name: r.model for name, r in run.results.items()}
    rows = []
    for source, windows in evals.items():
        results = perplexities(models, windows, batch_size=cfg.base.calibration.batch_size, progress=progress)
        for name, model_ in models.items():
            rows.append(_row(source, result_entry(name, results[name], run, errors, model_)))
    tasks = score_tasks(models, tokenizer, cfg, progress)
    timing = {"fit_seconds": round(fitted - started, 1), "eval_seconds": round(time.perf_counter() - fitted, 1)}
    return rows, timing, tasks


def score_tasks(models: dict[str, nn.Module], tokenizer, cfg: GridConfig, progress: Progress | None):
    """The base's tasks scored on ``models`` (a ``TaskRun``), or None when the grid has no tasks."""
    ev = cfg.base.evaluation
    if not ev.tasks:
        return None
    from ghosted.evaluation.zeroshot import evaluate_tasks

    return evaluate_tasks(models, tokenizer, ev.tasks, ev.task_limit, ev.num_fewshot,
                          batch_size=cfg.base.calibration.batch_size, progress=progress)


class GridJournal:
    """The finished parts of a grid, one JSON line each in ``grid.jsonl``, appended as each finishes.

    A record is ``{"kind", "settings", "key", ...payload}``: ``settings`` is a digest of everything
    that changes a result (``settings_digest``), ``key`` says which part it is (a selection and n, a
    dense text, or a cell: its layers, methods and texts). ``resume=False`` starts a new journal.
    """

    def __init__(self, out_dir: str | Path, resume: bool = False):
        self.path = Path(out_dir) / "grid.jsonl"
        self.records = self._read() if resume else []
        if not resume and self.path.exists():
            self.path.unlink()

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut short by a crash: that part is simply done again
                continue
        return records

    def find(self, kind: str, settings: str, key: dict) -> dict | None:
        """The latest record of this part under these settings, or None."""
        want = json.loads(json.dumps(key, default=str))
        for record in reversed(self.records):
            if (record.get("kind"), record.get("settings"), record.get("key")) == (kind, settings, want):
                return record
        return None

    def add(self, kind: str, settings: str, key: dict, **payload) -> None:
        """Append one finished part (flushed and synced, so a crash right after keeps it)."""
        record = json.loads(json.dumps({"kind": kind, "settings": settings, "key": key, **payload},
                                       default=_plain))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records.append(record)


def _plain(value):
    """JSON for what the rows may hold besides plain types (numpy numbers, paths)."""
    return value.item() if hasattr(value, "item") else str(value)


def settings_digest(cfg: GridConfig, lm: LoadedModel) -> str:
    """What every result of the grid depends on: the settings (not which cells, nor the cache) and
    the model's identity (so a changed checkpoint at the same path is not mistaken for the old one)."""
    from ghosted.calibration.cache import model_identity

    which_cells = ("selections", "n_values", "methods", "evals", "cache")  # part of each record's key instead
    settings = {k: v for k, v in vars(cfg.flat()).items() if k not in which_cells}
    settings["model_identity"] = model_identity(lm.model)
    settings["model_name"] = lm.name
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:24]


def run_grid(cfg: GridConfig, loaded: LoadedModel | None = None, progress: Progress | None = None,
             out_dir: str | Path | None = None, resume: bool = False) -> GridResult:
    """Run the whole grid (see the module docstring). ``loaded`` skips loading ``cfg.base.model``.

    ``out_dir``: journal each finished part to ``out_dir/grid.jsonl`` and rewrite the csv/md/json files
    after each; ``resume``: take the parts the journal already holds. If the grid is stopped (Ctrl-C or
    an error) after the model is loaded, the exception goes on with ``partial_result``: a GridResult
    of the finished cells (``meta["complete"]`` False).
    """
    validate.check_grid(cfg)  # before loading
    state = _GridState(cfg, time.perf_counter(), out_dir)
    try:
        return _run_grid(cfg, loaded, progress, state, resume)
    except BaseException as err:  # Ctrl-C included: what finished is on disk; hand it over too
        if state.meta and isinstance(err, (Exception, KeyboardInterrupt)):
            err.partial_result = state.result(complete=False)
        raise


@dataclass
class _GridState:
    """The grid so far: rows of the finished cells, and the meta."""

    cfg: GridConfig
    started: float
    out_dir: str | Path | None
    meta: dict = field(default_factory=dict)
    chosen: dict = field(default_factory=dict)  # (selection, n) -> (layers, reason)
    dense: dict = field(default_factory=dict)  # eval text -> row
    cells: dict = field(default_factory=dict)  # layers tuple -> rows
    tasks: dict = field(default_factory=dict)  # "dense" or layers tuple -> task_record(...) (None: no tasks)

    def result(self, complete: bool) -> GridResult:
        rows, task_rows = [], []
        for (selection, n), (layers, _) in self.chosen.items():
            setting = {"selection": selection, "criterion": self.cfg.criterion(selection), "n": n,
                       "layers": format_layers(layers)}
            cell = self.cells.get(tuple(layers))
            if cell is not None or not [m for m in self.cfg.base.methods if m != "dense"]:
                rows += [{**setting, **r} for r in [*self.dense.values(), *(cell or [])]]
                scored = (self.tasks.get("dense"), self.tasks.get(tuple(layers)))
                task_rows += [{**r, **setting} for record in scored if record for r in record["rows"]]
        meta = {**self.meta, "complete": complete, "versions": versions(),
                "seconds": round(time.perf_counter() - self.started, 1)}
        records = [r for r in self.tasks.values() if r]
        if records:
            meta["tasks"] = {"protocols": {t: p for r in records for t, p in r["protocols"].items()},
                             "skipped": {t: why for r in records for t, why in r["skipped"].items()}}
        return GridResult(pd.DataFrame(rows), meta, pd.DataFrame(task_rows) if task_rows else None)

    def saved(self) -> None:
        """Rewrite the output files with every finished cell (complete or not)."""
        if self.out_dir is not None:
            self.result(complete=False).save(self.out_dir)


def _run_grid(cfg: GridConfig, loaded, progress: Progress | None, state: _GridState, resume: bool) -> GridResult:
    say = lines(progress)  # one line per part of the grid, between the bars of its work
    lm = loaded or load_model(cfg.base.model.source, device=cfg.base.model.device, dtype=cfg.base.model.dtype)
    validate.check_grid_model(cfg, validate.facts_of_model(lm.model))  # before any forward pass
    journal = GridJournal(state.out_dir, resume) if state.out_dir is not None else None
    settings = settings_digest(cfg, lm)
    fit, held = cfg.base.calibration.windows(lm.tokenizer)
    evals, protocol = _evaluation_texts(lm.tokenizer, cfg, say)
    state.meta = {"config": vars(cfg.flat()), "spec": cfg.base.to_dict(),  # config: flat names, for reading
                  "model": lm.name, "influence_seconds": 0.0, "selections": {},
                  "calibration": fit.protocol, "evaluation": {s: w.protocol for s, w in evals.items()},
                  "notes": [], "settings": {}, "resumed": [], "protocol": protocol}
    state.chosen = _chosen_layers(lm.model, cfg, fit, held, journal, settings, state, progress)
    state.meta["selections"] = {f"{s} {n}": {"criterion": cfg.criterion(s), "layers": format_layers(lay),
                                             "reason": why} for (s, n), (lay, why) in state.chosen.items()}
    if "dense" in cfg.base.methods:
        _dense_rows(lm.model, cfg, evals, say, progress, journal, settings, state)
        _dense_tasks(lm, cfg, progress, journal, settings, state)
    recovery = [m for m in dict.fromkeys(cfg.base.methods) if m != "dense"]
    for (selection, n), (layers, _) in state.chosen.items():
        key = tuple(layers)
        if key in state.cells or not recovery:
            continue
        methods, notes = applicable(recovery, layers)
        cell_key = {"layers": list(layers), "methods": methods, "evals": list(evals)}
        record = journal.find("cell", settings, cell_key) if journal else None
        if record is not None:
            say(f"{selection} n={n}: layers {format_layers(layers)}, finished earlier (resumed)")
            state.cells[key], timing = record["rows"], record["timing"]
            state.tasks[key] = record.get("tasks")
            state.meta["resumed"].append(format_layers(layers))
        else:
            say(f"{selection} n={n}: layers {format_layers(layers)}, {len(methods)} methods")
            state.cells[key], timing, tasks = evaluate_setting(lm.model, layers, methods, fit, held, evals, cfg,
                                                               progress, tokenizer=lm.tokenizer)
            state.tasks[key] = task_record(tasks)
            if journal:
                journal.add("cell", settings, cell_key, rows=state.cells[key], timing=timing, tasks=state.tasks[key])
        state.meta["settings"][format_layers(layers)] = timing
        state.meta["notes"] += [f"{selection} {n} (layers {format_layers(layers)}): {x}" for x in notes]
        state.saved()
    result = state.result(complete=True)
    if state.out_dir is not None:
        result.save(state.out_dir)
    return result


def _chosen_layers(model: nn.Module, cfg: GridConfig, fit, held, journal: GridJournal | None, settings: str,
                   state: _GridState, progress: Progress | None) -> dict:
    """(selection, n) -> (layers, reason): from the journal when every one is there, else one influence pass."""
    say = lines(progress)
    wanted = [(s, n) for s in cfg.selections for n in cfg.n_values]
    found = {w: journal.find("selection", settings, {"selection": w[0], "n": w[1]}) if journal else None
             for w in wanted}
    if all(found.values()):
        say("layers chosen earlier (resumed): " + ", ".join(f"{s} {n}" for s, n in wanted))
        return {w: (r["layers"], r["reason"]) for w, r in found.items()}
    say("influence pass: " + ", ".join(cfg.criterion(s) for s in cfg.selections))
    t0 = time.perf_counter()
    chosen = choose_layers(model, cfg, fit, held, progress)
    state.meta["influence_seconds"] = round(time.perf_counter() - t0, 1)
    for (s, n), (layers, why) in chosen.items():
        if journal:
            journal.add("selection", settings, {"selection": s, "n": n}, layers=list(layers), reason=why)
    return chosen


def _evaluation_texts(tokenizer, cfg: GridConfig, say: Say) -> tuple[dict[str, TokenWindows], dict]:
    """({text: windows}, the protocol as a report field): a named preset, or ``cfg.evals`` capped."""
    from ghosted.evaluation.protocols import EvalProtocol, describe_protocol, protocol_windows, resolve_protocol

    ev, calib = cfg.base.evaluation, cfg.base.calibration.source
    if ev.protocol:
        protocol = resolve_protocol(ev.protocol, "", ev.tokens, ev.window)
        evals, skipped = protocol_windows(tokenizer, protocol, say, calibration_source=calib)
        return evals, describe_protocol(protocol, skipped)
    evals = {s: capped_evaluation_windows(tokenizer, s, ev.tokens, ev.window, calib) for s in cfg.evals}
    custom = EvalProtocol("custom", tuple(cfg.evals), ev.window, ev.tokens, "texts given with --evals")
    return evals, describe_protocol(custom)


def task_record(run) -> dict | None:
    """A ``TaskRun`` as plain JSON (its frame's rows, protocols and skipped tasks), None without tasks."""
    if run is None:
        return None
    return {"rows": run.frame.to_dict("records"), "protocols": run.protocols, "skipped": run.skipped}


def _dense_tasks(lm: LoadedModel, cfg: GridConfig, progress: Progress | None, journal: GridJournal | None,
                 settings: str, state: _GridState) -> None:
    """The dense model's zero-shot scores, once for the whole grid (or resumed)."""
    if not cfg.base.evaluation.tasks:
        return
    record = journal.find("dense-tasks", settings, {"tasks": cfg.base.evaluation.tasks}) if journal else None
    if record is None:
        record = {"tasks": task_record(score_tasks({"dense": lm.model}, lm.tokenizer, cfg, progress))}
        if journal:
            journal.add("dense-tasks", settings, {"tasks": cfg.base.evaluation.tasks}, tasks=record["tasks"])
    state.tasks["dense"] = record["tasks"]


def _dense_rows(model: nn.Module, cfg: GridConfig, evals: dict, say: Say, progress: Progress | None,
                journal: GridJournal | None = None, settings: str = "", state: _GridState | None = None) -> dict:
    """The dense model's perplexity on each text, computed once for the whole grid (or resumed)."""
    rows = state.dense if state is not None else {}
    for source, windows in evals.items():
        record = journal.find("dense", settings, {"eval": source}) if journal else None
        if record is not None:
            say(f"dense on {source}: finished earlier (resumed)")
            rows[source] = record["row"]
            continue
        say(f"dense on {source}")
        res = perplexity(model, windows, batch_size=cfg.base.calibration.batch_size, progress=progress, label="dense")
        rows[source] = _row(source, result_entry("dense", res, None, None, model))
        if journal:
            journal.add("dense", settings, {"eval": source}, row=rows[source])
    return rows


def _row(source: str, entry: dict) -> dict:
    """A grid row: the evaluation text and a report entry without its protocol (kept in the meta)."""
    return {"eval": source, **{k: v for k, v in entry.items() if k != "protocol"}}


def to_markdown(frame: pd.DataFrame, meta: dict) -> str:
    """One table per evaluation text: rows = selection x n, columns = methods; best recovery in bold."""
    if frame.empty:
        return "(empty grid)"
    methods = list(dict.fromkeys(frame.method))
    parts = []
    for source in dict.fromkeys(frame["eval"]):
        proto = meta.get("evaluation", {}).get(source, {})
        parts.append(f"**Perplexity on {source}** ({proto.get('scored_tokens', '?')} tokens scored in "
                     f"{proto.get('n_windows', '?')} windows of {proto.get('seq_len', '?')}; lower is better)\n")
        parts.append("| selection | n | layers | " + " | ".join(methods) + " |")
        parts.append("|---|---|---|" + "---|" * len(methods))
        sub = frame[frame["eval"] == source]
        for (selection, n, layers), group in sub.groupby(["selection", "n", "layers"], sort=False):
            ppl = dict(zip(group.method, group.ppl))
            recovered = {m: v for m, v in ppl.items() if m not in ("dense", "none")}
            best = min(recovered, key=recovered.get) if recovered else None
            cells = [_cell(ppl.get(m), m == best) for m in methods]
            parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts).rstrip()


def task_markdown(tasks: pd.DataFrame | None) -> str:
    """One accuracy table per task (% ± stderr), rows = selection x n, columns = methods; and the
    average over tasks when there are several (the paper's AVG). Empty without tasks."""
    if tasks is None or tasks.empty:
        return ""
    acc = tasks[tasks.metric == "acc"]
    names = list(dict.fromkeys(acc.task))
    parts = [""]
    for task in [*names, "average"] if len(names) > 1 else names:
        sub = acc[acc.task == task] if task != "average" else \
            acc.groupby(["selection", "n", "layers", "model"], sort=False, as_index=False).value.mean()
        methods = list(dict.fromkeys(sub.model))
        what = f"Zero-shot accuracy on {task}" if task != "average" else "Zero-shot accuracy, average over tasks"
        parts += [f"\n**{what}** (%, higher is better)\n", "| selection | n | layers | " + " | ".join(methods) + " |",
                  "|---|---|---|" + "---|" * len(methods)]
        for (selection, n, layers), group in sub.groupby(["selection", "n", "layers"], sort=False):
            cells = {r.model: _acc_cell(r.value, getattr(r, "stderr", None)) for r in group.itertuples()}
            parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells.get(m, "n/a") for m in methods) + " |")
    return "\n".join(parts)


def _acc_cell(value: float, stderr: float | None) -> str:
    err = "" if stderr is None or math.isnan(stderr) else f" ± {100 * stderr:.1f}"
    return f"{100 * value:.1f}{err}"


def _cell(value: float | None, bold: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    text = f"{value:.2f}" if value < 1000 else f"{value:.3g}"
    return f"**{text}**" if bold else text

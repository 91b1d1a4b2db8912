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

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ghosted.experiments import validate
from ghosted.core.progress import Progress, Say, lines
from ghosted.models.loading import LoadedModel
from ghosted.experiments.journal import GridJournal, settings_digest
from ghosted.experiments.session import Session
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.loading import versions
from ghosted.models.pruning import format_layers
from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import BRANCH_METHODS

ALIASES = {  # the paper's selections, as its released code computes them (sequence-axis cosine)
    "streamline": "seqcos_streamline",
    "shortgpt": "seqcos_shortgpt",
}


def grid_base() -> ExperimentSpec:
    """The settings every cell of the grid shares: a run's defaults, with every method and 8192 tokens
    per evaluation text."""
    return ExperimentSpec().with_options(methods=list(registry.REGISTRY), eval_tokens=8192)


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


def choose_layers(session: Session, cfg: GridConfig) -> dict[tuple[str, int], tuple[list[int], str]]:
    """(selection, n) -> (layers, reason), every criterion from one influence pass on the session's windows."""
    from ghosted.selection.rules import select

    criteria = list(dict.fromkeys(cfg.criterion(s) for s in cfg.selections))
    report = session.influence(metrics=criteria, n_values=list(cfg.n_values))
    return {(s, n): select(report, cfg.criterion(s), n) for s in cfg.selections for n in cfg.n_values}


def applicable(methods: list[str], layers: list[int]) -> tuple[list[str], list[str]]:
    """(methods that can recover ``layers``, notes on those that cannot)."""
    if 0 not in layers:
        return methods, []
    skipped = [m for m in methods if m in BRANCH_METHODS]
    note = [f"{', '.join(skipped)}: no layer before layer 0 to carry ReplaceMe's map"] if skipped else []
    return [m for m in methods if m not in BRANCH_METHODS], note


@dataclass
class GridContext:
    """What every part of a grid reads: its settings, the session (model, windows), where finished
    parts are journaled, the digest of the settings, the state so far and the progress lines."""

    cfg: GridConfig
    session: Session  # the model and the calibration and evaluation windows, drawn once
    journal: GridJournal | None  # None: no output folder, nothing journaled or resumed
    settings: str  # settings_digest(): what every journaled part is keyed under
    state: _GridState
    say: Say  # one line per part of the grid, between the bars of its work

    @property
    def texts(self) -> list[str]:
        return list(self.session.evaluation(self.cfg.evals).texts)

    def find(self, kind: str, key: dict) -> dict | None:
        return self.journal.find(kind, self.settings, key) if self.journal else None

    def add(self, kind: str, key: dict, **payload) -> None:
        if self.journal:
            self.journal.add(kind, self.settings, key, **payload)


def evaluate_setting(ctx: GridContext, layers: list[int], methods: list[str]) -> tuple[list[dict], dict, object]:
    """Rows (method x text) for one layer set: the session's fit (one calibration pass) and its
    shared-prefix evaluation; and the zero-shot scores of every method (a ``TaskRun``, None without tasks)."""
    started = time.perf_counter()
    fitted = ctx.session.fit(layers, methods)
    done = time.perf_counter()
    # the reference (dense) in the same pass gives each method's KL and top-1 agreement; its own rows are
    # the grid's dense rows, scored once per text, so they are left out here
    table = ctx.session.evaluate(fitted, reference=True, texts=ctx.cfg.evals)
    tasks = ctx.session.tasks(fitted.models)
    timing = {"fit_seconds": round(done - started, 1), "eval_seconds": round(time.perf_counter() - done, 1)}
    return [r for r in table.records() if r["method"] in fitted.models], timing, tasks


def run_grid(cfg: GridConfig, loaded: LoadedModel | None = None, progress: Progress | None = None,
             out_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False) -> GridResult:
    """Run the whole grid (see the module docstring). ``loaded`` skips loading ``cfg.base.model``.

    ``out_dir``: journal each finished part to ``out_dir/grid.jsonl`` and rewrite the csv/md/json files
    after each; ``resume``: take the parts the journal already holds; ``overwrite``: start a new grid
    over an earlier one (see ``GridJournal``). If the grid is stopped (Ctrl-C or
    an error) after the model is loaded, the exception goes on with ``partial_result``: a GridResult
    of the finished cells (``meta["complete"]`` False).
    """
    validate.check_grid(cfg)  # before loading
    if out_dir is not None:
        GridJournal.check(out_dir, resume, overwrite)
    state = _GridState(cfg, time.perf_counter(), out_dir)
    try:
        return _run_grid(cfg, loaded, progress, state, resume, overwrite)
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
            if cell is not None or not registry.with_role(self.cfg.base.methods, registry.BASELINE, registry.RECOVERY):
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


def _run_grid(cfg: GridConfig, loaded, progress: Progress | None, state: _GridState, resume: bool,
              overwrite: bool = False) -> GridResult:
    session = Session(cfg.base, loaded, progress)  # loads cfg.base.model unless given
    validate.check_grid_model(cfg, validate.facts_of_model(session.lm.model))  # before any forward pass
    journal = GridJournal(state.out_dir, resume, overwrite) if state.out_dir is not None else None
    ctx = GridContext(cfg, session, journal, settings_digest(cfg, session.lm), state, lines(progress))
    windows, evaluation = session.calibration(), session.evaluation(cfg.evals)
    state.meta = {"config": vars(cfg.flat()), "spec": cfg.base.to_dict(),  # config: flat names, for reading
                  "model": session.lm.name, "influence_seconds": 0.0, "selections": {},
                  "calibration": windows.fit.protocol,
                  "evaluation": {s: w.protocol for s, w in evaluation.texts.items()},
                  "notes": [], "settings": {}, "resumed": [], "protocol": evaluation.protocol}
    state.chosen = _chosen_layers(ctx)
    state.meta["selections"] = {f"{s} {n}": {"criterion": cfg.criterion(s), "layers": format_layers(lay),
                                             "reason": why} for (s, n), (lay, why) in state.chosen.items()}
    if registry.with_role(cfg.base.methods, registry.REFERENCE):
        _reference_rows(ctx)
        _reference_tasks(ctx)
    fitted = session.fitted_methods()
    for (selection, n), (layers, _) in state.chosen.items():
        if tuple(layers) not in state.cells and fitted:
            _layer_set(ctx, selection, n, layers, fitted)
    result = state.result(complete=True)
    if state.out_dir is not None:
        result.save(state.out_dir)
    return result


def _layer_set(ctx: GridContext, selection: str, n: int, layers: list[int], fitted: list[str]) -> None:
    """One layer set's rows: from the journal, or fitted and evaluated now (and journaled)."""
    state, key, text = ctx.state, tuple(layers), format_layers(layers)
    methods, notes = applicable(fitted, layers)
    cell_key = {"layers": list(layers), "methods": methods, "evals": ctx.texts}
    record = ctx.find("cell", cell_key)
    if record is not None:
        ctx.say(f"{selection} n={n}: layers {text}, finished earlier (resumed)")
        state.cells[key], timing = record["rows"], record["timing"]
        state.tasks[key] = record.get("tasks")
        state.meta["resumed"].append(text)
    else:
        ctx.say(f"{selection} n={n}: layers {text}, {len(methods)} methods")
        state.cells[key], timing, tasks = evaluate_setting(ctx, layers, methods)
        state.tasks[key] = task_record(tasks)
        ctx.add("cell", cell_key, rows=state.cells[key], timing=timing, tasks=state.tasks[key])
    state.meta["settings"][text] = timing
    state.meta["notes"] += [f"{selection} {n} (layers {text}): {x}" for x in notes]
    state.saved()


def _chosen_layers(ctx: GridContext) -> dict:
    """(selection, n) -> (layers, reason): from the journal when every one is there, else one influence pass."""
    cfg = ctx.cfg
    wanted = [(s, n) for s in cfg.selections for n in cfg.n_values]
    found = {w: ctx.find("selection", {"selection": w[0], "n": w[1]}) for w in wanted}
    if all(found.values()):
        ctx.say("layers chosen earlier (resumed): " + ", ".join(f"{s} {n}" for s, n in wanted))
        return {w: (r["layers"], r["reason"]) for w, r in found.items()}
    ctx.say("influence pass: " + ", ".join(cfg.criterion(s) for s in cfg.selections))
    t0 = time.perf_counter()
    chosen = choose_layers(ctx.session, cfg)
    ctx.state.meta["influence_seconds"] = round(time.perf_counter() - t0, 1)
    for (s, n), (layers, why) in chosen.items():
        ctx.add("selection", {"selection": s, "n": n}, layers=list(layers), reason=why)
    return chosen


def task_record(run) -> dict | None:
    """A ``TaskRun`` as plain JSON (its frame's rows, protocols and skipped tasks), None without tasks."""
    if run is None:
        return None
    return {"rows": run.frame.to_dict("records"), "protocols": run.protocols, "skipped": run.skipped}


def _reference_tasks(ctx: GridContext) -> None:
    """The dense model's zero-shot scores, once for the whole grid (or resumed)."""
    tasks = ctx.cfg.base.evaluation.tasks
    if not tasks:
        return
    record = ctx.find("dense-tasks", {"tasks": tasks})
    if record is None:
        record = {"tasks": task_record(ctx.session.tasks(ctx.session.models()))}
        ctx.add("dense-tasks", {"tasks": tasks}, tasks=record["tasks"])
    ctx.state.tasks["dense"] = record["tasks"]


def _reference_rows(ctx: GridContext) -> None:
    """The dense model's perplexity on each text, computed once for the whole grid (or resumed)."""
    rows = ctx.state.dense
    for source in ctx.texts:
        record = ctx.find("dense", {"eval": source})
        if record is not None:
            ctx.say(f"dense on {source}: finished earlier (resumed)")
            rows[source] = record["row"]
            continue
        ctx.say(f"dense on {source}")
        table = ctx.session.evaluate(texts=ctx.cfg.evals, on=source)
        rows[source] = table.records()[0]
        ctx.add("dense", {"eval": source}, row=rows[source])


def to_markdown(frame: pd.DataFrame, meta: dict) -> str:
    """One table per evaluation text: rows = selection x n, columns = methods; best recovery in bold."""
    if frame.empty:
        return "(empty grid)"
    methods = list(dict.fromkeys(frame.method))
    parts = []
    for source in dict.fromkeys(frame["eval"]):
        proto = meta.get("evaluation", {}).get(source, {})
        parts.append(f"**Perplexity on {source}** ({proto.get('scored_tokens', '?')} tokens scored in "
                     f"{proto.get('n_windows', '?')} windows of {proto.get('seq_len', '?')}; lower is better; "
                     "[95 % bootstrap interval over windows]; ns: the paired difference from none holds zero)\n")
        parts.append("| selection | n | layers | " + " | ".join(methods) + " |")
        parts.append("|---|---|---|" + "---|" * len(methods))
        sub = frame[frame["eval"] == source]
        for (selection, n, layers), group in sub.groupby(["selection", "n", "layers"], sort=False):
            ppl = dict(zip(group.method, group.ppl))
            recovered = {m: v for m, v in ppl.items() if registry.role_of(m) == registry.RECOVERY}
            best = min(recovered, key=recovered.get) if recovered else None
            rows = {r["method"]: r for r in group.to_dict("records")}
            cells = [_cell(ppl.get(m), m == best) + _interval_suffix(rows.get(m)) for m in methods]
            parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells) + " |")
        parts.append("")
        parts += fidelity_markdown(sub, methods, source)
    return "\n".join(parts).rstrip()


def _known(row: dict | None, key: str) -> bool:
    value = None if row is None else row.get(key)
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _interval_suffix(row: dict | None) -> str:
    """`` [low, high]`` (95 % bootstrap) and `` ns`` when the paired Δppl from the pruned model holds zero."""
    if not _known(row, "ppl_low"):
        return ""
    ns = " ns" if _known(row, "d_none_significant") and not row["d_none_significant"] else ""
    return f" [{row['ppl_low']:.2f}, {row['ppl_high']:.2f}]{ns}"


def fidelity_markdown(sub: pd.DataFrame, methods: list[str], source: str) -> list[str]:
    """A table of each method's KL from the dense model (nats per token) and top-1 agreement with it."""
    if "kl" not in sub or sub.kl.isna().all():
        return []
    shown = [m for m in methods if registry.role_of(m) != registry.REFERENCE]
    parts = [f"**Fidelity to the dense model on {source}** (mean per-token KL(dense ‖ model) in nats "
             "[95 % interval] · top-1 agreement; lower KL, higher agreement is closer)\n",
             "| selection | n | layers | " + " | ".join(shown) + " |", "|---|---|---|" + "---|" * len(shown)]
    for (selection, n, layers), group in sub.groupby(["selection", "n", "layers"], sort=False):
        rows = {r["method"]: r for r in group.to_dict("records")}
        cells = [f"{rows[m]['kl']:.3f} [{rows[m]['kl_low']:.3f}, {rows[m]['kl_high']:.3f}] · "
                 f"{100 * rows[m]['top1']:.1f}%" if _known(rows.get(m), "kl_low") else "n/a" for m in shown]
        parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells) + " |")
    return [*parts, ""]


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

"""The reproduction grid: selection criterion x layers removed x every recovery method, on two texts.

The paper's perplexity table (its Table 3) compares methods across criteria (LLM-Streamline,
ShortGPT) and pruning ratios (7 and 11 of 32 layers). This module runs the same grid on one model:

  1. one calibration draw (fit + held-out windows) serves everything;
  2. one influence pass scores every criterion for every n, then each (criterion, n) picks its layers;
  3. per distinct layer set, one session fit fits every method from a single calibration pass;
  4. per evaluation text, the session scores all recovered models through the shared prefix (the
     layers before the first patched one are run once); the dense model is scored once per text;
  5. with ``seeds`` K > 1, every layer set is fitted again on K - 1 other calibration draws (seeds
     ``seed + 1 .. seed + K - 1``; the layers stay those the first draw chose) and every row gains its
     perplexity's mean, standard deviation, min and max over the K draws.

``GridResult.frame`` is tidy (one row per setting x method x text); ``markdown()`` renders the tables
(``ghosted.grid.report``) that docs/REPRODUCTION.md embeds, ``save()`` writes grid.csv,
grid.md and grid.json.

Finished work is kept: with an output folder, every finished part (the layers each selection chose,
the dense rows, each layer set's cell on each draw) is appended to ``grid.jsonl`` as it finishes and the
csv/md/json files are rewritten; ``resume=True`` takes every part whose key and settings match from that
journal instead of computing it again, and a Ctrl-C leaves the finished cells on disk.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ghosted.core.progress import Progress, lines
from ghosted.experiments import validate
from ghosted.grid.report import seeds_markdown, task_markdown, to_markdown
from ghosted.grid.journal import GridJournal, settings_digest
from ghosted.experiments.seeds import summarize_seeds
from ghosted.experiments.session import Session
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.loading import LoadedModel, versions
from ghosted.models.pruning import format_layers
from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import BRANCH_METHODS

__all__ = ["ALIASES", "GridConfig", "GridResult", "applicable", "choose_layers", "evaluate_setting", "grid_base",
           "run_grid", "task_markdown", "task_record", "to_markdown"]

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
    seeds: int = 1  # calibration draws each cell is fitted on (seeds base seed .. + K - 1); 1: one draw, as a run

    @classmethod
    def of(cls, **options) -> GridConfig:
        """A grid from flat names: its axes, ``seeds``, and the spec's flat names (``calib_seqs=8``) over
        ``grid_base()``."""
        axes = {name: list(options.pop(name)) for name in GRID_AXES if name in options}
        draws = {"seeds": options.pop("seeds")} if "seeds" in options else {}
        return cls(base=grid_base().with_options(**options), **axes, **draws)

    def flat(self) -> SimpleNamespace:
        """The base's settings, the axes and ``seeds`` under the command line's flat names (for the checks)."""
        return SimpleNamespace(**self.base.options(), **{name: getattr(self, name) for name in GRID_AXES},
                               seeds=self.seeds)

    def criterion(self, selection: str) -> str:
        from ghosted.selection.criteria import resolve_criterion

        return resolve_criterion(selection)  # ALIASES, and the other names people use (bi, angular, ...)

    def draws(self) -> list[int]:
        """The calibration seeds every cell is fitted on, the first one (the base's seed) choosing the layers."""
        return [self.base.calibration.seed + i for i in range(self.seeds)]


@dataclass
class GridResult:
    """One row per (selection, n, method, evaluation text), plus the protocol and timings."""

    frame: pd.DataFrame
    meta: dict
    tasks: pd.DataFrame | None = None  # zero-shot scores: selection, n, layers, model (method), task, metric, ...

    def markdown(self) -> str:
        return to_markdown(self.frame, self.meta) + seeds_markdown(self.frame, self.meta) + task_markdown(self.tasks)

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


def applicable(methods: list[str], layers: list[int], model=None) -> tuple[list[str], list[str]]:
    """(methods that can recover ``layers`` of ``model``, notes on those that cannot)."""
    refused = registry.refusals(methods, model) if model is not None else {}
    notes = [f"{name} skipped: {why}" for name, why in refused.items()]
    methods = [m for m in methods if m not in refused]
    if 0 not in layers:
        return methods, notes
    skipped = [m for m in methods if m in BRANCH_METHODS]
    notes += [f"{', '.join(skipped)}: no layer before layer 0 to carry ReplaceMe's map"] if skipped else []
    return [m for m in methods if m not in BRANCH_METHODS], notes


def evaluate_setting(session: Session, layers: list[int], methods: list[str], evals: list[str],
                     tasks: bool = True) -> tuple[list[dict], dict, object]:
    """Rows (method x text) for one layer set on ``session``'s calibration draw: its fit (one calibration
    pass) and shared-prefix evaluation on ``evals``; timings; and the zero-shot scores of every method (a
    ``TaskRun``; None without tasks or with ``tasks`` False)."""
    started = time.perf_counter()
    fitted = session.fit(layers, methods)
    done = time.perf_counter()
    # the reference (dense) in the same pass gives each method's KL and top-1 agreement; its own rows are
    # the grid's dense rows, scored once per text, so they are left out here
    table = session.evaluate(fitted, reference=True, texts=evals)
    scored = session.tasks(fitted.models) if tasks else None
    timing = {"fit_seconds": round(done - started, 1), "eval_seconds": round(time.perf_counter() - done, 1)}
    return [r for r in table.records() if r["method"] in fitted.models], timing, scored


def task_record(run) -> dict | None:
    """A ``TaskRun`` as plain JSON (its frame's rows, protocols and skipped tasks), None without tasks."""
    if run is None:
        return None
    return {"rows": run.frame.to_dict("records"), "protocols": run.protocols, "skipped": run.skipped}


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
        session = Session(cfg.base, loaded, progress)  # loads cfg.base.model unless given
        validate.check_grid_model(cfg, validate.facts_of_model(session.lm.model))  # before any forward pass
        journal = GridJournal(out_dir, resume, overwrite) if out_dir is not None else None
        return _GridRun(session, journal, state, progress).run()
    except BaseException as err:  # Ctrl-C included: what finished is on disk; hand it over too
        if state.meta and isinstance(err, (Exception, KeyboardInterrupt)):
            err.partial_result = state.result(complete=False)
        raise


@dataclass
class _GridState:
    """The grid so far: rows of the finished cells on every calibration draw, and the meta."""

    cfg: GridConfig
    started: float
    out_dir: str | Path | None
    meta: dict = field(default_factory=dict)
    chosen: dict = field(default_factory=dict)  # (selection, n) -> (layers, reason)
    dense: dict = field(default_factory=dict)  # eval text -> row
    cells: dict = field(default_factory=dict)  # layers tuple -> rows (the first calibration draw)
    redrawn: dict = field(default_factory=dict)  # (layers tuple, seed) -> rows of the other draws
    tasks: dict = field(default_factory=dict)  # "dense" or layers tuple -> task_record(...) (None: no tasks)

    def result(self, complete: bool) -> GridResult:
        rows, task_rows = [], []
        for (selection, n), (layers, _) in self.chosen.items():
            setting = {"selection": selection, "criterion": self.cfg.criterion(selection), "n": n,
                       "layers": format_layers(layers)}
            cell = self.cells.get(tuple(layers))
            if cell is not None or not registry.with_role(self.cfg.base.methods, registry.BASELINE, registry.RECOVERY):
                rows += [{**setting, **r} for r in self.spread(layers, [*self.dense.values(), *(cell or [])])]
                scored = (self.tasks.get("dense"), self.tasks.get(tuple(layers)))
                task_rows += [{**r, **setting} for record in scored if record for r in record["rows"]]
        meta = {**self.meta, "complete": complete, "versions": versions(),
                "seconds": round(time.perf_counter() - self.started, 1)}
        records = [r for r in self.tasks.values() if r]
        if records:
            meta["tasks"] = {"protocols": {t: p for r in records for t, p in r["protocols"].items()},
                             "skipped": {t: why for r in records for t, why in r["skipped"].items()}}
        return GridResult(pd.DataFrame(rows), meta, pd.DataFrame(task_rows) if task_rows else None)

    def spread(self, layers: list[int], rows: list[dict]) -> list[dict]:
        """``rows`` (the first draw) with their perplexity's mean, std, min, max and number of finished draws
        over every calibration draw of this layer set (the dense model's is the same on every draw);
        ``rows`` as they are for a grid of one draw."""
        seeds = self.cfg.draws()
        if len(seeds) < 2:
            return rows
        others = [self.redrawn[tuple(layers), s] for s in seeds[1:] if (tuple(layers), s) in self.redrawn]
        reference = [r for r in rows if registry.role_of(r["method"]) == registry.REFERENCE]
        out = []
        for text in dict.fromkeys(r["eval"] for r in rows):
            per_draw = {i: {r["method"]: r["ppl"] for r in [*reference, *draw] if r["eval"] == text}
                        for i, draw in enumerate([rows, *others])}
            summary = summarize_seeds(per_draw)
            out += [{**r, **{f"ppl_{k}": summary[r["method"]][k] for k in ("mean", "std", "min", "max")},
                     "seeds": summary[r["method"]]["seeds"]} for r in rows if r["eval"] == text]
        return out

    def saved(self) -> None:
        """Rewrite the output files with every finished cell (complete or not)."""
        if self.out_dir is not None:
            self.result(complete=False).save(self.out_dir)


class _GridRun:
    """One grid being run: the first draw's session (model, windows), the journal of finished parts (keyed
    by the settings' digest) and the state so far, read by each part of the grid (one method each)."""

    def __init__(self, session: Session, journal: GridJournal | None, state: _GridState,
                 progress: Progress | None):
        self.cfg, self.session, self.journal, self.state = state.cfg, session, journal, state
        self.progress = progress
        self.say = lines(progress)  # one line per part of the grid, between the bars of its work
        self.settings = settings_digest(self.cfg, session.lm)  # what every journaled part is keyed under
        self.sessions = {self.cfg.draws()[0]: session}  # seed -> the session on that calibration draw

    @property
    def texts(self) -> list[str]:
        return list(self.session.evaluation(self.cfg.evals).texts)

    def find(self, kind: str, key: dict) -> dict | None:
        return self.journal.find(kind, self.settings, key) if self.journal else None

    def add(self, kind: str, key: dict, **payload) -> None:
        if self.journal:
            self.journal.add(kind, self.settings, key, **payload)

    def run(self) -> GridResult:
        cfg, state, session = self.cfg, self.state, self.session
        windows, evaluation = session.calibration(), session.evaluation(cfg.evals)
        state.meta = {"config": vars(cfg.flat()), "spec": cfg.base.to_dict(),  # config: flat names, for reading
                      "model": session.lm.name, "influence_seconds": 0.0, "selections": {},
                      "calibration": windows.fit.protocol,
                      "evaluation": {s: w.protocol for s, w in evaluation.texts.items()},
                      "notes": [], "settings": {}, "resumed": [], "protocol": evaluation.protocol,
                      "seeds": cfg.draws()}
        state.chosen = self.chosen_layers()
        state.meta["selections"] = {f"{s} {n}": {"criterion": cfg.criterion(s), "layers": format_layers(lay),
                                                 "reason": why} for (s, n), (lay, why) in state.chosen.items()}
        if registry.with_role(cfg.base.methods, registry.REFERENCE):
            self.reference_rows()
            self.reference_tasks()
        fitted = session.fitted_methods()
        for seed in cfg.draws() if fitted else []:  # the whole first draw, then each other draw
            for (selection, n), (layers, _) in state.chosen.items():
                self.layer_set(seed, selection, n, layers, fitted)
        result = state.result(complete=True)
        if state.out_dir is not None:
            result.save(state.out_dir)
        return result

    def session_on(self, seed: int) -> Session:
        """The session on calibration draw ``seed``: the same model and evaluation texts, other windows."""
        if seed not in self.sessions:
            self.sessions[seed] = Session(self.cfg.base.with_options(seed=seed), self.session.lm, self.progress)
        return self.sessions[seed]

    def layer_set(self, seed: int, selection: str, n: int, layers: list[int], fitted: list[str]) -> None:
        """One layer set's rows on calibration draw ``seed``: from the journal, or fitted and evaluated now
        (and journaled). A layer set two selections share is fitted once per draw."""
        state, first = self.state, seed == self.cfg.draws()[0]
        store, key = (state.cells, tuple(layers)) if first else (state.redrawn, (tuple(layers), seed))
        if key in store:
            return
        text = format_layers(layers) if first else f"{format_layers(layers)} seed {seed}"
        methods, notes = applicable(fitted, layers, self.session.lm.model)
        cell_key = {"layers": list(layers), "methods": methods, "evals": self.texts,
                    **({} if first else {"seed": seed})}  # the first draw's key as before seeds existed
        record = self.find("cell", cell_key)
        if record is not None:
            self.say(f"{selection} n={n}: layers {text}, finished earlier (resumed)")
            store[key], timing, tasks = record["rows"], record["timing"], record.get("tasks")
            state.meta["resumed"].append(text)
        else:
            self.say(f"{selection} n={n}: layers {text}, {len(methods)} methods")
            store[key], timing, scored = evaluate_setting(self.session_on(seed), layers, methods, self.cfg.evals,
                                                          tasks=first)
            tasks = task_record(scored)
            self.add("cell", cell_key, rows=store[key], timing=timing, tasks=tasks)
        if first:
            state.tasks[key] = tasks
            state.meta["notes"] += [f"{selection} {n} (layers {text}): {x}" for x in notes]
        state.meta["settings"][text] = timing
        state.saved()

    def chosen_layers(self) -> dict:
        """(selection, n) -> (layers, reason): from the journal when every one is there, else one influence pass."""
        cfg = self.cfg
        wanted = [(s, n) for s in cfg.selections for n in cfg.n_values]
        found = {w: self.find("selection", {"selection": w[0], "n": w[1]}) for w in wanted}
        if all(found.values()):
            self.say("layers chosen earlier (resumed): " + ", ".join(f"{s} {n}" for s, n in wanted))
            return {w: (r["layers"], r["reason"]) for w, r in found.items()}
        self.say("influence pass: " + ", ".join(cfg.criterion(s) for s in cfg.selections))
        t0 = time.perf_counter()
        chosen = choose_layers(self.session, cfg)
        self.state.meta["influence_seconds"] = round(time.perf_counter() - t0, 1)
        for (s, n), (layers, why) in chosen.items():
            self.add("selection", {"selection": s, "n": n}, layers=list(layers), reason=why)
        return chosen

    def reference_tasks(self) -> None:
        """The dense model's zero-shot scores, once for the whole grid (or resumed)."""
        tasks = self.cfg.base.evaluation.tasks
        if not tasks:
            return
        record = self.find("dense-tasks", {"tasks": tasks})
        if record is None:
            record = {"tasks": task_record(self.session.tasks(self.session.models()))}
            self.add("dense-tasks", {"tasks": tasks}, tasks=record["tasks"])
        self.state.tasks["dense"] = record["tasks"]

    def reference_rows(self) -> None:
        """The dense model's perplexity on each text, computed once for the whole grid (or resumed)."""
        rows = self.state.dense
        for source in self.texts:
            record = self.find("dense", {"eval": source})
            if record is not None:
                self.say(f"dense on {source}: finished earlier (resumed)")
                rows[source] = record["row"]
                continue
            self.say(f"dense on {source}")
            table = self.session.evaluate(texts=self.cfg.evals, on=source)
            rows[source] = table.records()[0]
            self.add("dense", {"eval": source}, row=rows[source])

"""The reproduction grid: selection criterion x layers removed x every recovery method, on two texts.

The paper's perplexity table (its Table 3) compares methods across criteria (LLM-Streamline,
ShortGPT) and pruning ratios (7 and 11 of 32 layers). This module runs the same grid on one model:

  1. one calibration draw (fit + held-out windows) serves everything;
  2. one influence pass scores every criterion for every n, then each (criterion, n) picks its layers;
  3. per distinct layer set, one ``recover`` call fits every method from a single calibration pass;
  4. per evaluation text, ``shared_eval.perplexities`` scores all recovered models, sharing the
     layers before the first patched one; the dense model is scored once per text.

``GridResult.frame`` is tidy (one row per setting x method x text); ``markdown()`` renders the table
that docs/REPRODUCTION.md embeds, ``save()`` writes grid.csv, grid.md and grid.json.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from torch import nn

from ghosted.assets import BUNDLED_MODEL
from ghosted.calibration import CalibrationConfig
from ghosted.evaluation import perplexity
from ghosted.loading import LoadedModel, load_model
from ghosted.pipeline import result_entry, split_calibration, versions
from ghosted.pruning import format_layers
from ghosted.recover import BRANCH_METHODS, METHODS, RecoveryConfig, recover
from ghosted.shared_eval import perplexities
from ghosted.text import TokenWindows, calibration_windows, evaluation_windows

Progress = Callable[[str], None]  # one line per stage
ALIASES = {  # the paper's selections, as its released code computes them (sequence-axis cosine)
    "streamline": "seqcos_streamline",
    "shortgpt": "seqcos_shortgpt",
}


@dataclass
class GridConfig:
    """The grid. Defaults: the paper's grid, its protocol scaled down to fit a CPU."""

    model: str = BUNDLED_MODEL  # bundled model, local folder, .gguf file or hub id
    selections: list[str] = field(default_factory=lambda: ["streamline", "shortgpt"])  # ALIASES keys
    # or any ghosted.layer_influence.CRITERIA name (e.g. streamline_cosine, block_influence)
    n_values: list[int] = field(default_factory=lambda: [7, 11])  # layers removed (paper: 7 and 11 of 32)
    methods: list[str] = field(default_factory=lambda: ["dense", *METHODS])  # every method
    calib: str = "bundled:news"  # calibration text (paper: C4 train)
    calib_seqs: int = 32  # calibration windows fitted (paper: 32)
    seq_len: int = 256  # calibration window length (paper: 2048)
    heldout_seqs: int = 8  # extra calibration windows: held-out errors, ghost-auto's choice
    evals: list[str] = field(default_factory=lambda: ["bundled:wiki", "bundled:news"])  # (paper: WikiText-2, PTB, C4)
    eval_tokens: int = 8192  # tokens per evaluation text, capped at what its evaluation part holds
    eval_seq_len: int = 512  # perplexity window (paper: 2048)
    device: str = "auto"  # cuda > mps > cpu
    dtype: str = "auto"  # bfloat16 on GPU, float32 on CPU
    seed: int = 0  # which calibration windows are drawn
    batch_size: int = 4  # windows per forward pass
    protocol: str = ""  # perplexity preset (ghosted.protocols) replacing evals/eval_seq_len: "paper", "bundled"
    tasks: list[str] = field(default_factory=list)  # zero-shot tasks per method: "bundled-lastword", lm-eval names
    task_limit: int | None = None  # examples per task (None: all)
    num_fewshot: int = 0  # few-shot examples per task

    def criterion(self, selection: str) -> str:
        return ALIASES.get(selection, selection)


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


def capped_evaluation_windows(tokenizer, source: str, n_tokens: int, seq_len: int) -> TokenWindows:
    """``evaluation_windows``, with ``n_tokens`` lowered to what the source's evaluation part holds."""
    probe = evaluation_windows(tokenizer, source, seq_len, seq_len)
    width = probe.input_ids.size(1) - (probe.protocol.get("bos") == "prepended")
    most = (probe.protocol["available_tokens"] // width) * seq_len
    return evaluation_windows(tokenizer, source, min(n_tokens, most), seq_len)


def choose_layers(model: nn.Module, cfg: GridConfig, fit, held) -> dict[tuple[str, int], tuple[list[int], str]]:
    """(selection, n) -> (layers, reason), every criterion from one influence pass."""
    from ghosted.layer_influence import InfluenceConfig, influence
    from ghosted.selection import select

    criteria = list(dict.fromkeys(cfg.criterion(s) for s in cfg.selections))
    report = influence(model, fit, InfluenceConfig(metrics=criteria, n_values=list(cfg.n_values),
                                                   batch_size=cfg.batch_size), heldout=held, show_tqdm=False)
    return {(s, n): select(report, cfg.criterion(s), n) for s in cfg.selections for n in cfg.n_values}


def applicable(methods: list[str], layers: list[int]) -> tuple[list[str], list[str]]:
    """(methods that can recover ``layers``, notes on those that cannot)."""
    if 0 not in layers:
        return methods, []
    skipped = [m for m in methods if m in BRANCH_METHODS]
    note = [f"{', '.join(skipped)}: no layer before layer 0 to carry ReplaceMe's map"] if skipped else []
    return [m for m in methods if m not in BRANCH_METHODS], note


def evaluate_setting(model: nn.Module, layers: list[int], methods: list[str], fit, held,
                     evals: dict[str, TokenWindows], cfg: GridConfig, show_tqdm: bool, tokenizer=None
                     ) -> tuple[list[dict], dict, object]:
    """Rows (method x text) for one layer set: one calibration pass, shared-prefix evaluation; and the
    zero-shot scores of every method (a ``TaskRun``, None without tasks)."""
    started = time.perf_counter()
    rec_cfg = RecoveryConfig(calibration=CalibrationConfig(batch_size=cfg.batch_size, seed=cfg.seed))
    run = recover(model, layers, methods, fit, held, rec_cfg, show_tqdm=show_tqdm)
    fitted = time.perf_counter()
    errors = run.errors()
    models = {name: r.model for name, r in run.results.items()}
    rows = []
    for source, windows in evals.items():
        results = perplexities(models, windows, batch_size=cfg.batch_size, show_tqdm=show_tqdm)
        for name, model_ in models.items():
            rows.append(_row(source, result_entry(name, results[name], run, errors, model_)))
    tasks = score_tasks(models, tokenizer, cfg, show_tqdm)
    timing = {"fit_seconds": round(fitted - started, 1), "eval_seconds": round(time.perf_counter() - fitted, 1)}
    return rows, timing, tasks


def score_tasks(models: dict[str, nn.Module], tokenizer, cfg: GridConfig, show_tqdm: bool):
    """``cfg.tasks`` scored on ``models`` (a ``TaskRun``), or None when the grid has no tasks."""
    if not cfg.tasks:
        return None
    from ghosted.zeroshot import evaluate_tasks

    return evaluate_tasks(models, tokenizer, cfg.tasks, cfg.task_limit, cfg.num_fewshot,
                          batch_size=cfg.batch_size, show_tqdm=show_tqdm, say=lambda line: None)


def run_grid(cfg: GridConfig, loaded: LoadedModel | None = None, progress: Progress | None = None,
             show_tqdm: bool = True) -> GridResult:
    """Run the whole grid (see the module docstring). ``loaded`` skips loading ``cfg.model``."""
    say = progress or (lambda line: None)
    started = time.perf_counter()
    lm = loaded or load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    calib = calibration_windows(lm.tokenizer, cfg.calib, cfg.calib_seqs + cfg.heldout_seqs, cfg.seq_len, cfg.seed)
    fit, held = split_calibration(calib, cfg.heldout_seqs)
    evals, protocol = _evaluation_texts(lm.tokenizer, cfg, say)
    say("influence pass: " + ", ".join(cfg.criterion(s) for s in cfg.selections))
    t0 = time.perf_counter()
    chosen = choose_layers(lm.model, cfg, fit, held)
    meta = {"config": asdict(cfg), "model": lm.name, "influence_seconds": round(time.perf_counter() - t0, 1),
            "selections": {f"{s} {n}": {"criterion": cfg.criterion(s), "layers": format_layers(lay), "reason": why}
                           for (s, n), (lay, why) in chosen.items()},
            "calibration": fit.protocol, "evaluation": {s: w.protocol for s, w in evals.items()},
            "notes": [], "settings": {}, "protocol": protocol}
    rows = _dense_rows(lm.model, cfg, evals, say, show_tqdm) if "dense" in cfg.methods else {}
    dense_tasks = score_tasks({"dense": lm.model}, lm.tokenizer, cfg, show_tqdm) if "dense" in cfg.methods else None
    tasks: dict[tuple[int, ...], object] = {}
    task_frames = []
    recovery = [m for m in dict.fromkeys(cfg.methods) if m != "dense"]
    done: dict[tuple[int, ...], list[dict]] = {}
    all_rows = []
    for (selection, n), (layers, _) in chosen.items():
        key = tuple(layers)
        if key not in done and recovery:
            methods, notes = applicable(recovery, layers)
            say(f"{selection} n={n}: layers {format_layers(layers)}, {len(methods)} methods")
            done[key], timing, tasks[key] = evaluate_setting(lm.model, layers, methods, fit, held, evals, cfg,
                                                             show_tqdm, tokenizer=lm.tokenizer)
            meta["settings"][format_layers(layers)] = timing
            meta["notes"] += [f"{selection} {n} (layers {format_layers(layers)}): {x}" for x in notes]
        setting = {"selection": selection, "criterion": cfg.criterion(selection), "n": n,
                   "layers": format_layers(layers)}
        all_rows += [{**setting, **r} for r in [*rows.values(), *done.get(key, [])]]
        task_frames += [run.frame.assign(**setting) for run in (dense_tasks, tasks.get(key)) if run is not None]
    scored = [run for run in (dense_tasks, *tasks.values()) if run is not None]
    if scored:
        meta["tasks"] = {"protocols": {t: p for run in scored for t, p in run.protocols.items()},
                         "skipped": {t: why for run in scored for t, why in run.skipped.items()}}
    meta.update(versions=versions(), seconds=round(time.perf_counter() - started, 1))
    frame = pd.concat(task_frames, ignore_index=True) if task_frames else None
    return GridResult(pd.DataFrame(all_rows), meta, frame)


def _evaluation_texts(tokenizer, cfg: GridConfig, say: Progress) -> tuple[dict[str, TokenWindows], dict]:
    """({text: windows}, the protocol as a report field): a named preset, or ``cfg.evals`` capped."""
    from ghosted.protocols import EvalProtocol, describe_protocol, protocol_windows, resolve_protocol

    if cfg.protocol:
        protocol = resolve_protocol(cfg.protocol, "", cfg.eval_tokens, cfg.eval_seq_len)
        evals, skipped = protocol_windows(tokenizer, protocol, say)
        return evals, describe_protocol(protocol, skipped)
    evals = {s: capped_evaluation_windows(tokenizer, s, cfg.eval_tokens, cfg.eval_seq_len) for s in cfg.evals}
    custom = EvalProtocol("custom", tuple(cfg.evals), cfg.eval_seq_len, cfg.eval_tokens, "texts given with --evals")
    return evals, describe_protocol(custom)


def _dense_rows(model: nn.Module, cfg: GridConfig, evals: dict, say: Progress, show_tqdm: bool) -> dict:
    """The dense model's perplexity on each text, computed once for the whole grid."""
    rows = {}
    for source, windows in evals.items():
        say(f"dense on {source}")
        res = perplexity(model, windows, batch_size=cfg.batch_size, show_tqdm=show_tqdm, label="dense")
        rows[source] = _row(source, result_entry("dense", res, None, None, model))
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

"""The whole experiment in one call: load, calibrate, fit each method, evaluate, report.

Used by the CLI (``python -m ghosted run``), the reproduction grid and the app, so that all three
produce the same numbers under the same protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ghosted.experiments import validate
from ghosted.models.assets import BUNDLED_MODEL
from ghosted.calibration.collect import CalibrationConfig
from ghosted.models.loading import LoadedModel, load_model, versions
from ghosted.evaluation.protocols import describe_protocol, protocol_windows, resolve_protocol
from ghosted.models.pruning import format_layers, parse_layers
from ghosted.recovery.fitting import RecoveryConfig, RecoveryRun, recover
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.data.windows import calibration_windows, split_calibration
from ghosted.evaluation.zeroshot import add_task_results, task_columns, task_protocol_lines

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class RunConfig:
    """One experiment. Defaults are the paper's protocol scaled down for a CPU."""

    model: str = BUNDLED_MODEL  # bundled model, local folder, .gguf file or hub id
    calib: str = "bundled:news"  # calibration text (paper: C4 train)
    eval: str = "bundled:wiki"  # evaluation text (paper: WikiText-2 test, PTB, C4)
    calib_seqs: int = 32  # calibration sequences (paper: 32 for the ghost operator)
    seq_len: int = 256  # calibration sequence length (paper: 2048)
    heldout_seqs: int = 8  # extra calibration windows, never fitted, for held-out boundary errors
    eval_tokens: int = 16384  # tokens of evaluation text (paper: the whole test split)
    eval_seq_len: int = 512  # perplexity window (paper: 2048)
    device: str = "auto"  # cuda > mps > cpu
    dtype: str = "auto"  # bfloat16 on GPU, float32 on CPU
    seed: int = 0  # which calibration windows are drawn
    drop: str = ""  # layers to remove, 0-based, e.g. "20-26" or "3,7,9-11"
    select: str = ""  # or: choose the layers by this influence criterion (ghosted.selection.criteria.CRITERIA)
    n: int = 0  # how many layers ``select`` removes
    methods: list[str] = field(default_factory=lambda: ["dense", "none", "ghost-auto"])  # ghost-auto: the
    # paper's fit or the sink-robust one per gap, never worse than the paper's on the reproduction grid
    ghost_mode: str = "independent"  # or "sequential"
    granularity: str = "auto"  # operator per contiguous block or per removed layer
    eps: float = 1e-6  # ghost ridge
    solver: str = "solve"  # "solve" or "pinv"
    batch_size: int = 4  # windows per forward pass
    cache: bool = True  # reuse calibration statistics saved by an earlier run, save new ones (--no-cache)
    protocol: str = ""  # perplexity preset (ghosted.evaluation.protocols): "paper", "bundled", or "" for
    # eval/eval_seq_len
    tasks: list[str] = field(default_factory=list)  # zero-shot tasks: "bundled-lastword", lm-eval task names
    task_limit: int | None = None  # examples per task (None: all)
    num_fewshot: int = 0  # few-shot examples per task (the paper: zero-shot)
    rank: int | None = None  # ghost-lowrank's rank R (None: d/4)

    def recovery_config(self) -> RecoveryConfig:
        return RecoveryConfig(eps=self.eps, solver=self.solver, mode=self.ghost_mode, rank=self.rank,
                              granularity=self.granularity,
                              calibration=CalibrationConfig(batch_size=self.batch_size, seed=self.seed))


def run_experiment(cfg: RunConfig, loaded: LoadedModel | None = None,
                   progress: Progress | None = None, show_tqdm: bool = True) -> tuple[dict, RecoveryRun | None]:
    """Run ``cfg`` and return (a JSON-ready report, the RecoveryRun with the recovered models).

    When the run is stopped after the model is loaded (Ctrl-C or an error), the exception goes on
    with a ``partial_report`` attribute: the report of what finished, ``"complete": false``.
    """
    validate.check_run(cfg)  # before loading: a typo costs seconds, not a calibration pass
    state = _RunState(cfg, time.perf_counter())
    try:
        return _run(cfg, loaded, progress, show_tqdm, state)
    except BaseException as err:  # Ctrl-C included: attach what finished, and let it go on
        if state.lm is not None and isinstance(err, (Exception, KeyboardInterrupt)):
            err.partial_report = state.report(stopped=err)
        raise


@dataclass
class _RunState:
    """What a run has finished so far, so that a stopped run can still report it."""

    cfg: RunConfig
    started: float  # perf_counter() at the start
    stage: str = "loading the model"  # what the run is doing now
    lm: LoadedModel | None = None
    dropped: list[int] = field(default_factory=list)
    selection: dict | None = None
    eval_protocol: dict = field(default_factory=dict)
    calib_protocol: dict | None = None
    protocol_fields: dict = field(default_factory=dict)  # the perplexity protocol and each text's windows
    run: RecoveryRun | None = None  # every method fitted (set once all are)
    entries: list[dict] = field(default_factory=list)  # evaluated models (set once all are)

    def report(self, stopped: BaseException | None = None) -> dict:
        """The JSON report; ``stopped``: the run ended early, list what finished (``complete`` false)."""
        from ghosted.models.architecture import num_layers

        entries = self.entries or self._unevaluated()
        report = {
            "model": self.lm.name, "model_source": self.lm.source, "dropped": self.dropped,
            "dropped_spec": format_layers(self.dropped), "layers": num_layers(self.lm.model),
            "selection": self.selection, "config": asdict(self.cfg),
            "protocol": {"evaluation": (entries[0]["protocol"] if entries and entries[0]["protocol"]
                                        else self.eval_protocol),
                         "calibration": self.calib_protocol, **self.protocol_fields},
            "results": [{k: v for k, v in e.items() if k != "protocol"} for e in entries],
            "complete": stopped is None,
            "versions": versions(), "seconds": round(time.perf_counter() - self.started, 2),
            "warnings": list(self.run.warnings) if self.run else [],  # ill-conditioned fits, one per gap
        }
        if stopped is not None:
            report["stopped"] = {"stage": self.stage, "by": _reason(stopped), "finished": self._finished()}
        return report

    def _unevaluated(self) -> list[dict]:
        """Entries of the fitted models, without perplexity (the run stopped before evaluating)."""
        dense = [result_entry("dense", None, None, None, self.lm.model)] if "dense" in self.cfg.methods else []
        if self.run is None:
            return dense if self.stage == "evaluation" else []
        errors = self.run.errors()
        return dense + [result_entry(name, None, self.run, errors, r.model) for name, r in self.run.results.items()]

    def _finished(self) -> str:
        if self.entries:
            return "every model evaluated"
        if self.run is not None:
            return (f"{len(self.run.results)} method(s) fitted, none evaluated (all models are scored "
                    "together, batch by batch, so no perplexity had finished)")
        from ghosted.calibration.cache import model_identity

        cached = self.cfg.cache and model_identity(self.lm.model) is not None
        saved = " (calibration statistics finished so far are cached)" if cached else ""
        return "no model fitted or evaluated" + saved


def _reason(err: BaseException) -> str:
    return "interrupted (Ctrl-C)" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"


def _run(cfg: RunConfig, loaded, progress, show_tqdm, state: _RunState) -> tuple[dict, RecoveryRun | None]:
    lm = state.lm = loaded or load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    validate.check_run_model(cfg, validate.facts_of_model(lm.model))  # before any forward pass
    state.stage = "choosing layers"
    dropped, selection = _layers_to_drop(cfg, lm)
    state.dropped, state.selection = dropped, selection
    methods = list(dict.fromkeys(cfg.methods))
    protocol = resolve_protocol(cfg.protocol, cfg.eval, cfg.eval_tokens, cfg.eval_seq_len)
    eval_sets, skipped_sources = protocol_windows(lm.tokenizer, protocol, calibration_source=cfg.calib)
    first = next(iter(eval_sets.values()))  # a separate source is read whole
    state.eval_protocol = {**first.protocol, "dtype": lm.dtype, "device": lm.device}
    state.protocol_fields = {"perplexity": describe_protocol(protocol, skipped_sources)}
    run = None
    recovery_methods = [m for m in methods if m != "dense"]
    if recovery_methods:
        if not dropped:
            raise ValueError("Methods other than 'dense' need layers to drop (--drop).")
        state.stage = "calibration and fitting"
        calib = calibration_windows(lm.tokenizer, cfg.calib, cfg.calib_seqs + cfg.heldout_seqs,
                                    cfg.seq_len, cfg.seed)
        fit, held = split_calibration(calib, cfg.heldout_seqs)
        state.calib_protocol = fit.protocol
        run = state.run = recover(lm.model, dropped, recovery_methods, fit, held, cfg.recovery_config(),
                                  progress=progress, show_tqdm=show_tqdm, cache=cfg.cache)
    state.stage = "evaluation"
    models = {"dense": lm.model} if "dense" in methods else {}
    models.update({name: r.model for name, r in (run.results.items() if run else [])})
    errors = run.errors() if run else None
    step = (lambda done, total: progress("perplexity", done, total)) if progress else None
    by_source = {source: perplexities(models, windows, batch_size=cfg.batch_size, progress=step,
                                      show_tqdm=show_tqdm)  # leading layers shared by all variants run once
                 for source, windows in eval_sets.items()}
    results = next(iter(by_source.values()))
    entries = [result_entry(name, results[name], run, errors, model) for name, model in models.items()]
    for entry in entries if len(by_source) > 1 else []:  # the paper protocol: one perplexity per text
        entry["ppl_by_source"] = {source: res[entry["method"]].ppl for source, res in by_source.items()}
    state.protocol_fields["evaluations"] = {s: next(iter(r.values())).protocol for s, r in by_source.items()}
    state.entries = entries
    state.stage = "zero-shot tasks"
    report = state.report()
    add_task_results(report, models, lm.tokenizer, cfg.tasks, cfg.task_limit, cfg.num_fewshot,
                     progress=progress, show_tqdm=show_tqdm)
    report["seconds"] = round(time.perf_counter() - state.started, 2)
    return report, run


def _layers_to_drop(cfg: RunConfig, lm: LoadedModel) -> tuple[list[int], dict | None]:
    """``cfg.drop`` parsed, or the layers ``cfg.select`` chooses on the calibration windows (and why)."""
    from ghosted.models.architecture import num_layers

    if not cfg.select:
        return parse_layers(cfg.drop, num_layers(lm.model)), None
    if cfg.drop:
        raise ValueError("Give either layers to drop or a criterion to select them with, not both.")
    from ghosted.selection.criteria import InfluenceConfig
    from ghosted.selection.rules import select

    calib = calibration_windows(lm.tokenizer, cfg.calib, cfg.calib_seqs + cfg.heldout_seqs, cfg.seq_len, cfg.seed)
    fit, held = split_calibration(calib, cfg.heldout_seqs)
    started = time.perf_counter()
    layers, reason = select(lm.model, cfg.select, cfg.n, windows=fit, heldout=held,
                            config=InfluenceConfig(batch_size=cfg.batch_size, eps=cfg.eps, solver=cfg.solver))
    return layers, {"metric": cfg.select, "n": cfg.n, "layers": layers, "reason": reason,
                    "seconds": round(time.perf_counter() - started, 2)}


def result_entry(name: str, res, run: RecoveryRun | None, errors, model) -> dict:
    """One model's report entry: perplexity, timing, parameters and, for a recovered model, its fit.

    ``res`` None: the model was fitted but not evaluated (a stopped run); ppl and nll are None.
    """
    entry = {"method": name, "ppl": res.ppl if res else None, "nll": res.nll if res else None,
             "eval_seconds": round(res.seconds, 2) if res else None,
             "parameters": sum(p.numel() for p in model.parameters()), "protocol": res.protocol if res else None}
    if res is None:
        entry["evaluated"] = False
    if run and name in run.results:
        r = run.results[name]
        entry["statistics"] = r.statistics  # "computed" by a calibration pass, or "reused" from the cache
        entry["calib_seconds"] = round(r.calib_seconds, 3)
        entry["solve_seconds"] = round(r.solve_seconds, 4)
        label = "pruned" if name == "none" else name
        chosen = [f"{c['boundary']}: {c['chosen']}" for c in r.choices if "chosen" in c]
        if chosen:  # ghost-auto: which fit each gap got, and the held-out NLL of each candidate
            entry["chosen"] = ", ".join(chosen)
            entry["auto_heldout_nll"] = "; ".join(  # a string, like "chosen", so grid frames stay flat
                f"{c['boundary']}: " + ", ".join(f"{k[4:]} {c[k]:.4f}" for k in c if k.startswith("nll_"))
                for c in r.choices if "chosen" in c)
        for split in ("fit", "heldout"):
            rows = errors[(errors.method == label) & (errors.split == split)]
            if len(rows) and rows.delta_sq.sum() > 0:  # token-weighted over gaps: total error / total ‖Δ‖²
                entry[f"{split}_boundary_error"] = float(rows.error.sum() / rows.delta_sq.sum())
    return entry


def format_table(report: dict) -> str:
    """A plain-text table of the report's results, with the protocol underneath."""
    sources = list(report["results"][0].get("ppl_by_source", {})) if report["results"] else []
    ppl_head = "".join(f"{'ppl ' + s[:10]:>16}" for s in sources) if sources else f"{'ppl':>12}"
    task_head, task_cells = task_columns(report)
    head = f"{'method':<20}{ppl_head}{'held-out err':>14}{'calib s':>10}{'solve s':>10}{'params':>14}{task_head}"
    lines = [head, "-" * len(head)]
    for e, tasks in zip(report["results"], task_cells):
        err = e.get("heldout_boundary_error")
        if e["ppl"] is None:
            ppl = f"{'not run':>12}"
        elif sources:
            ppl = "".join(f"{v:>16.3f}" for v in e["ppl_by_source"].values())
        else:
            ppl = f"{e['ppl']:>12.3f}"
        lines.append(f"{e['method']:<20}{ppl}{'' if err is None else f'{err:.4f}':>14}"
                     f"{e.get('calib_seconds', ''):>10}{e.get('solve_seconds', ''):>10}{e['parameters']:>14,}{tasks}")
    ev = report["protocol"]["evaluation"] or {}
    lines.append(f"model {report['model']}; dropped {report['dropped_spec'] or 'none'} of {report['layers']} layers")
    if report.get("selection"):
        lines.append(f"selected by {report['selection']['reason']}")
    for e in report["results"]:  # ghost-auto: what it chose per gap ("none" = no operator) and why
        if e.get("chosen"):
            lines.append(f"{e['method']} chose {e['chosen']} (held-out NLL {e.get('auto_heldout_nll', '?')})")
    preset = report["protocol"].get("perplexity", {})
    lines.append(f"protocol: {preset.get('name', 'custom')} ({preset.get('note', '')})")
    for ev in report["protocol"].get("evaluations", {"": ev}).values():
        lines.append(f"evaluation: {ev.get('source')} ({ev.get('part')}), {ev.get('scored_tokens')} tokens scored in "
                     f"{ev.get('n_windows')} windows of {ev.get('seq_len')}, BOS {ev.get('bos')}, "
                     f"{ev.get('dtype')} on {ev.get('device')}")
    lines += [f"protocol {preset['name']}: skipped {s}: {why}" for s, why in preset.get("skipped", {}).items()]
    lines += task_protocol_lines(report)
    cal = report["protocol"]["calibration"]
    if cal:
        lines.append(f"calibration: {cal.get('source')} ({cal.get('part')}), {cal.get('n_windows')} x "
                     f"{cal.get('seq_len')} tokens, seed {cal.get('seed')}")
    statistics = sorted({e["statistics"] for e in report["results"] if e.get("statistics")})
    if statistics:
        lines.append(f"calibration statistics: {' and '.join(statistics)} (reuse is keyed by model, windows, "
                     "gaps and settings; --no-cache turns it off)")
    if report.get("complete") is False:
        stop = report.get("stopped", {})
        lines.append(f"INCOMPLETE: {stop.get('by')} during {stop.get('stage')}; {stop.get('finished')}")
    return "\n".join(lines)

"""The whole experiment in one call: load, calibrate, fit each method, evaluate, report.

Used by the CLI (``python -m ghosted run``), the reproduction grid and the app, so that all three
produce the same numbers under the same protocol.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


from ghosted.experiments import validate
from ghosted.core.progress import Progress
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.loading import LoadedModel, load_model, versions
from ghosted.evaluation.protocols import describe_protocol, protocol_windows, resolve_protocol
from ghosted.models.pruning import format_layers, parse_layers
from ghosted.recovery.fitting import RecoveryRun, recover
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.evaluation.zeroshot import add_task_results, task_columns, task_protocol_lines


def RunConfig(**options) -> ExperimentSpec:
    """The experiment spec from the command line's flat names (``RunConfig(drop="2", calib_seqs=8)``)."""
    return ExperimentSpec().with_options(**options)


def run_experiment(spec: ExperimentSpec, loaded: LoadedModel | None = None,
                   progress: Progress | None = None) -> tuple[dict, RecoveryRun | None]:
    """Run ``spec`` and return (a JSON-ready report, the RecoveryRun with the recovered models).

    When the run is stopped after the model is loaded (Ctrl-C or an error), the exception goes on
    with a ``partial_report`` attribute: the report of what finished, ``"complete": false``.
    """
    validate.check_run(spec)  # before loading: a typo costs seconds, not a calibration pass
    state = _RunState(spec, time.perf_counter())
    try:
        return _run(spec, loaded, progress, state)
    except BaseException as err:  # Ctrl-C included: attach what finished, and let it go on
        if state.lm is not None and isinstance(err, (Exception, KeyboardInterrupt)):
            err.partial_report = state.report(stopped=err)
        raise


@dataclass
class _RunState:
    """What a run has finished so far, so that a stopped run can still report it."""

    spec: ExperimentSpec
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
            "selection": self.selection,
            "config": self.spec.options(), "spec": self.spec.to_dict(),  # config: the flat names, for reading
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
        dense = [result_entry("dense", None, None, None, self.lm.model)] if "dense" in self.spec.methods else []
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

        cached = self.spec.calibration.cache and model_identity(self.lm.model) is not None
        saved = " (calibration statistics finished so far are cached)" if cached else ""
        return "no model fitted or evaluated" + saved


def _reason(err: BaseException) -> str:
    return "interrupted (Ctrl-C)" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"


def _run(spec: ExperimentSpec, loaded, progress, state: _RunState) -> tuple[dict, RecoveryRun | None]:
    m, cal, ev = spec.model, spec.calibration, spec.evaluation
    lm = state.lm = loaded or load_model(m.source, device=m.device, dtype=m.dtype)
    validate.check_run_model(spec, validate.facts_of_model(lm.model))  # before any forward pass
    state.stage = "choosing layers"
    dropped, selection = _layers_to_drop(spec, lm)
    state.dropped, state.selection = dropped, selection
    methods = list(dict.fromkeys(spec.methods))
    protocol = resolve_protocol(ev.protocol, ev.source, ev.tokens, ev.window)
    eval_sets, skipped_sources = protocol_windows(lm.tokenizer, protocol, calibration_source=cal.source)
    first = next(iter(eval_sets.values()))  # a separate source is read whole
    state.eval_protocol = {**first.protocol, "dtype": lm.dtype, "device": lm.device}
    state.protocol_fields = {"perplexity": describe_protocol(protocol, skipped_sources)}
    run = None
    recovery_methods = [m for m in methods if m != "dense"]
    if recovery_methods:
        if not dropped:
            raise ValueError("Methods other than 'dense' need layers to drop (--drop).")
        state.stage = "calibration and fitting"
        run = state.run = fit_spec(spec, lm, dropped, progress,
                                   on_windows=lambda fit, held: setattr(state, "calib_protocol", fit.protocol))
    state.stage = "evaluation"
    models = {"dense": lm.model} if "dense" in methods else {}
    models.update({name: r.model for name, r in (run.results.items() if run else [])})
    errors = run.errors() if run else None
    by_source = {source: perplexities(models, windows, batch_size=cal.batch_size,
                                      progress=progress)  # leading layers shared by all variants run once
                 for source, windows in eval_sets.items()}
    results = next(iter(by_source.values()))
    entries = [result_entry(name, results[name], run, errors, model) for name, model in models.items()]
    for entry in entries if len(by_source) > 1 else []:  # the paper protocol: one perplexity per text
        entry["ppl_by_source"] = {source: res[entry["method"]].ppl for source, res in by_source.items()}
    state.protocol_fields["evaluations"] = {s: next(iter(r.values())).protocol for s, r in by_source.items()}
    state.entries = entries
    state.stage = "zero-shot tasks"
    report = state.report()
    add_task_results(report, models, lm.tokenizer, ev.tasks, ev.task_limit, ev.num_fewshot,
                     progress=progress)
    report["seconds"] = round(time.perf_counter() - state.started, 2)
    return report, run


def fit_spec(spec: ExperimentSpec, lm: LoadedModel, layers: list[int], progress: Progress | None = None,
             text=None, on_windows=None) -> RecoveryRun:
    """Fit every method of ``spec`` (but ``dense``) with ``layers`` removed: the one place where a spec's
    calibration windows are drawn, the held-out ones set apart, and ``recover`` called (``run``,
    ``export`` and the app's Recover page all come here).

    ``text``: the calibration text when it is not a source name (an uploaded file in the app);
    ``on_windows(fit, heldout)`` is told the windows before the forward passes start.
    """
    fit, held = spec.calibration.windows(lm.tokenizer, text=text)
    if on_windows is not None:
        on_windows(fit, held)
    methods = [m for m in dict.fromkeys(spec.methods) if m != "dense"]
    return recover(lm.model, layers, methods, fit, held, spec.recovery_config(), progress=progress,
                   cache=spec.calibration.cache)


def _layers_to_drop(spec: ExperimentSpec, lm: LoadedModel) -> tuple[list[int], dict | None]:
    """``spec.layers.drop`` parsed, or the layers ``select`` chooses on the calibration windows (and why)."""
    from ghosted.models.architecture import num_layers

    layers = spec.layers
    if not layers.select:
        return parse_layers(layers.drop, num_layers(lm.model)), None
    if layers.drop:
        raise ValueError("Give either layers to drop or a criterion to select them with, not both.")
    from ghosted.selection.criteria import InfluenceConfig
    from ghosted.selection.rules import select

    fit, held = spec.calibration.windows(lm.tokenizer)
    started = time.perf_counter()
    chosen, reason = select(lm.model, layers.select, layers.n, windows=fit, heldout=held,
                            config=InfluenceConfig(batch_size=spec.calibration.batch_size, eps=spec.recovery.eps,
                                                   solver=spec.recovery.solver))
    return chosen, {"metric": layers.select, "n": layers.n, "layers": chosen, "reason": reason,
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

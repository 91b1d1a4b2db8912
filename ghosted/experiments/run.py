"""The whole experiment in one call: load, calibrate, fit each method, evaluate, report.

What ``python -m ghosted run`` and ``ghosted.run`` do: a ``Session`` (``ghosted.experiments.session``)
loads, fits and evaluates; this module turns what it finished into the JSON report and its table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


from ghosted.core.progress import Progress
from ghosted.experiments.session import EvaluationTable, FittedRun, Session
from ghosted.core.signals import describe_stop
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.loading import LoadedModel, versions
from ghosted.models.pruning import format_layers
from ghosted.recovery.fitting import RecoveryRun
from ghosted.evaluation.zeroshot import add_task_results, task_columns, task_protocol_lines


def run_experiment(spec: ExperimentSpec, loaded: LoadedModel | None = None, progress: Progress | None = None,
                   offload_folder: str | None = None) -> tuple[dict, RecoveryRun | None]:
    """Run ``spec`` and return (a JSON-ready report, the RecoveryRun with the recovered models).

    ``Session.open`` checks the spec (before loading: a typo costs seconds, not a calibration pass), loads
    the model (unless ``loaded``; ``offload_folder``: see ``load_spec_model``) and checks the spec against
    it; ``run_session`` does the rest.
    """
    started = time.perf_counter()
    session = Session.open(spec, loaded, progress, offload_folder=offload_folder)
    return run_session(session, started)


def run_session(session: Session, started: float | None = None) -> tuple[dict, RecoveryRun | None]:
    """Run the experiment of an opened session (``Session.open``): choose layers, fit, evaluate, report.

    When the run is stopped (Ctrl-C or an error), the exception goes on with a ``partial_report``
    attribute: the report of what finished, ``"complete": false``.
    """
    state = _RunState(session.spec, started or time.perf_counter(), session=session)
    try:
        return _run(session, state)
    except BaseException as err:  # Ctrl-C included: attach what finished, and let it go on
        if isinstance(err, (Exception, KeyboardInterrupt)):
            err.partial_report = state.report(stopped=err)
        raise


@dataclass
class _RunState:
    """What a run has finished so far, so that a stopped run can still report it."""

    spec: ExperimentSpec
    started: float  # perf_counter() at the start
    session: Session  # opened: the model loaded and the spec checked against it
    stage: str = "choosing layers"  # what the run is doing now
    dropped: list[int] = field(default_factory=list)
    selection: dict | None = None
    eval_protocol: dict = field(default_factory=dict)
    calib_protocol: dict | None = None
    protocol_fields: dict = field(default_factory=dict)  # the perplexity protocol and each text's windows
    fitted: FittedRun | None = None  # every method fitted (set once all are)
    table: EvaluationTable | None = None  # every model evaluated (set once all are)

    @property
    def run(self) -> RecoveryRun | None:
        return self.fitted.recovery if self.fitted else None

    def report(self, stopped: BaseException | None = None) -> dict:
        """The JSON report; ``stopped``: the run ended early, list what finished (``complete`` false)."""
        from ghosted.models.architecture import num_layers

        lm, lm_cache = self.session.lm, self.session.cache
        entries = self.table.entries() if self.table else self._unevaluated()
        report = {
            "model": lm.name, "model_source": lm.source, "dropped": self.dropped,
            "dropped_spec": format_layers(self.dropped), "layers": num_layers(lm.model),
            "selection": self.selection,
            "config": self.spec.options(), "spec": self.spec.to_dict(),  # config: the flat names, for reading
            "protocol": {"evaluation": (entries[0]["protocol"] if entries and entries[0]["protocol"]
                                        else self.eval_protocol),
                         "calibration": self.calib_protocol, **self.protocol_fields},
            "results": [{k: v for k, v in e.items() if k != "protocol"} for e in entries],
            "complete": stopped is None,
            "versions": versions(), "seconds": round(time.perf_counter() - self.started, 2),
            "warnings": [*(self.run.warnings if self.run else []),  # ill-conditioned fits, one per gap
                         *([lm_cache.failure] if lm_cache and lm_cache.failure else [])],  # statistics not cached
        }
        if stopped is not None:
            report["stopped"] = {"stage": self.stage, "by": _reason(stopped), "finished": self._finished()}
        return report

    def _unevaluated(self) -> list[dict]:
        """Entries of the fitted models, without perplexity (the run stopped before evaluating)."""
        reference = _has_reference(self.spec)
        if self.fitted is None and self.stage != "evaluation":
            return []
        return self.session.unevaluated(self.fitted, reference).entries()

    def _finished(self) -> str:
        if self.table:
            return "every model evaluated"
        if self.fitted is not None:
            return (f"{len(self.fitted.recovery.results)} method(s) fitted, none evaluated (all models are scored "
                    "together, batch by batch, so no perplexity had finished)")
        cache = self.session.cache
        saved = " (calibration statistics finished so far are cached)" if cache and cache.written else ""
        return "no model fitted or evaluated" + saved


def _reason(err: BaseException) -> str:
    return describe_stop(err) if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"


def _has_reference(spec: ExperimentSpec) -> bool:
    from ghosted.recovery.methods import REFERENCE, with_role

    return bool(with_role(spec.methods, REFERENCE))


def _run(session: Session, state: _RunState) -> tuple[dict, RecoveryRun | None]:
    spec, progress = session.spec, session.progress
    choice = session.choose_layers()
    state.dropped, state.selection = choice.layers, choice.selection
    evaluation = session.evaluation()
    first = next(iter(evaluation.texts.values()))  # a separate source is read whole
    state.eval_protocol = {**first.protocol, "dtype": session.lm.dtype, "device": session.lm.device}
    state.protocol_fields = {"perplexity": evaluation.protocol}
    if session.fitted_methods():
        state.stage = "calibration and fitting"
        state.calib_protocol = session.calibration().fit.protocol
        state.fitted = session.fit()
    state.stage = "evaluation"
    table = session.evaluate(state.fitted, reference=_has_reference(spec))
    state.protocol_fields["evaluations"] = {r.text: r.protocol for r in table.rows if r.method == table.rows[0].method}
    state.table = table
    state.stage = "zero-shot tasks"
    report = state.report()
    models = session.models(state.fitted, _has_reference(spec))
    add_task_results(report, models, session.lm.tokenizer, spec.evaluation.tasks, spec.evaluation.task_limit,
                     spec.evaluation.num_fewshot, progress=progress)
    report["seconds"] = round(time.perf_counter() - state.started, 2)
    return report, state.run


def _span(low, high, digits: int) -> str:
    return "" if low is None or high is None else f"[{low:.{digits}f}, {high:.{digits}f}]"


def interval_cells(entry: dict) -> str:
    """The perplexity's interval, the paired Δppl from the pruned model ("ns": its interval holds
    zero), the KL from the dense model and the top-1 agreement with it, as fixed-width cells."""
    ppl = _span(entry.get("ppl_low"), entry.get("ppl_high"), 2)
    diff = ""
    if entry.get("d_none") is not None:
        mark = {False: " ns", None: " ?"}.get(entry.get("d_none_significant"), "")
        diff = f"{entry['d_none']:+.2f} {_span(entry.get('d_none_low'), entry.get('d_none_high'), 2)}{mark}"
    kl = "" if entry.get("kl") is None else f"{entry['kl']:.4f}"
    top1 = "" if entry.get("top1") is None else f"{100 * entry['top1']:.1f}%"
    return f" {ppl:>17} {diff:>27} {kl:>9} {top1:>7}"  # a space before each cell: wide values stay apart


def interval_notes(report: dict) -> list[str]:
    """What the interval columns mean, and which differences from ghost are not significant."""
    results = [e for e in report["results"] if e.get("ppl_low") is not None]
    if not results:
        return []
    notes = ["intervals: 95 % bootstrap over evaluation windows (seeded); Δppl vs pruned is paired (the same "
             "windows for both), ns = its interval holds zero (not significant); KL dense = mean per-token "
             "KL(dense || model) in nats, top-1 = agreement with the dense model's next token"]
    same = [e["method"] for e in results if e.get("d_ghost_significant") is False]
    if same:
        notes.append(f"not significantly different from ghost: {', '.join(same)}")
    return notes


def format_table(report: dict) -> str:
    """A plain-text table of the report's results, with the protocol underneath."""
    sources = list(report["results"][0].get("ppl_by_source", {})) if report["results"] else []
    ppl_head = "".join(f"{'ppl ' + s[:10]:>16}" for s in sources) if sources else f"{'ppl':>12}"
    task_head, task_cells = task_columns(report)
    head = (f"{'method':<20}{ppl_head}{'95% interval':>18}{'Δppl vs pruned':>28}{'KL dense':>10}{'top-1':>8}"
            f"{'held-out err':>14}{'calib s':>10}{'solve s':>10}{'params':>14}{task_head}")
    lines = [head, "-" * len(head)]
    for e, tasks in zip(report["results"], task_cells):
        err = e.get("heldout_boundary_error")
        if e["ppl"] is None:
            ppl = f"{'not run':>12}"
        elif sources:
            ppl = "".join(f"{v:>16.3f}" for v in e["ppl_by_source"].values())
        else:
            ppl = f"{e['ppl']:>12.3f}"
        lines.append(f"{e['method']:<20}{ppl}{interval_cells(e)}{'' if err is None else f'{err:.4f}':>14}"
                     f"{e.get('calib_seconds', ''):>10}{e.get('solve_seconds', ''):>10}{e['parameters']:>14,}{tasks}")
    lines += interval_notes(report)
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

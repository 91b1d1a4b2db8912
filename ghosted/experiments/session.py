"""A session owns running one experiment: the model, the windows, the fits and the evaluation.

``Session(spec)`` loads the model the spec names (every model field: device, dtype, device_map,
trust_remote_code; a saved folder comes back with its operators) and then, each at most once:

  * ``calibration()``: the calibration windows, fit and held-out, as the spec draws them;
  * ``evaluation()``: the evaluation windows of every text (the spec's text or protocol);
  * ``choose_layers()``: the layers the spec drops, given or chosen by its criterion;
  * ``fit(layers, methods)``: every method fitted through ``recover`` -> ``FittedRun`` (carries its spec);
  * ``evaluate(fitted)``: perplexity of the reference and every fitted model through the shared
    prefix -> ``EvaluationTable`` (one row per method and text: method, label, role, ppl, nll, tokens);
  * ``tasks(models)``, ``generate(models, prompts)``, ``influence()``: zero-shot scores, continuations
    and the layer-selection criteria on the same model and windows.

``python -m ghosted run`` / ``export`` / ``grid``, ``ghosted.fit`` / ``ghosted.run`` and the app are
thin callers of it, so that every front end draws the same windows and gives the same numbers.

Example:
    >>> session = Session(ExperimentSpec().with_options(drop="20-26", methods=["dense", "none", "ghost"]))
    >>> fitted = session.fit()                      # the spec's layers and methods
    >>> table = session.evaluate(fitted)            # dense, pruned and ghost
    >>> table.frame()[["method", "label", "role", "ppl"]]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd
import torch
from torch import nn

from ghosted.calibration.cache import resolve_cache
from ghosted.core.progress import Progress
from ghosted.data.windows import TokenWindows
from ghosted.evaluation.perplexity import perplexity
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.experiments.evaluation_table import (EvaluationRow, EvaluationTable,  # noqa: F401 (read here too)
                                                 evaluation_row)
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.lazy import lazy_of
from ghosted.models.loading import LoadedModel
from ghosted.models.pruning import format_layers, parse_layers
from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import RecoveryRun, recover


@dataclass
class CalibrationWindows:
    """The calibration draw: the windows fitted and those kept apart (None when the spec keeps none)."""

    fit: TokenWindows  # (N, T): what every method is fitted on
    heldout: TokenWindows | None  # (H, T): held-out errors and ghost-auto's choice; None: heldout_seqs 0


@dataclass
class EvaluationWindows:
    """The evaluation windows of every text, and the perplexity protocol they follow (report fields)."""

    texts: dict[str, TokenWindows]  # text -> (N, T) windows, in the protocol's order
    protocol: dict  # describe_protocol(...): name, texts, window, tokens, skipped texts


@dataclass
class LayerChoice:
    """The layers an experiment removes, and why (``selection`` None: given by hand)."""

    layers: list[int]  # 0-based, sorted
    selection: dict | None = None  # criterion, n, layers, the rule's reason, seconds

    @property
    def text(self) -> str:
        """The layers in the drop notation users type and read (``12-18``, inclusive)."""
        return format_layers(self.layers)


@dataclass
class FittedRun:
    """Every method fitted on one layer set, with the spec that describes exactly this fit."""

    spec: ExperimentSpec  # the session's spec with these layers (drop) and these methods
    layers: list[int]  # the removed layers
    recovery: RecoveryRun  # the fits, diagnostics frames and one new model per method
    selection: dict | None = None  # how the layers were chosen (None: by hand)

    @property
    def models(self) -> dict[str, nn.Module]:
        """Method -> its recovered model (``none``: the plainly pruned one)."""
        return {name: r.model for name, r in self.recovery.results.items()}


class Session:
    """One experiment's model and windows, opened from a spec (see the module docstring).

    ``loaded``: a model already loaded (the app's cached one, a test's tiny one) instead of loading
    ``spec.model``; it is only read. ``calibration_text`` / ``evaluation_text``: the text itself (a
    ``TextSource``) when ``spec.calibration.source`` / ``spec.evaluation.source`` only names it (an
    uploaded file). ``windows``: calibration windows the caller drew (``ghosted.fit``), used instead
    of the spec's draw.
    """

    def __init__(self, spec: ExperimentSpec, loaded: LoadedModel | None = None, progress: Progress | None = None,
                 calibration_text=None, windows: CalibrationWindows | None = None, evaluation_text=None,
                 offload_folder: str | None = None):
        self.spec = spec
        self.progress = progress
        self.lm = loaded if loaded is not None else load_spec_model(spec, offload_folder)
        self.cache = resolve_cache(spec.calibration.cache)  # this session's: ``written``, ``failure`` say what it saved
        self._calibration_text = calibration_text
        self._evaluation_text = evaluation_text
        self._windows = windows
        self._drawn = windows is None  # the spec draws the calibration windows (so a recipe reruns them)
        self._evaluation: dict[tuple, EvaluationWindows] = {}

    @classmethod
    def open(cls, spec: ExperimentSpec, loaded: LoadedModel | None = None, progress: Progress | None = None,
             **options) -> Session:
        """A session on ``spec`` after every check, each made once: the settings before the model is loaded
        (``validate.check_run``), the layers and positions against the model before any forward pass. The
        door of a whole experiment (``run_experiment``, ``run_seeds``, ``python -m ghosted run``)."""
        from ghosted.experiments import validate

        validate.check_run(spec)
        session = cls(spec, loaded, progress, **options)
        session.check_model()
        return session

    def check_model(self) -> None:
        """The spec's layers and windows against the loaded model (before any forward pass)."""
        from ghosted.experiments import validate

        validate.check_run_model(self.spec, validate.facts_of_model(self.lm.model))

    # ------------------------------------------------------------------------------ windows
    def calibration(self) -> CalibrationWindows:
        """The calibration draw, drawn once: ``count + heldout`` windows, the last ``heldout`` kept apart."""
        if self._windows is None:
            fit, held = self.spec.calibration.windows(self.lm.tokenizer, text=self._calibration_text)
            self._windows = CalibrationWindows(fit, held)
        return self._windows

    def evaluation(self, texts: list[str] | None = None) -> EvaluationWindows:
        """The evaluation windows, drawn once per request: the spec's text or protocol, or (``texts``,
        the grid's texts) ``evaluation.eval_tokens`` of each of ``texts``, capped to whole windows."""
        key = tuple(texts or ())
        if key not in self._evaluation:
            self._evaluation[key] = _evaluation_windows(self.spec, self.lm.tokenizer, texts, self.progress,
                                                        self._calibration_text, self._evaluation_text)
        return self._evaluation[key]

    # ------------------------------------------------------------------------------ layers and fits
    @cached_property
    def layer_choice(self) -> LayerChoice:
        """The layers the spec removes: ``layers.drop`` parsed, or chosen by ``layers.select``."""
        return self._choose_layers()

    def choose_layers(self) -> LayerChoice:
        return self.layer_choice

    def _choose_layers(self) -> LayerChoice:
        from ghosted.models.architecture import num_layers

        layers = self.spec.layers
        if not layers.select:
            return LayerChoice(parse_layers(layers.drop, num_layers(self.lm.model)) if layers.drop else [])
        if layers.drop:
            raise ValueError("Give either layers to drop or a criterion to select them with, not both.")
        from ghosted.selection.criteria import InfluenceConfig
        from ghosted.selection.rules import select

        windows = self.calibration()
        started = time.perf_counter()
        chosen, reason = select(self.lm.model, layers.select, layers.n, windows=windows.fit, heldout=windows.heldout,
                                config=InfluenceConfig(batch_size=self.spec.calibration.batch_size,
                                                       eps=self.spec.recovery.eps, solver=self.spec.recovery.solver))
        return LayerChoice(chosen, {"metric": layers.select, "n": layers.n, "layers": chosen, "reason": reason,
                                    "seconds": round(time.perf_counter() - started, 2)})

    def fitted_methods(self, methods=None) -> list[str]:
        """The methods of ``methods`` (default: the spec's) that are fitted: every role but the reference."""
        names = list(dict.fromkeys(self.spec.methods if methods is None else methods))
        return registry.with_role(names, registry.BASELINE, registry.RECOVERY)

    def fit(self, layers=None, methods=None) -> FittedRun:
        """Fit ``methods`` (default: the spec's, but the reference) with ``layers`` removed (default:
        the spec's), on the session's calibration windows: the one place ``recover`` is called."""
        choice = self.layer_choice if layers is None else LayerChoice(_layer_list(layers, self.lm.model))
        if not choice.layers:
            raise ValueError("Methods other than 'dense' need layers to drop (--drop).")
        names = self.fitted_methods(methods)
        windows = self.calibration()
        run = recover(self.lm.model, choice.layers, names, windows.fit, windows.heldout, self.spec.recovery_config(),
                      progress=self.progress, cache=self.cache)
        refs = registry.with_role(self.spec.methods if methods is None else methods, registry.REFERENCE)
        spec = self.spec.with_options(drop=choice.text, select="", n=0, methods=[*refs, *names])
        drawn = spec if self._drawn else _spec_drawing(spec, windows, self.lm.tokenizer)  # None: none draws them
        run.spec = drawn.to_dict() if drawn is not None else None
        return FittedRun(drawn or spec, choice.layers, run, choice.selection)

    # ------------------------------------------------------------------------------ evaluation
    def models(self, fitted: FittedRun | None = None, reference: bool = True) -> dict[str, nn.Module]:
        """Method -> model: the reference (the loaded model) first when asked, then every fitted one."""
        models = {registry.REFERENCE_METHOD: self.lm.model} if reference else {}
        return {**models, **(fitted.models if fitted else {})}

    def evaluate(self, fitted: FittedRun | None = None, reference: bool = True, texts: list[str] | None = None,
                 models: dict[str, nn.Module] | None = None, on: str | None = None) -> EvaluationTable:
        """Perplexity of the reference and of every model ``fitted`` holds (or of ``models``) on every
        evaluation text (``texts``: see ``evaluation``; ``on``: that one text only); models that share
        leading layers run them once (``shared_prefix``)."""
        models = models if models is not None else self.models(fitted, reference)
        evaluation = self.evaluation(texts)
        batch = self.spec.calibration.batch_size
        recovery = fitted.recovery if fitted else None
        errors = recovery.errors() if recovery else None
        rows = []
        for text, windows in evaluation.texts.items():
            if on is not None and text != on:
                continue
            if len(models) == 1:  # nothing to share: the plain pass, labelled by its method
                (name, model), = models.items()
                scored = {name: self._perplexity(model, windows, name)}
            else:
                scored = perplexities(models, windows, batch_size=batch, progress=self.progress)
            rows += [evaluation_row(name, text, scored[name], model, recovery, errors)
                     for name, model in models.items()]
        return EvaluationTable(rows, evaluation.protocol)

    def perplexity(self, model: nn.Module | None = None, windows: TokenWindows | None = None):
        """Perplexity of ``model`` (default: the loaded one) as a ``PerplexityResult``, on ``windows``
        (default: the spec's evaluation text, as ``evaluation`` draws it)."""
        if windows is None:
            windows = next(iter(self.evaluation().texts.values()))
        return self._perplexity(self.lm.model if model is None else model, windows)

    def _perplexity(self, model: nn.Module, windows: TokenWindows, label: str = "perplexity"):
        """One model's plain pass; layer by layer (the head in chunks) when it is read from its checkpoint."""
        batch = self.spec.calibration.batch_size
        if lazy_of(model) is not None:
            scored = perplexities({label: model}, windows, batch_size=batch, progress=self.progress, reference=None)
            return scored[label]
        return perplexity(model, windows, batch_size=batch, progress=self.progress, label=label)

    def unevaluated(self, fitted: FittedRun | None, reference: bool = True) -> EvaluationTable:
        """The rows of ``fitted``'s models without perplexity (a run stopped before it evaluated)."""
        recovery = fitted.recovery if fitted else None
        errors = recovery.errors() if recovery else None
        return EvaluationTable([evaluation_row(name, "", None, model, recovery, errors)
                                for name, model in self.models(fitted, reference).items()])

    def tasks(self, models: dict[str, nn.Module]):
        """The spec's zero-shot tasks scored on ``models`` (a ``TaskRun``), None without tasks."""
        ev = self.spec.evaluation
        if not ev.tasks:
            return None
        from ghosted.evaluation.zeroshot import evaluate_tasks

        return evaluate_tasks(models, self.lm.tokenizer, ev.tasks, ev.task_limit, ev.num_fewshot,
                              batch_size=self.spec.calibration.batch_size, progress=self.progress)

    def generate(self, models: dict[str, nn.Module], prompts, **config) -> Generations:
        """Each model's continuation of each prompt (``GenerationConfig`` fields in ``config``), and where
        each one first departs from the reference's (when the reference is among ``models``)."""
        from ghosted.core.progress import counted
        from ghosted.evaluation.generation import departures, generate

        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        texts = {name: generate(model, self.lm.tokenizer, prompts, **config)
                 for name, model in counted(list(models.items()), self.progress, "generating")}
        reference = registry.label_of(registry.REFERENCE_METHOD)  # "dense": its method name and its label
        return Generations(prompts, texts, departures(texts, self.lm.tokenizer, reference))

    def influence(self, **config):
        """The layer-selection criteria on the calibration windows (``InfluenceConfig`` fields in ``config``)."""
        from ghosted.selection.criteria import InfluenceConfig, influence

        windows = self.calibration()
        config.setdefault("batch_size", self.spec.calibration.batch_size)
        return influence(self.lm.model, windows.fit, InfluenceConfig(**config), heldout=windows.heldout,
                         progress=self.progress)


@dataclass
class Generations:
    """Each model's continuation of each prompt."""

    prompts: list[str]
    texts: dict[str, list[str]]  # method -> one continuation per prompt
    departures: dict[str, list[int | None]] = field(default_factory=dict)  # method -> per prompt, the token
    # where its text first departs from the reference's (None: none in what was generated); {}: no reference

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"method": m, "label": registry.label_of(m), "prompt": p, "continuation": t}
                             for m, texts in self.texts.items() for p, t in zip(self.prompts, texts)])


def load_spec_model(spec: ExperimentSpec, offload_folder: str | None = None) -> LoadedModel:
    """The model ``spec.model`` names, with every model field; a saved folder with its operators.
    ``offload_folder``: with ``device_map``, where layers that fit on no device go (a machine setting,
    not part of the experiment, so not in the spec)."""
    from ghosted.operators.checkpoint import load_any

    m = spec.model
    return load_any(m.source, device=m.device, dtype=m.dtype, device_map=m.device_map,
                    trust_remote_code=m.trust_remote_code, offload_folder=offload_folder,
                    **({"layerwise": True} if m.layerwise else {}))


def _layer_list(layers, model: nn.Module) -> list[int]:
    from ghosted.models.architecture import num_layers

    return parse_layers(layers, num_layers(model))


def _evaluation_windows(spec: ExperimentSpec, tokenizer, texts, progress, calibration_text=None,
                        evaluation_text=None) -> EvaluationWindows:
    """The spec's protocol (a preset, or its text), or ``texts`` capped to whole windows (the grid).
    ``calibration_text`` / ``evaluation_text``: the texts the spec only names (uploads), read instead."""
    from ghosted.core.progress import lines
    from ghosted.data.windows import capped_evaluation_windows, evaluation_windows
    from ghosted.evaluation.protocols import EvalProtocol, describe_protocol, protocol_windows, resolve_protocol

    ev = spec.evaluation
    calib = calibration_text if calibration_text is not None else spec.calibration.source
    if evaluation_text is not None and not texts and not ev.protocol:  # an uploaded evaluation text
        windows = evaluation_windows(tokenizer, evaluation_text, ev.eval_tokens, ev.eval_seq_len, calib)
        return EvaluationWindows({ev.source: windows}, describe_protocol(resolve_protocol("", ev.source, ev.eval_tokens,
                                                                                          ev.eval_seq_len)))
    if texts and not ev.protocol:
        windows = {s: capped_evaluation_windows(tokenizer, s, ev.eval_tokens, ev.eval_seq_len, calib) for s in texts}
        custom = EvalProtocol("custom", tuple(texts), ev.eval_seq_len, ev.eval_tokens, "texts given with --evals")
        return EvaluationWindows(windows, describe_protocol(custom))
    protocol = resolve_protocol(ev.protocol, "" if texts else ev.source, ev.eval_tokens, ev.eval_seq_len)
    say = lines(progress) if texts else None
    windows, skipped = protocol_windows(tokenizer, protocol, say, calibration_source=calib)
    return EvaluationWindows(windows, describe_protocol(protocol, skipped))


def _spec_drawing(spec: ExperimentSpec, windows: CalibrationWindows, tokenizer) -> ExperimentSpec | None:
    """``spec`` with the calibration that draws ``windows`` again, or None when no spec can.

    Windows of ``ghosted.calibrate`` (random windows of a named text, nothing held out) are drawn again
    by a spec with that text, count, length and seed and no held-out windows: the spec is kept only when its
    draw gives those very windows (the text's tokens are cached, so the check costs no tokenisation). Held-out
    windows given beside them, or windows of an in-memory text, came from draws a spec does not make.
    """
    made = windows.fit.protocol
    if windows.heldout is not None or made.get("sampling") != "random windows" or tokenizer is None:
        return None
    try:
        again = spec.with_options(calib=made["source"], calib_seqs=int(made["n_windows"]),
                                  seq_len=int(made["seq_len"]), heldout_seqs=0, seed=int(made["seed"]))
        drawn, _ = again.calibration.windows(tokenizer)
    except (KeyError, TypeError, ValueError, OSError):  # not a text a spec can name, or no longer readable
        return None
    return again if torch.equal(drawn.input_ids, windows.fit.input_ids) else None

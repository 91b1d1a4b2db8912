"""What the app computes, as typed requests and typed results: one backend for every page.

Each heavy action of the app is a frozen request (``InfluenceRequest``, ``FitRequest``, ``EvalRequest``,
``ZeroShotRequest``, ``GenerationRequest``) holding every choice that changes its result, so that

  * ``request.key()`` names the result (``ghosted.service.store.request_key``): identical requests of
    different sessions get one computation and one shared, read-only result;
  * ``request.check(cfg)`` refuses what the deployment forbids before anything is queued;
  * ``request.compute(lm, progress, ...)`` runs it (in a worker of ``ghosted.service.jobs``), through
    the same ``Session`` as the command line (the spec, its fit, its evaluation through the shared prefix).

A session keeps only its requests; the results live in the process-wide store (``shared_store``), so a
session's memory stays small and an idle session's results can be released and found again (from the
store's disk copy, or computed again). The page defaults are the requests' defaults: the precompute script
(``scripts/precompute.py``) fills the store with exactly what a visitor following them asks for.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ghosted.core.version import __version__
from ghosted.data.sources import TextSource
from ghosted.service import codecs
from ghosted.service.comparison import VariantTable
from ghosted.service.deploy import DeployConfig
from ghosted.service.identity import (DEFAULT_MODEL, canonical_model, canonical_source, local_identity,  # noqa: F401
                                      model_key, text_identity, text_name)  # (read as wb.NAME)
from ghosted.experiments.spec import ExperimentSpec
from ghosted.service.results import Evaluation, FittedRun, Generations, Influence, ZeroShot
from ghosted.service.store import Codec, ResultStore, request_key
from ghosted.models.assets import BUNDLED_MODEL, cache_dir  # noqa: F401 (BUNDLED_MODEL: read as wb.NAME)

DEFAULT_CRITERIA = ("streamline_cosine", "angular_all", "block_influence", "recoverability")  # Influence page
DEFAULT_METHODS = ("ghost-auto", "ghost", "replaceme-ls")  # the default, the paper's fit, its closest baseline
HELDOUT_WINDOWS = 4  # held-out windows drawn for influence criteria that need them (cost "heldout")
SPEC_SETTINGS = ("calib_seqs", "seq_len", "heldout_seqs", "seed", "ghost_mode", "granularity", "batch_size")
# FitRequest's fields that are experiment settings, under the spec's flat names (passed on as they are)
LATENCY_TOKENS = 64  # tokens of the prompt timed per variant (short: 3 passes per variant)
PRESETS = {  # preset -> (criterion, what it picks); the Influence page's presets of n layers
    "Streamline block of n": ("streamline_cosine", "the contiguous block whose input and output are most alike"),
    "ShortGPT n": ("block_influence", "the n layers with the lowest Block Influence, anywhere"),
    "most recoverable block of n": ("recoverability", "the contiguous block a ghost operator restores best"),
}


BUNDLED_KEY = model_key(DEFAULT_MODEL)  # the bundled model as the app loads it by default


def _key_fields(request) -> dict:
    """Every field of a request, texts by their identity and nested requests by their key."""
    out = {"ghosted": __version__}
    for f in fields(request):
        value = getattr(request, f.name)
        if f.name == "text":
            value = text_identity(value)
        elif hasattr(value, "key"):
            value = value.key()
        out[f.name] = value
    return out


class _Request:
    """What every request shares: its key, from every field."""

    kind = ""

    def key(self) -> str:
        return request_key(self.kind, _key_fields(self))

    def validate(self, lm) -> None:
        """The model-side checks of this request (none by default; a run's are the command line's)."""
        if hasattr(self, "fit"):
            self.fit.validate(lm)


# --- influence ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InfluenceRequest(_Request):
    """The Influence page's measurement: criteria on ``calib_seqs`` x ``seq_len`` tokens of ``text``."""

    model: str = BUNDLED_KEY  # model key
    text: object = "bundled:news"  # source name or TextSource
    calib_seqs: int = 16  # windows measured
    seq_len: int = 128  # tokens per window
    rec_n: tuple[int, ...] = (6,)  # block sizes of the recoverability criteria (each adds a ghost fit)
    metrics: tuple[str, ...] = DEFAULT_CRITERIA  # criteria computed
    kind = "influence"

    @property
    def heldout_seqs(self) -> int:
        """Held-out windows drawn besides: ``HELDOUT_WINDOWS`` when a criterion needs them, else none."""
        from ghosted.selection.criteria import CRITERIA

        return HELDOUT_WINDOWS if any(CRITERIA[m].cost == "heldout" for m in self.metrics if m in CRITERIA) else 0

    def check(self, cfg: DeployConfig) -> None:
        from ghosted.selection.criteria import RECOVERABILITY

        if not self.metrics:
            raise ValueError("Choose at least one criterion.")
        if set(self.metrics) & RECOVERABILITY and not self.rec_n:
            raise ValueError("Recoverability needs at least one block size n.")
        cfg.check_criteria(self.metrics)  # demo: no pass per layer, no backward pass
        cfg.check_calibration(self.calib_seqs, self.seq_len, self.heldout_seqs)

    def validate(self, lm) -> None:
        """The windows within the model's positions (as the command line checks them)."""
        from ghosted.experiments import validate

        validate.check_positions(validate.facts_of_model(lm.model).max_positions, seq_len=self.seq_len)

    def compute(self, lm, progress=None) -> Influence:
        from ghosted.experiments.session import Session

        spec = ExperimentSpec().with_options(calib=text_name(self.text), calib_seqs=self.calib_seqs,
                                             seq_len=self.seq_len, heldout_seqs=self.heldout_seqs, seed=0, cache=False)
        session = Session(spec, lm, progress, calibration_text=_given_text(self.text))
        report = session.influence(metrics=list(self.metrics), recoverability_n_values=sorted(self.rec_n) or None,
                                   batch_size=4)  # the criteria's own default, as before
        return Influence(self.model, report, session.calibration().fit.protocol)


def apply_preset(report, preset: str, n: int) -> tuple[list[int], str]:
    """The layers a preset of the Influence page picks from ``report`` (and why)."""
    from ghosted.selection.rules import select

    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join(PRESETS)}.")
    return select(report, PRESETS[preset][0], n)


# --- calibration and fit ------------------------------------------------------------------------------

@dataclass(frozen=True)
class FitRequest(_Request):
    """The Calibrate & recover page's run: calibrate on ``text``, drop ``layers``, fit ``methods``."""

    model: str = BUNDLED_KEY  # model key
    text: object = "bundled:news"  # source name or TextSource
    layers: tuple[int, ...] = ()  # the layers to drop
    calib_seqs: int = 32  # windows the operators are fitted on
    seq_len: int = 128  # tokens per window
    heldout_seqs: int = 4  # extra windows never fitted: the held-out errors
    seed: int = 0  # which windows are drawn
    methods: tuple[str, ...] = DEFAULT_METHODS  # fitted besides plain pruning
    ghost_mode: str = "independent"  # independent (paper) or sequential
    batch_size: int = 4  # windows per forward pass
    granularity: str = "auto"  # one operator per block, per layer, or auto
    kind = "fit"

    def check(self, cfg: DeployConfig, n_layers: int) -> None:
        if not self.layers:
            raise ValueError("Choose at least one layer to drop (Influence page) first.")
        if len(set(self.layers)) >= n_layers:
            raise ValueError(f"That drops all {n_layers} layers: keep at least one.")
        cfg.check_calibration(self.calib_seqs, self.seq_len, self.heldout_seqs)

    def validate(self, lm) -> None:
        """The command line's model checks on this run's spec: layers within the model, windows within its
        positions (``ghosted.experiments.validate.check_run_model``)."""
        from ghosted.experiments import validate

        validate.check_run_model(self.spec(lm), validate.facts_of_model(lm.model))

    def spec(self, lm) -> ExperimentSpec:
        """The same spec ``python -m ghosted run`` builds from its flags (the settings under their own names)."""
        from ghosted.models.pruning import format_layers

        settings = {name: getattr(self, name) for name in SPEC_SETTINGS}
        return ExperimentSpec().with_options(
            **settings, model=lm.source, calib=text_name(self.text), drop=format_layers(list(self.layers)),
            methods=["dense", "none", *self.methods], device=lm.device, dtype=lm.dtype,
            cache=True)  # statistics shared on disk

    def session(self, lm, progress=None):
        """A ``Session`` on this run's spec with the loaded model (an uploaded text read as given)."""
        from ghosted.experiments.session import Session

        return Session(self.spec(lm), lm, progress, calibration_text=_given_text(self.text))

    def compute(self, lm, progress=None) -> FittedRun:
        started = time.perf_counter()
        session = self.session(lm, progress)
        windows = session.calibration()
        run = session.fit(list(self.layers)).recovery
        if progress is not None:
            progress("spectra and errors", 0, 1)
        frames = {"errors": run.errors(), "spectra": run.spectra(), "asymmetry": run.asymmetry(),
                  "sinks": run.sinks, "token_shares": run.token_shares(), "sink_spectra": run.sink_spectra(),
                  "positions": run.position_shares(), "choices": run.choices()}
        held = windows.heldout
        return FittedRun(model=self.model, run=run, config=session.spec, layers=list(self.layers),
                         methods=["none", *self.methods], frames=frames, protocol=windows.fit.protocol,
                         heldout_protocol=held.protocol if held else None, seconds=time.perf_counter() - started)


def _given_text(text) -> TextSource | None:
    """The text itself when a request holds one (an upload); None when it names a source the spec reads."""
    return text if isinstance(text, TextSource) else None


def variants(lm, fitted: FittedRun) -> dict:
    """Dense model first, then the pruned one, then each recovered model (new objects; never modified)."""
    return {"dense": lm.model, **{label(m): r.model for m, r in fitted.run.results.items()}}


def label(method: str) -> str:
    """Display name of a method, from the registry: 'none' is the plainly pruned model ('pruned')."""
    from ghosted.recovery.methods import label_of

    return label_of(method)


# --- measurements on a fitted run ---------------------------------------------------------------------

@dataclass(frozen=True)
class EvalRequest(_Request):
    """The Compare page's perplexity: ``eval_tokens`` of ``text`` in windows of ``eval_seq_len``."""

    fit: FitRequest = field(default_factory=FitRequest)  # the run whose variants are scored
    text: object = "bundled:wiki"  # source name or TextSource (its evaluation part)
    eval_tokens: int = 4096  # tokens to score
    eval_seq_len: int = 512  # tokens per window
    kind = "evaluate"

    def check(self, cfg: DeployConfig) -> None:
        cfg.check_eval(self.eval_tokens)

    def validate(self, lm) -> None:
        """The command line's checks of the evaluation's size and the run's model checks on this spec
        (the evaluation window within the model's positions among them)."""
        from ghosted.experiments import validate

        spec = self.spec_of(lm)
        validate.check_run_model(spec, validate.facts_of_model(lm.model))  # the window against the positions first
        flat = spec.flat()  # the command line's names
        validate.check_eval_size(flat.eval_tokens, validate.eval_window(flat))

    def spec_of(self, lm) -> ExperimentSpec:
        """The fit's spec scoring ``eval_tokens`` of ``text`` in windows of ``eval_seq_len``."""
        return self.fit.spec(lm).with_options(eval=text_name(self.text), eval_tokens=self.eval_tokens,
                                              eval_seq_len=self.eval_seq_len)

    def session(self, lm, progress=None):
        """The fit's session, its spec scoring ``eval_tokens`` of ``text`` in windows of ``eval_seq_len``."""
        from ghosted.experiments.session import Session

        return Session(self.spec_of(lm), lm, progress, calibration_text=_given_text(self.fit.text),
                       evaluation_text=_given_text(self.text))

    def compute(self, lm, fitted: FittedRun, progress=None) -> Evaluation:
        """``Session.evaluate`` of every variant (perplexity with its interval, KL and top-1 agreement
        with dense, paired differences), plus each variant's size, memory and latency."""
        from ghosted.evaluation.perplexity import forward_latency
        from ghosted.models.architecture import describe

        session = self.session(lm, progress)
        table = session.evaluate(session_run(fitted))
        models = session.models(session_run(fitted))
        prompt = next(iter(session.evaluation().texts.values())).input_ids[:1, :LATENCY_TOKENS]  # (1, T)
        sizes = []
        for i, model in enumerate(models.values()):
            if progress is not None:
                progress("latency", i, len(models))
            facts = describe(model)
            sizes.append({"parameters (M)": round(facts["parameters"] / 1e6, 2), "memory (MB)": facts["memory_mb"],
                          "latency (ms)": round(1e3 * forward_latency(model, prompt, repeats=2), 1)})
        rows = VariantTable.from_records([{**r, **size} for r, size in zip(table.records(), sizes)])
        return Evaluation(rows, dict(table.rows[0].protocol))


def session_run(fitted: FittedRun):
    """The app's fitted run as the session's ``FittedRun`` (its spec, layers and fits)."""
    from ghosted.experiments.session import FittedRun as SessionRun

    return SessionRun(fitted.config, fitted.layers, fitted.run)


@dataclass(frozen=True)
class ZeroShotRequest(_Request):
    """The Compare page's zero-shot scores: ``tasks`` with ``task_limit`` examples each."""

    fit: FitRequest = field(default_factory=FitRequest)
    tasks: tuple[str, ...] = ("bundled-lastword",)  # task names
    task_limit: int = 100  # examples per task
    kind = "zeroshot"

    def check(self, cfg: DeployConfig) -> None:
        if not self.tasks:
            raise ValueError("Choose at least one task: tick bundled-lastword or name an lm-evaluation-harness task.")

    def compute(self, lm, fitted: FittedRun, progress=None) -> ZeroShot:
        """``Session.tasks`` on every variant: accuracy with its 95 % interval per task."""
        from ghosted.experiments.session import Session

        spec = fitted.config.with_options(tasks=list(self.tasks), task_limit=self.task_limit, num_fewshot=0)
        run = Session(spec, lm, progress).tasks(variants(lm, fitted))
        notes = [f"zero-shot: skipping {task}: {why}" for task, why in run.skipped.items()]
        return ZeroShot(run.frame, run.protocols, run.skipped, notes)


@dataclass(frozen=True)
class GenerationRequest(_Request):
    """The Compare page's generations: ``new_tokens`` greedy tokens after each prompt, per variant."""

    fit: FitRequest = field(default_factory=FitRequest)
    prompts: tuple[str, ...] = ()  # non-empty lines
    new_tokens: int = 24  # tokens generated per prompt
    chat: bool = False  # wrap each prompt in the chat template
    kind = "generate"

    def check(self, cfg: DeployConfig) -> None:
        if not self.prompts:
            raise ValueError("Type at least one prompt.")
        cfg.check_generation(self.new_tokens, self.prompts)

    def compute(self, lm, fitted: FittedRun, progress=None) -> Generations:
        """``Session.generate`` on every variant (greedy), with where each departs from dense."""
        from ghosted.experiments.session import Session

        run = Session(fitted.config, lm, progress).generate(variants(lm, fitted), list(self.prompts),
                                                            max_new_tokens=self.new_tokens, chat=self.chat)
        return Generations(run.prompts, run.texts, run.departures)


# --- the shared store ---------------------------------------------------------------------------------

def results_dir() -> Path:
    """Where precomputed and finished results are kept (``$GHOSTED_RESULTS`` overrides)."""
    env = os.environ.get("GHOSTED_RESULTS")
    return Path(env) if env else cache_dir() / "results"


def bound_stats_cache(cfg: DeployConfig) -> None:
    """Apply the deployment's bound on the statistics cache to this process (an explicit
    ``$GHOSTED_STATS_CACHE_GB`` wins): the app and the precompute script share the cache."""
    if cfg.stats_cache_gb is not None:
        os.environ.setdefault("GHOSTED_STATS_CACHE_GB", str(cfg.stats_cache_gb))


def shared_store(max_entries: int = 64, idle_s: float | None = None, folder: str | Path | None = None) -> ResultStore:
    """A result store with the codecs of every result that has a plain-JSON form."""
    return ResultStore(max_entries=max_entries, idle_s=idle_s, folder=folder or results_dir(),
                       codecs={"influence": Codec(codecs.encode_influence, codecs.decode_influence),
                               "evaluate": Codec(codecs.encode_evaluation, codecs.decode_evaluation),
                               "zeroshot": Codec(codecs.encode_zeroshot, codecs.decode_zeroshot),
                               "generate": Codec(asdict, codecs.decode_generations)})

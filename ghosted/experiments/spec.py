"""One experiment as data: the model, calibration, evaluation, the layers, the methods, the recovery.

``ExperimentSpec`` is what ``python -m ghosted run`` and ``export``, the grid, the app and the API
build and run; it is saved, as ``to_dict()``, under ``"spec"`` in the results JSON (``run --out``)
and in the ``ghosted_recipe.json`` saved with a model, and ``from_dict`` (or ``load_spec`` on such a
file) rebuilds it, so that ``python -m ghosted run --recipe FILE`` reruns the experiment.

Every leaf field carries its command-line flag in its metadata (``flag``, ``help``, and optionally
``choices``, ``metavar``, ``invert`` for a ``--no-X`` switch, ``option`` for its flat name, ``parse``
for a comma list): ``add_spec_args`` (``ghosted.experiments.spec_flags``) adds the flags to a parser and
``spec_from_args`` reads them back, so that a field and its flag cannot drift apart. The flat names (the
flags' argparse destinations, ``calib_seqs``, ``eval_seq_len``, ...) are also what ``options()`` /
``with_options`` speak.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass, replace
from types import SimpleNamespace

from ghosted.models.assets import BUNDLED_MODEL
from ghosted.experiments.spec_help import (TEXT_CHOICES, comma_list, methods_help_text, parse_task_list,
                                           protocol_choices, protocol_help, select_help)
from ghosted.recovery.methods import DEFAULT

SPEC_VERSION = 1  # bumped when a field changes meaning


def _option(default, flag: str, help, **extra):
    """A spec field with its command-line flag; a list default becomes a factory."""
    meta = {"flag": flag, "help": help, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelSpec:
    """Which model, and where and in which precision it runs."""

    source: str = _option(BUNDLED_MODEL, "--model",  # the bundled model, a folder, a .gguf file or a hub id
                          "bundled model (default), local Hugging Face folder, local .gguf file or hub id")
    device: str = _option("auto", "--device",  # cuda > mps > cpu
                          "auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps")
    dtype: str = _option("auto", "--dtype",  # bfloat16 on GPU, float32 on CPU
                         "auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    device_map: str | None = _option(None, "--device-map",  # None: one device; "auto": sharded by accelerate
                                     "pass 'auto' to shard a model larger than one device (accelerate)")
    trust_remote_code: bool = _option(False, "--trust-remote-code",  # never run a hub model's code unasked
                                      "run code shipped with a hub model (off by default)")
    layerwise: bool = _option(False, "--layerwise",  # each layer read from the shards only while it runs
                              "read the decoder layers one at a time from the safetensors checkpoint (a model "
                              "larger than the device's memory; calibration, fits and perplexity)")


@dataclass
class CalibrationSpec:
    """The calibration windows: which text, how many, how long, which ones, and how many held out."""

    source: str = _option("bundled:news", "--calib",  # calibration text (paper: C4 train)
                          "calibration text: " + TEXT_CHOICES, option="calib")
    calib_seqs: int = _option(32, "--calib-seqs",  # windows fitted (paper: 32 for the ghost operator)
                              "calibration sequences (default 32)", offered=(1, 4096))
    seq_len: int = _option(256, "--seq-len",  # tokens per calibration window (paper: 2048)
                           "calibration sequence length (default 256)", offered=(8, 8192))
    heldout_seqs: int = _option(8, "--heldout-seqs",  # extra windows, never fitted: held-out errors, ghost-auto
                                "extra calibration windows kept out of the fit for held-out errors (default 8)",
                                offered=(0, 1024))
    seed: int = _option(0, "--seed",  # which windows are drawn
                        "which calibration windows are drawn (default 0)", offered=(0, 2**31 - 1))
    batch_size: int = _option(4, "--batch-size",  # windows per forward pass (calibration and evaluation)
                              "windows per forward pass (default 4)", offered=(1, 256))
    cache: bool = _option(True, "--no-cache",  # reuse calibration statistics saved earlier, save new ones
                          "compute calibration statistics again instead of reusing (and saving) them; "
                          "see 'python -m ghosted cache'", invert=True, option="cache")

    def windows(self, tokenizer, text=None):
        """(fit windows, held-out windows or None): ``calib_seqs + heldout_seqs`` windows drawn once, the last
        ``heldout_seqs`` kept out of the fit. ``text``: the text itself, when ``source`` only names it (an
        uploaded file in the app)."""
        from ghosted.data.windows import split_calibration
        from ghosted.data.windows import calibration_windows

        drawn = calibration_windows(tokenizer, self.source if text is None else text,
                                    self.calib_seqs + self.heldout_seqs, self.seq_len, self.seed)
        return split_calibration(drawn, self.heldout_seqs)


@dataclass
class EvaluationSpec:
    """How the models are scored: perplexity on a text (or a named protocol) and zero-shot tasks."""

    source: str = _option("bundled:wiki", "--eval",  # evaluation text (paper: WikiText-2 test, PTB, C4)
                          "evaluation text, same choices as --calib (default bundled:wiki); the same source as "
                          "--calib is split (calibration: first 80 %%, evaluation: last 20 %%), another one is "
                          "read whole, from its start", option="eval")
    eval_tokens: int = _option(16384, "--eval-tokens",  # tokens of evaluation text (paper: the whole test split)
                               "evaluation tokens (default 16384)", offered=(64, 10_000_000))
    eval_seq_len: int = _option(512, "--eval-seq-len",  # perplexity window (paper: 2048)
                                "perplexity window (default 512)", offered=(16, 32768))
    protocol: str = _option("", "--protocol",  # a preset of evaluation.protocols ("paper", "bundled"); "": the above
                            protocol_help, choices=protocol_choices)
    tasks: list[str] = _option([], "--tasks",  # zero-shot tasks: "bundled-lastword", lm-eval task names
                               "comma list of tasks scored for every method: bundled-lastword (offline, the last "
                               "word of bundled Wikipedia paragraphs) and lm-evaluation-harness task names (e.g. "
                               "arc_easy, hellaswag; online, needs requirements-eval.txt). A task that cannot be "
                               "loaded is skipped", parse=parse_task_list)
    task_limit: int | None = _option(None, "--task-limit",  # examples per task (None: all)
                                     "examples per task (None: all; bundled-lastword has 500)", metavar="N")
    num_fewshot: int = _option(0, "--num-fewshot",  # few-shot examples per task (the paper: zero-shot)
                               "few-shot examples per task (the paper: 0)", metavar="K")


@dataclass
class LayersSpec:
    """The layers removed: given (``drop``), or chosen by a criterion (``select`` and ``n``)."""

    drop: str = _option("", "--drop",  # 0-based, ranges inclusive, e.g. "20-26" or "3,7,9-11"
                        "layers to remove, 0-based, ranges inclusive: '20-26' or '3,7,9-11'")
    select: str = _option("", "--select",  # or a criterion of ghosted.selection.criteria.CRITERIA chooses them
                          select_help, metavar="METRIC")
    n: int = _option(0, "--n",  # how many layers ``select`` removes
                     "how many layers --select removes")


@dataclass
class RecoverySpec:
    """How the removed layers are recovered (the settings every method shares)."""

    ghost_mode: str = _option("independent", "--ghost-mode",  # every fit on the dense model (paper), or sequential
                              "fit every operator on the dense model (paper), or each on the model already "
                              "pruned and patched upstream", choices=["independent", "sequential"])
    granularity: str = _option("auto", "--granularity",  # block for a single block, per layer otherwise (paper)
                               "one operator per contiguous block or per removed layer (auto: block for a single "
                               "block, per layer otherwise, as the paper)", choices=["auto", "block", "layer"])
    eps: float = _option(1e-6, "--eps",  # ridge of the ghost solve (the paper's code)
                         "ridge of the ghost solve")
    solver: str = _option("solve", "--solver",  # normal equations; "pinv": exact minimum-norm
                          "normal equations, or the exact minimum-norm pseudo-inverse", choices=["solve", "pinv"])
    rank: int | None = _option(None, "--rank",  # ghost-lowrank's rank R (None: d/4)
                               "rank R of ghost-lowrank's correction M = U·V (2·d·R parameters; default d/4)")
    fold: bool = _option(True, "--no-fold",  # fold ReplaceMe's map into the weights when it can
                         "keep ReplaceMe's map as a hooked operator instead of folding it into weights",
                         invert=True, option="fold")
    replaceme_ridge: float = _option(0.0, "--replaceme-ridge",  # ReplaceMe's alpha (0 in its configs)
                                     "ridge of ReplaceMe's least-squares map (its configs: 0)")
    cos_epochs: int = _option(10, "--cos-epochs",  # ReplaceMe-cosine: Adam epochs over the reservoir (its default)
                              "replaceme-cos: Adam epochs over the token reservoir (its default 10)")
    cos_lr: float = _option(1e-4, "--cos-lr",  # ReplaceMe-cosine learning rate (its default)
                            "replaceme-cos: learning rate (its default 1e-4)")
    cos_batch_tokens: int = _option(1024, "--cos-batch-tokens",  # ReplaceMe-cosine minibatch (its default)
                                    "replaceme-cos: tokens per minibatch (its default 1024)")
    sink_position: bool = _option(True, "--no-sink-position",  # robust methods: each window's first token is a sink
                                  "robust methods: do not treat the first token of each window as a sink",
                                  invert=True, option="sink_position")
    sink_norm_factor: float | None = _option(None, "--sink-norm-factor",  # also ‖x‖ > factor × median (None: off)
                                             "robust methods: also treat tokens with a norm above this factor "
                                             "times the median as sinks", metavar="FACTOR")
    sink_map: str = _option("constant", "--sink-map",  # what sinks become: the mean X_post, or an affine map
                            "robust methods: what sink tokens are mapped to", choices=["constant", "affine"])
    choose_ridge: bool = _option(True, "--no-choose-ridge",  # robust methods: ridge chosen on held-out tokens
                                 "robust methods: keep --eps instead of choosing the ridge on held-out windows",
                                 invert=True, option="choose_ridge")


RECOVERY_DETAILS = ["replaceme_ridge", "cos_epochs", "cos_lr", "cos_batch_tokens", "sink_position",
                    "sink_norm_factor", "sink_map", "choose_ridge"]  # the flags of the "recovery details" group


@dataclass
class ExperimentSpec:
    """One experiment. Defaults are the paper's protocol scaled down for a CPU."""

    model: ModelSpec = field(default_factory=ModelSpec)  # the bundled model, device and dtype chosen for the machine
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)  # 32 + 8 windows of 256 bundled:news tokens
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)  # 16384 tokens of bundled:wiki, window 512
    layers: LayersSpec = field(default_factory=LayersSpec)  # none: give drop, or select and n
    methods: list[str] = _option(["dense", "none", DEFAULT], "--methods",  # ghost-auto: the paper's fit
                                 methods_help_text, parse=comma_list)  # or the sink-robust one per gap
    recovery: RecoverySpec = field(default_factory=RecoverySpec)  # the paper's ridge and solver, independent fits

    def to_dict(self) -> dict:
        """Plain JSON: ``{"spec_version": 1, "model": {...}, "calibration": {...}, ...}``."""
        return {"spec_version": SPEC_VERSION, **_plain(self)}

    @classmethod
    def from_dict(cls, data: dict) -> ExperimentSpec:
        """The spec ``to_dict`` wrote; a missing field takes its default, an unknown one is refused."""
        if not isinstance(data, dict):
            raise TypeError(f"An experiment spec is a JSON object, not {type(data).__name__}.")
        data = dict(data)
        version = data.pop("spec_version", SPEC_VERSION)
        if type(version) is not int or version != SPEC_VERSION:
            raise ValueError(f"This spec has spec_version {version!r}; this Ghosted reads version {SPEC_VERSION}. "
                             "Use the Ghosted version that wrote it (see the file's \"versions\").")
        spec = _build(cls, data, "spec")
        if spec.model.trust_remote_code:  # never taken from a file: only the command line, the API or the app
            _warn_remote_code_ignored(spec.model.source)
            spec = replace(spec, model=replace(spec.model, trust_remote_code=False))
        return spec

    def options(self) -> dict:
        """Every field under its flat name (the command line's: ``calib_seqs``, ``eval_seq_len``, ...)."""
        return {_flat_name(f): _get(self, path) for path, f in _leaves(type(self))}

    def flat(self) -> SimpleNamespace:
        """``options()`` as attributes, for checks written against the command line's names."""
        return SimpleNamespace(**self.options())

    def with_options(self, **options) -> ExperimentSpec:
        """A copy with fields changed by their flat names (``with_options(calib_seqs=8)``)."""
        paths = {_flat_name(f): path for path, f in _leaves(type(self))}
        unknown = sorted(set(options) - set(paths))
        if unknown:
            hints = "".join(f" {name} is now {FORMER_NAMES[name]}." for name in unknown if name in FORMER_NAMES)
            raise TypeError(f"Unknown experiment setting(s) {', '.join(unknown)};{hints} "
                            f"known: {', '.join(paths)}.")
        spec = self
        for name, value in options.items():
            spec = _set(spec, paths[name], list(value) if isinstance(value, (list, tuple)) else value)
        return spec

    def recovery_config(self):
        """The ``RecoveryConfig`` these settings give (``recover``'s settings)."""
        from ghosted.calibration.collect import CalibrationConfig
        from ghosted.recovery.fitting import RecoveryConfig

        r, c = self.recovery, self.calibration
        same = {f.name for f in fields(RecoveryConfig)} & {f.name for f in fields(RecoverySpec)}  # by name
        values = {name: getattr(r, name) for name in same}
        if self.model.layerwise:  # a layer read from the checkpoint has no weight to fold into: the hooked form
            values["fold"] = False
        return RecoveryConfig(**values, calibration=CalibrationConfig(batch_size=c.batch_size, seed=c.seed))


# ------------------------------------------------------------------------------------ the fields
FORMER_NAMES = {"mode": "ghost_mode", "replaceme_fold": "fold", "n_seqs": "calib_seqs", "heldout": "heldout_seqs"}
# names earlier versions took for these settings: refused, with the name to use instead


def offered_range(name: str) -> tuple[int, int]:
    """(least, most) the app's inputs and links offer for the whole-number setting ``name`` (its field's
    ``offered`` metadata, declared once beside its flag); what a deployment allows may be less
    (``ghosted.service.deploy``), what the command line accepts is ``validate``'s bounds."""
    for _, f in _leaves(ExperimentSpec):
        if _flat_name(f) == name and "offered" in f.metadata:
            return f.metadata["offered"]
    raise KeyError(f"{name} is not a whole-number setting with an offered range")


def setting_choices(name: str) -> list[str]:
    """The choices of the setting ``name`` (its field's ``choices`` metadata)."""
    for _, f in _leaves(ExperimentSpec):
        if _flat_name(f) == name and "choices" in f.metadata:
            return list(_called(f.metadata["choices"]))
    raise KeyError(f"{name} is not a setting with choices")


def flat_flags(spec_class=None) -> dict[str, str]:
    """Every setting's flat name -> its command-line flag (``{"calib_seqs": "--calib-seqs", ...}``), from
    the fields' metadata, so that messages name a setting both ways without a hand-kept map."""
    return {_flat_name(f): f.metadata["flag"] for _, f in _leaves(spec_class or ExperimentSpec)}


def _leaves(cls, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(path, field) of every field with a flag, depth first, in declaration order."""
    for f in fields(cls):
        if is_dataclass(f.default_factory):
            yield from _leaves(f.default_factory, (*path, f.name))
        elif "flag" in f.metadata:
            yield (*path, f.name), f


def _flat_name(f) -> str:
    return f.metadata.get("option") or f.metadata["flag"].lstrip("-").replace("-", "_")


def _get(spec, path: tuple[str, ...]):
    for name in path:
        spec = getattr(spec, name)
    return list(spec) if isinstance(spec, list) else spec


def _set(spec, path: tuple[str, ...], value):
    """A copy of ``spec`` with the field at ``path`` set (the nested parts copied, never changed)."""
    if len(path) == 1:
        return replace(spec, **{path[0]: value})
    return replace(spec, **{path[0]: _set(getattr(spec, path[0]), path[1:], value)})


def _plain(spec) -> dict:
    return {f.name: (_plain(getattr(spec, f.name)) if is_dataclass(f.default_factory)
                     else _get(spec, (f.name,))) for f in fields(spec)}


def _build(cls, data: dict, where: str):
    """``cls`` from its dict; a missing field takes its default, an unknown one is refused."""
    if not isinstance(data, dict):
        raise TypeError(f"'{where}' of an experiment spec must be a JSON object, not {type(data).__name__}.")
    known = {f.name: f for f in fields(cls)}
    data = _current_keys(data, FORMER_KEYS.get(where, {}), where)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"Unknown key(s) in '{where}' of the experiment spec: {', '.join(unknown)}. "
                         f"Known: {', '.join(known)}. Was the file written by a newer Ghosted, or edited by hand?")
    values = {}
    for name, value in data.items():
        nested = known[name].default_factory
        values[name] = (_build(nested, value, f"{where}.{name}") if is_dataclass(nested)
                        else _file_value(known[name], value, f"{where}.{name}"))
    return cls(**values)


# Keys the files of earlier versions gave these fields (same meaning: read under the current name).
FORMER_KEYS = {"spec.calibration": {"count": "calib_seqs", "length": "seq_len", "heldout": "heldout_seqs"},
               "spec.evaluation": {"tokens": "eval_tokens", "window": "eval_seq_len"}}


def _current_keys(data: dict, former: dict[str, str], where: str) -> dict:
    """``data`` with each former key under its current name; a file giving both names is refused."""
    both = sorted(old for old, new in former.items() if old in data and new in data)
    if both:
        raise ValueError(f"'{where}' of the experiment spec gives {', '.join(both)} and "
                         f"{', '.join(former[k] for k in both)}: one setting under two names; keep the second.")
    return {former.get(key, key): value for key, value in data.items()}


def _file_value(f, value, where: str):
    """A file's value for the field ``f``, checked as its flag checks it: the flag's type (a JSON boolean for
    a switch, a whole number for a count, a number for a real, a string or a list of strings), its
    choices, and its comma-list parsing; ``null`` only where the default is. Ranges are checked with
    every other setting by ``ghosted.experiments.validate.check_run``."""
    from ghosted.experiments.facts import is_whole_number

    label = f"'{where}' ({f.metadata['flag']})"
    kind = f.type.replace(" | None", "")
    if value is None:
        if "None" in f.type:
            return None
        raise TypeError(f"{label} of the experiment spec must be {_KIND_WORDS[kind]}, not null.")
    checks = {"bool": lambda v: isinstance(v, bool), "int": is_whole_number, "str": lambda v: isinstance(v, str),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}
    if not checks[kind](value):
        raise TypeError(f"{label} of the experiment spec must be {_KIND_WORDS[kind]}, not {value!r} "
                        f"({type(value).__name__}).")
    choices = _called(f.metadata.get("choices"))
    if choices and value not in choices and not (value == "" and f.default == ""):
        raise ValueError(f"{label} of the experiment spec is {value!r}; choose from {', '.join(choices)}.")
    if "parse" in f.metadata:
        return f.metadata["parse"](",".join(value))
    return float(value) if kind == "float" else value


def _called(value):
    """A metadata value that may be computed on use (help and choices that read the registry)."""
    return value() if callable(value) else value


_KIND_WORDS = {"bool": "true or false (a JSON boolean)", "int": "a whole number", "float": "a number",
               "str": "a string", "list[str]": "a list of strings"}


def _warn_remote_code_ignored(source: str) -> None:
    import warnings

    warnings.warn(f"The experiment spec asks for trust_remote_code (running the Python code shipped with {source}); "
                  "it is never taken from a file. Give --trust-remote-code (trust_remote_code=True in the API) "
                  "yourself if you trust that code.", UserWarning, stacklevel=3)

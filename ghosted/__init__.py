"""Ghosted: prune whole decoder layers from causal LMs and recover them without training.

The functions a notebook needs, in the order one uses them::

    import ghosted
    lm = ghosted.load()                                   # bundled SmolLM2-135M-Instruct
    calib = ghosted.calibrate(lm, calib_seqs=16, seq_len=128)   # calibration windows
    report = ghosted.influence(lm, calib, n_values=[7])     # layer-selection criteria
    drop, why = ghosted.select(report, "recoverability", 7)
    run = ghosted.fit(lm, drop, calib, methods=["ghost"])   # one recovered model per method
    ghosted.evaluate(run.results["ghost"].model, lm)      # perplexity, with its protocol
    ghosted.save(run.results["ghost"].model, "out", lm, recipe=run)
    lm2 = ghosted.load("out")                             # the same model back

Nothing heavy is imported until a function is called. The modules behind these functions have
names of their own (``ghosted.calibration.collect``, ``ghosted.selection.criteria``, ``ghosted.models.pruning``,
``ghosted.evaluation.perplexity``, ``ghosted.evaluation.generation``), so ``ghosted.prune`` is always the function.
"""

from __future__ import annotations

import os

from ghosted.core.guards import IllConditionedFitWarning, NonFiniteError  # light: no torch import
from ghosted.core.version import __version__  # a constant: no import of any weight


def _is_loaded(obj) -> bool:
    from ghosted.models.loading import LoadedModel

    return isinstance(obj, LoadedModel)


def _model_of(obj):
    """The nn.Module inside a ``LoadedModel`` (or the object itself)."""
    return obj.model if _is_loaded(obj) else obj


def _tokenizer_of(obj):
    """The tokenizer of a ``LoadedModel`` (or the object itself)."""
    return obj.tokenizer if _is_loaded(obj) else obj


def load(source: str | None = None, **options):
    """Load a model and its tokenizer as a ``LoadedModel`` (``.model``, ``.tokenizer``).

    ``source`` is the bundled model (default), a Hugging Face folder, a .gguf file or a hub id; a
    folder written by ``save`` comes back with its recovery operators. ``options`` are those of
    ``ghosted.models.loading.load_model`` (device, dtype, device_map, offload_folder, revision, ...).

    Example:
        >>> lm = ghosted.load()                                  # CPU, float32
        >>> lm = ghosted.load("./Llama-3.1-8B", dtype="bfloat16", device_map="auto")
    """
    from ghosted.operators.checkpoint import load_any

    return load_any(source, **options)


def calibrate(tokenizer, source: str = "bundled:news", calib_seqs: int = 32, seq_len: int = 256,
              seed: int = 0, **former):
    """Calibration text as ``TokenWindows``: ``calib_seqs`` random windows of ``seq_len`` tokens (the spec's
    and the command line's names: ``--calib-seqs``, ``--seq-len``; ``n_seqs`` is read as ``calib_seqs``, with a
    DeprecationWarning).

    ``tokenizer`` may be a ``LoadedModel``. Sources: "bundled:news" (default), "bundled:wiki", a
    plain-text file (any extension) or .jsonl file, or a hub dataset when online. Calibration uses the
    first 80 % of a source's documents; evaluating on the same source uses the last 20 %, so the two
    never share text.

    Example:
        >>> calib = ghosted.calibrate(lm, calib_seqs=16, seq_len=128)
        >>> calib.input_ids.shape                                # (16, 128)
    """
    from ghosted.experiments import validate
    from ghosted.data.windows import calibration_windows

    calib_seqs = _former_names(former, {"n_seqs": "calib_seqs"}, "calibrate").get("calib_seqs", calib_seqs)
    validate.check_windows("calib_seqs", calib_seqs, "seq_len", seq_len)
    validate.check_seed(seed)
    validate.check_source(source, "calibration")
    if _is_loaded(tokenizer):
        validate.check_positions(validate.facts_of_model(tokenizer.model).max_positions, seq_len=seq_len)
    return calibration_windows(_tokenizer_of(tokenizer), source, calib_seqs, seq_len, seed)


def influence(model, windows, heldout=None, progress=None, **config):
    """Layer-selection criteria of ``model`` on ``windows`` as an ``InfluenceReport``.

    ``config`` are fields of ``ghosted.selection.criteria.InfluenceConfig`` (metrics, n_values, ...); metrics
    may use the criteria's aliases (shortgpt, bi, streamline, angular, ppl, taylor+). By default every
    criterion of one forward pass is computed; without ``heldout`` windows the held-out ones are left out.
    ``progress`` receives ``(stage, done, total)`` (``ghosted.core.progress``; e.g. ``TqdmProgress()``).

    Example:
        >>> report = ghosted.influence(lm, calib, n_values=[7])
        >>> report.matrix("recoverability")                      # start × n, lower is better
    """
    from ghosted.experiments.session import CalibrationWindows, Session
    from ghosted.selection.criteria import CRITERIA, SINGLE_PASS

    if heldout is None and "metrics" not in config:
        config["metrics"] = [m for m in SINGLE_PASS if CRITERIA[m].cost != "heldout"]
    _check_influence_config(_model_of(model), windows, config)
    session = Session(_spec_of({"cache": False}), _as_loaded(model), progress,
                      windows=CalibrationWindows(windows, heldout))
    return session.influence(**config)


def _check_influence_config(model, windows, config: dict) -> None:
    """Criteria names (aliases resolved in place), sizes, eps and block sizes, before the forward pass."""
    from dataclasses import fields

    from ghosted.experiments import validate
    from ghosted.selection.criteria import InfluenceConfig, resolve_criterion

    unknown = set(config) - {f.name for f in fields(InfluenceConfig)}
    if unknown:
        raise TypeError(f"Unknown settings {sorted(unknown)}; use fields of InfluenceConfig "
                        f"({', '.join(f.name for f in fields(InfluenceConfig))}).")
    if "metrics" in config:
        metrics = [config["metrics"]] if isinstance(config["metrics"], str) else list(config["metrics"])
        if not metrics:
            raise ValueError("Give at least one criterion (metrics=[...]).")
        config["metrics"] = list(dict.fromkeys(resolve_criterion(m) for m in metrics))
    validate.check_count("batch_size", config.get("batch_size", 1), 1, validate.MAX_BATCH)
    validate.check_eps(config.get("eps", 0.0))
    total = validate.facts_of_model(model).layers
    for key in ("n_values", "recoverability_n_values"):
        for n in config.get(key) or []:
            validate.check_n(n, total, key)
    _check_windows(model, windows)


def _check_windows(model, windows, name: str = "windows") -> None:
    """Token windows (``TokenWindows``) with at least one window, within the model's positions."""
    from ghosted.experiments import validate

    if not hasattr(windows, "input_ids"):
        raise TypeError(f"{name} must be TokenWindows (from ghosted.calibrate), not {type(windows).__name__}.")
    if windows.input_ids.ndim != 2 or windows.input_ids.size(0) < 1:
        raise ValueError(f"{name} holds no window: give at least one (n_seqs >= 1).")
    validate.check_positions(validate.facts_of_model(model).max_positions, seq_len=windows.input_ids.size(1))


def select(source, metric: str, n: int, windows=None, heldout=None, config=None):
    """The ``n`` layers criterion ``metric`` removes, and a sentence saying why.

    ``source`` is an ``InfluenceReport``, or a model with ``windows`` (only ``metric`` is computed); a
    ``LoadedModel`` without ``windows`` is scored on the windows ``python -m ghosted run`` draws (the
    spec's calibration: ``calib_seqs`` fitted, ``heldout_seqs`` held out).

    Example:
        >>> drop, why = ghosted.select(report, "recoverability", 7)   # e.g. [20, ..., 26]
    """
    from ghosted.selection.rules import select as select_layers

    if windows is None and _is_loaded(source):
        from ghosted.experiments.spec import ExperimentSpec

        windows, heldout = ExperimentSpec().calibration.windows(source.tokenizer)
    return select_layers(source, metric, n, windows=windows, heldout=heldout, config=config)


def fit(model, drop, windows=None, methods=("ghost-auto",), heldout=None, progress=None, **settings):
    """Prune ``drop`` and fit each recovery method: a ``RecoveryRun``.

    ``methods`` is a name or a list (``python -m ghosted methods`` lists them). The default,
    ``ghost-auto``, keeps the paper's fit (``ghost``), the sink-robust one or no operator per gap,
    whichever gives the lower next-token loss on held-out windows. ``windows``: ``TokenWindows`` to fit
    on (with ``heldout`` windows beside them when a method needs held-out windows); without ``windows``
    they are drawn as ``python -m ghosted run`` draws them (``model`` must then be a ``LoadedModel``):
    ``calib_seqs`` windows of the ``calib`` text fitted and ``heldout_seqs`` more kept apart. ``settings``
    are the experiment spec's names, as the command line's flags spell them (``ghost_mode``,
    ``granularity``, ``eps``, ``solver``, ``rank``, ``fold``, ``batch_size``, ``seed``, ``calib``,
    ``calib_seqs``, ``seq_len``, ``heldout_seqs``, ``cache``, ...; ``python -m ghosted run --help``).
    ``model`` is never changed; every method gets a new model. ``progress`` receives ``(stage, done, total)``.

    Example:
        >>> run = ghosted.fit(lm, "20-26", calib, methods=["none", "ghost"])
        >>> run.results["ghost"].model        # the recovered model
        >>> run.errors()                      # boundary errors per gap and method
    """
    from ghosted.experiments import validate
    from ghosted.experiments.session import CalibrationWindows, Session
    from ghosted.recovery.methods import needing_heldout

    methods = validate.check_methods(methods)
    made = _model_settings(model)  # so that the spec a save writes names the model it was fitted on
    spec = _spec_of({"cache": False, **made, **settings}, methods=methods)  # the API saves no statistics unasked
    validate.check_drop(drop, validate.facts_of_model(_model_of(model)).layers)  # before any forward pass
    _check_fit_settings(settings)
    given = None
    if windows is not None:
        _check_windows(_model_of(model), windows)
        if heldout is None and needing_heldout(methods):
            raise ValueError(f"{', '.join(needing_heldout(methods))} chooses on held-out windows: give `heldout` "
                             "windows beside `windows`, or leave `windows` out to draw both as the spec says "
                             "(calib_seqs fitted, heldout_seqs kept apart).")
        given = CalibrationWindows(windows, heldout)
    elif not _is_loaded(model):
        raise TypeError("Without `windows` they are drawn with the model's tokenizer: give a LoadedModel "
                        "(ghosted.load(...)), or give `windows` (ghosted.calibrate(...)).")
    session = Session(spec, _as_loaded(model), progress, windows=given)
    return session.fit(drop).recovery


def _spec_of(settings: dict, base=None, **fixed):
    """The experiment spec with ``settings`` (the spec's flat names, the only names taken) over the
    defaults; an unknown name is a TypeError that lists the known ones (and the new name of an old one)."""
    from ghosted.experiments.spec import ExperimentSpec

    return (base or ExperimentSpec()).with_options(**settings, **fixed)


def _model_settings(model) -> dict:
    """The spec's model settings for a ``LoadedModel`` loaded from a source (its source and precision); none
    for a bare model, which no spec loads again."""
    if not _is_loaded(model) or model.kind == "module":
        return {}
    return {"model": model.source, "dtype": model.dtype}


def _as_loaded(model):
    """A ``LoadedModel`` as it is; a bare model wrapped (no tokenizer: windows must be given)."""
    if _is_loaded(model):
        return model
    from ghosted.evaluation.perplexity import model_dtype_device
    from ghosted.models.loading import LoadedModel

    dtype, device = model_dtype_device(model)
    return LoadedModel(model, None, "in memory", "module", device, dtype, 0.0)


def _check_fit_settings(settings: dict) -> None:
    """The numbers a user passes to ``fit``: eps, batch size and seed."""
    from ghosted.experiments import validate

    if "eps" in settings:
        validate.check_eps(settings["eps"])
    if "batch_size" in settings:
        validate.check_count("batch_size", settings["batch_size"], 1, validate.MAX_BATCH)
    if "seed" in settings:
        validate.check_seed(settings["seed"])


def run(spec=None, model=None, progress=None, **options):
    """Run one experiment: ``spec`` (an ``ghosted.experiments.spec.ExperimentSpec``, or None for the
    defaults) with ``options`` changed by the spec's names, as the command line's flags spell them
    (``drop="20-26"``, ``calib_seqs=16``, ``ghost_mode="sequential"``). ``model``: the model's source
    (a folder, .gguf, hub id), or a ``LoadedModel`` to use instead of loading one. Returns (the JSON
    report, the ``RecoveryRun``), exactly as ``python -m ghosted run --out`` (the report holds the spec
    under "spec").

    Example:
        >>> report, run = ghosted.run(drop="20-26", methods=["dense", "ghost"], calib_seqs=16)
        >>> [(e["method"], e["ppl"]) for e in report["results"]]
    """
    from ghosted.experiments.run import run_experiment

    loaded = model if _is_loaded(model) else None
    if model is not None and loaded is None:
        if not isinstance(model, str):
            raise TypeError(f"model must be a source (str) or a LoadedModel, not {type(model).__name__}.")
        options["model"] = model
    return run_experiment(_spec_of(options, base=spec), loaded=loaded, progress=progress)


def prune(model, drop):
    """A new model without layers ``drop`` (e.g. "20-26" or [3, 7]), sharing the kept weights.

    Plain pruning, no recovery (``fit`` gives recovered models).

    Example:
        >>> pruned = ghosted.prune(lm, "20-26")
        >>> pruned.config.num_hidden_layers                      # 23 for SmolLM2's 30 layers
    """
    from ghosted.models.pruning import prune as prune_layers

    return prune_layers(_model_of(model), drop)


def evaluate(model, data=None, source: str = "bundled:wiki", eval_tokens: int = 16384, eval_seq_len: int = 512,
             batch_size: int = 4, calibration_source: str | None = "bundled:news", progress=None, **former):
    """Perplexity of ``model`` as a ``PerplexityResult`` (ppl, nll, scored tokens, protocol).

    ``data`` is ``TokenWindows``, or a tokenizer / ``LoadedModel`` to cut ``eval_tokens`` tokens of
    ``source`` into windows of ``eval_seq_len`` (the spec's names; ``tokens`` and ``seq_len`` are read as
    them, with a DeprecationWarning): its last 20 % when it is also ``calibration_source``
    (the default calibration text, bundled:news), else the whole source from its start
    (``protocol["part"]`` says which). ``ghosted.evaluate(lm)``
    evaluates a ``LoadedModel`` on its own tokenizer. ``progress`` receives ``(stage, done, total)``.

    Example:
        >>> print(ghosted.evaluate(run.results["ghost"].model, lm, eval_tokens=4096))
        PPL ... on bundled:wiki (4088 tokens scored, 8 windows of 512, ...)
    """
    from ghosted.experiments import validate
    from ghosted.experiments.session import Session

    renamed = _former_names(former, {"tokens": "eval_tokens", "seq_len": "eval_seq_len"}, "evaluate")
    eval_tokens, eval_seq_len = renamed.get("eval_tokens", eval_tokens), renamed.get("eval_seq_len", eval_seq_len)
    data = model if data is None else data
    validate.check_count("batch_size", batch_size, 1, validate.MAX_BATCH)
    windows = data if hasattr(data, "input_ids") else None
    texts = {}  # a text given as itself (a TextSource), not by name: the session reads it as given
    if windows is None:
        validate.check_eval_size(eval_tokens, eval_seq_len)
        validate.check_source(source, "evaluation")
        texts = {key: text for key, text in (("evaluation_text", source), ("calibration_text", calibration_source))
                 if text is not None and not isinstance(text, (str, os.PathLike))}
    calib = source if calibration_source is None else calibration_source
    names = {"eval": _text_name(source), "eval_tokens": eval_tokens, "eval_seq_len": eval_seq_len,
             "batch_size": batch_size, "calib": _text_name(calib), "cache": False}
    session = Session(_spec_of(names), _with_tokenizer(model, data), progress, **texts)
    if windows is None:
        windows = next(iter(session.evaluation().texts.values()))
    _check_windows(_model_of(model), windows)
    return session.perplexity(_model_of(model), windows)


def _former_names(given: dict, former: dict[str, str], function: str) -> dict:
    """Keywords an earlier version took under another name, under the current one (a DeprecationWarning
    each); any other keyword is refused, as Python refuses it."""
    import warnings

    unknown = sorted(set(given) - set(former))
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    for old in given:
        warnings.warn(f"ghosted.{function}({old}=...) is now {former[old]}=... (the spec's and the command "
                      "line's name)", DeprecationWarning, stacklevel=3)
    return {former[old]: value for old, value in given.items()}


def _text_name(text) -> str:
    """A text's name in a spec: the name itself, a path as a string, a ``TextSource`` by its name."""
    return os.fspath(text) if isinstance(text, (str, os.PathLike)) else str(getattr(text, "name", "text"))


def _with_tokenizer(model, data):
    """``model`` as a ``LoadedModel`` whose tokenizer is ``data``'s (a tokenizer or a ``LoadedModel``)."""
    from dataclasses import replace

    loaded = _as_loaded(model)
    tokenizer = _tokenizer_of(data) if not hasattr(data, "input_ids") else loaded.tokenizer
    return loaded if tokenizer is loaded.tokenizer else replace(loaded, tokenizer=tokenizer)


def generate(model, tokenizer, prompts, **overrides):
    """Continue each prompt (greedy by default); returns the new text of each.

    ``tokenizer`` may be a ``LoadedModel``; ``overrides`` are ``GenerationConfig`` fields
    (max_new_tokens, greedy, temperature, chat, ...).

    Example:
        >>> ghosted.generate(model, lm, "The capital of France is", max_new_tokens=10)
        [' Paris, ...']
    """
    from ghosted.evaluation.generation import generate as continue_prompts

    return continue_prompts(_model_of(model), _tokenizer_of(tokenizer), prompts, **overrides)


def save(model, path, tokenizer=None, recipe=None, **save_options):
    """Save a recovered model as a Hugging Face folder plus operators and ``ghosted_recipe.json``.

    ``tokenizer`` may be the ``LoadedModel`` (its source is recorded), ``recipe`` the
    ``RecoveryRun``; ``save_options`` go to ``save_pretrained`` (e.g. ``max_shard_size="5GB"``).
    See ``ghosted.operators.checkpoint.save_recovered``; ``ghosted.load(path)`` brings it back.

    Example:
        >>> ghosted.save(run.results["ghost"].model, "smollm2-ghost", lm, recipe=run)
    """
    from ghosted.operators.checkpoint import save_recovered

    return save_recovered(_model_of(model), path, tokenizer, recipe, **save_options)


save_recovered = save  # the same function under the name of ghosted.operators.checkpoint's


def load_recovered(path, device: str = "auto", dtype: str = "auto", **options):
    """Load a folder written by ``save``, operators re-attached: a ``LoadedModel``.

    Example:
        >>> lm = ghosted.load_recovered("smollm2-ghost")
        >>> lm.extra["recipe"]["dropped_spec"]                   # "20-26"
    """
    from ghosted.operators.checkpoint import load_recovered as load_saved

    return load_saved(path, device=device, dtype=dtype, **options)


__all__ = ["load", "calibrate", "influence", "select", "fit", "run", "prune", "evaluate", "generate",
           "save", "save_recovered", "load_recovered", "IllConditionedFitWarning", "NonFiniteError",
           "__version__"]

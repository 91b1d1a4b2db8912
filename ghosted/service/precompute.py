"""Answers before anyone asks: fill the shared store with what visitors or a class will request.

At image build (the Dockerfile runs ``python scripts/precompute.py``) this stores, for the bundled model,
the influence report at the Influence page's defaults, and for each of the page's presets (n = the
default block size) the fitted run's calibration statistics (in the statistics cache) and its
evaluations at the Compare page's default size and at the teaching flow's 1,024 tokens (in the result
store). A visitor who follows the defaults then gets the report and the perplexities at once, and the fit
without a calibration pass.

A teacher can precompute their own list on a classroom server (``--list FILE``, JSON or TOML), e.g.::

    [[experiment]]
    model = "HuggingFaceTB/SmolLM2-360M-Instruct"   # one the deployment allows
    layers = "20-25"                                # or: preset = "Streamline block of n" and n = 6
    methods = ["ghost-auto", "ghost"]
    eval_tokens = [1024]

The file is untrusted input: unknown keys, wrong types, methods outside the registry, layers out of range
and models the deployment does not allow are refused with one message naming the entry.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ghosted.service import workbench as wb
from ghosted.service.deploy import DeployConfig, from_env

TEACHING_EVAL_TOKENS = 1024  # the teaching flow's evaluation size (docs/DEPLOY.md, the load benchmark)
DEFAULT_N = 6  # the Influence page's default block size for its presets
KEYS = {"model": str, "layers": str, "preset": str, "n": int, "methods": list, "eval_tokens": list}  # per entry
MAX_ENTRIES = 64  # a list longer than this is refused (each entry is a calibration pass)


@dataclass(frozen=True)
class Experiment:
    """One entry: a model, its layers (given, or chosen by a preset on the default influence report),
    the methods to fit and the evaluation sizes."""

    model: str = wb.BUNDLED_MODEL  # model source
    layers: str | None = None  # drop notation, e.g. "20-25"
    preset: str | None = "Streamline block of n"  # used when ``layers`` is None
    n: int = DEFAULT_N  # the preset's block size
    methods: tuple[str, ...] = wb.DEFAULT_METHODS  # fitted besides plain pruning
    eval_tokens: tuple[int, ...] = (wb.EvalRequest().eval_tokens, TEACHING_EVAL_TOKENS)  # evaluation sizes


def default_plan() -> list[Experiment]:
    """The bundled model with every Influence preset at the default n."""
    return [Experiment(preset=name) for name in wb.PRESETS]


def server_plan(cfg: DeployConfig) -> list[Experiment]:
    """The plan this server was precomputed with: the teacher's list ``$GHOSTED_PRECOMPUTE_LIST`` names
    (the file ``--list`` read), else the default plan."""
    import os

    listed = os.environ.get("GHOSTED_PRECOMPUTE_LIST", "").strip()
    return read_plan(listed, cfg) if listed else default_plan()


def read_plan(path: str | Path, cfg: DeployConfig) -> list[Experiment]:
    """The experiments of a teacher's list (JSON or TOML), each checked; ValueError names what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON or TOML list ({err}).") from None
    entries = data.get("experiment") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty list of experiments ([[experiment]] in TOML).")
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"{path}: {len(entries)} experiments; at most {MAX_ENTRIES} per list.")
    return [check_entry(entry, i, cfg) for i, entry in enumerate(entries, 1)]


def check_entry(entry, number: int, cfg: DeployConfig) -> Experiment:
    """One entry as an ``Experiment``, or ValueError saying which entry and why."""
    from ghosted.models.loading import ModelLoadError
    from ghosted.recovery.fitting import METHODS
    from ghosted.recovery.methods import RECOVERY, with_role

    where = f"experiment {number}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table of settings, got {type(entry).__name__}.")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}.")
    for key, kind in KEYS.items():
        if key in entry and (not isinstance(entry[key], kind) or isinstance(entry[key], bool)):
            raise ValueError(f"{where}: {key} must be a {kind.__name__}.")
    base = Experiment()
    methods = tuple(entry.get("methods", base.methods))
    recoveries = with_role(METHODS, RECOVERY)  # plain pruning is always fitted, never asked for
    bad = [m for m in methods if not isinstance(m, str) or m not in recoveries]
    if not methods or bad:
        offered = ", ".join(recoveries)
        raise ValueError(f"{where}: unknown method(s) {bad}; choose from {offered}.")
    tokens = tuple(entry.get("eval_tokens", base.eval_tokens))
    if not tokens or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 64 for t in tokens):
        raise ValueError(f"{where}: eval_tokens must be whole numbers of at least 64.")
    for t in tokens:
        cfg.check_eval(t)
    preset = entry.get("preset", None if "layers" in entry else base.preset)
    if preset is not None and preset not in wb.PRESETS:
        raise ValueError(f"{where}: unknown preset {preset!r}; choose from {', '.join(wb.PRESETS)}.")
    if "layers" in entry and "preset" in entry:
        raise ValueError(f"{where}: give layers or a preset, not both.")
    n = entry.get("n", base.n)
    if n < 1:
        raise ValueError(f"{where}: n must be at least 1.")
    model = entry.get("model", base.model)
    try:
        cfg.check_source(model)
    except ModelLoadError as err:
        raise ValueError(f"{where}: {err}") from None
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return Experiment(model=model, layers=entry.get("layers"), preset=preset, n=n, methods=methods,
                      eval_tokens=tokens)


def precompute(plan: list[Experiment], cfg: DeployConfig, say=print, progress=None) -> dict:
    """Compute and store every experiment of ``plan``; returns what was stored (keys by kind)."""
    from ghosted.models.architecture import num_layers
    from ghosted.models.pruning import parse_layers
    from ghosted.operators.checkpoint import load_any

    store, done = wb.shared_store(), {"influence": [], "fit": [], "evaluate": []}
    for model in dict.fromkeys(e.model for e in plan):
        spec = {**wb.DEFAULT_MODEL, "source": model}
        lm = load_any(model, dtype=spec["dtype"], device=spec["device"])
        key = wb.model_key(spec)
        influence = wb.InfluenceRequest(model=key)
        influence.check(cfg)
        report = _stored(store, influence, lambda r: r.compute(lm, progress), say).report
        done["influence"].append(influence.key())
        for e in (e for e in plan if e.model == model):
            layers = (parse_layers(e.layers, num_layers(lm.model)) if e.layers
                      else wb.apply_preset(report, e.preset, e.n)[0])
            fit = wb.FitRequest(model=key, layers=tuple(layers), methods=e.methods)
            fit.check(cfg, num_layers(lm.model))
            fitted = _stored(store, fit, lambda r: r.compute(lm, progress), say)
            done["fit"].append(fit.key())
            for tokens in e.eval_tokens:
                evaluation = replace(wb.EvalRequest(fit=fit), eval_tokens=tokens)
                _stored(store, evaluation, lambda r: r.compute(lm, fitted, progress), say)
                done["evaluate"].append(evaluation.key())
    return done


def warm_requests(plan: list[Experiment], store, model_key: str, n_layers: int) -> list[wb.FitRequest]:
    """The fit requests of ``plan`` for the model ``model_key`` names whose layers are known without a
    forward pass: given, or a preset on the influence report already in ``store`` (precomputed). The
    server queues them when it starts (``pages/_ui.warm_up``): a fitted run holds models, so it lives in
    memory only, and this refits it from the statistics cache before the first visitor asks."""
    from ghosted.models.pruning import parse_layers

    entries = [e for e in plan if wb.model_key({**wb.DEFAULT_MODEL, "source": e.model}) == model_key]
    if not entries:
        return []
    stored = store.get(wb.InfluenceRequest(model=model_key).key())
    requests = []
    for e in entries:
        if e.layers:
            layers = parse_layers(e.layers, n_layers)
        elif stored is not None:
            layers = wb.apply_preset(stored.report, e.preset, e.n)[0]
        else:
            continue  # no report to apply the preset to: the first visitor's influence job computes it
        requests.append(wb.FitRequest(model=model_key, layers=tuple(layers), methods=e.methods))
    return list(dict.fromkeys(requests))


def _stored(store, request, compute, say):
    """The stored result of ``request``, computed and stored first when missing."""
    found = store.get(request.key())
    if found is None:
        found = compute(request)
        store.put(request.key(), found, request.kind)
        say(f"precompute: {request.kind} {request.key()} stored")
    else:
        say(f"precompute: {request.kind} {request.key()} already stored")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="precompute", description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", help="a teacher's list of experiments (JSON or TOML); default: the bundled "
                                       "model's page defaults and presets")
    args = parser.parse_args(argv)
    cfg = from_env()
    try:
        plan = read_plan(args.list, cfg) if args.list else default_plan()
    except ValueError as err:
        print(f"precompute: {err}", file=sys.stderr)
        return 2
    wb.bound_stats_cache(cfg)  # the same bound the app applies
    done = precompute(plan, cfg)
    print(f"precompute: {len(done['influence'])} influence report(s), {len(done['fit'])} run(s), "
          f"{len(done['evaluate'])} evaluation(s) in {wb.results_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

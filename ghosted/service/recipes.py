"""The app's downloads of a run: its recipe and its full report.

The recipe is in the format of a saved model's ``ghosted_recipe.json`` (the same ``format``,
``format_version`` and field names), so one reader serves every recipe: ``spec_files.load_spec`` takes the
``spec`` it holds, and ``python -m ghosted run --recipe`` reruns it. Pages only offer these for download.
"""

from __future__ import annotations

from dataclasses import asdict

from ghosted.service.results import Evaluation, FittedRun
from ghosted.experiments.spec import ExperimentSpec
from ghosted.experiments.spec_flags import command
from ghosted.models.loading import versions
from ghosted.operators.checkpoint import RECIPE_FORMAT


def evaluated_spec(fitted: FittedRun, evaluation: Evaluation | None) -> ExperimentSpec:
    """The run's spec, with the evaluation text and size it was compared on (when it was)."""
    spec = fitted.config
    if evaluation is None:
        return spec
    p = evaluation.protocol
    return spec.with_options(eval=p["source"], eval_tokens=p["n_windows"] * p["seq_len"], eval_seq_len=p["seq_len"])


def recipe(lm, fitted: FittedRun, evaluation: Evaluation | None) -> dict:
    """Everything needed to redo the run: the model, layers, methods, settings, both protocols and the
    spec with the command that reruns it."""
    spec = evaluated_spec(fitted, evaluation)
    return {
        "format": "ghosted-recipe", "format_version": RECIPE_FORMAT,
        "base_model": {"name": lm.name, "source": lm.source, "kind": lm.kind, "revision": lm.revision},
        "dropped_layers": fitted.layers, "dropped_spec": spec.layers.drop, "methods": fitted.methods,
        "settings": asdict(fitted.run.config), "calibration": fitted.protocol, "heldout": fitted.heldout_protocol,
        "evaluation": evaluation.protocol if evaluation else None, "dtype": lm.dtype, "device": lm.device,
        "spec": spec.to_dict(), "command": command(spec), "versions": versions(),
    }


def report(lm, fitted: FittedRun, evaluation: Evaluation | None) -> dict:
    """The full report: the recipe, perplexities with their intervals, the gap errors and the asymmetry."""
    return {"recipe": recipe(lm, fitted, evaluation),
            "perplexity": evaluation.table.frame().to_dict("records") if evaluation else None,
            "gap_errors": fitted.frames["errors"].to_dict("records"),
            "asymmetry": fitted.frames["asymmetry"].to_dict("records")}


def variant_spec(fitted: FittedRun, method: str) -> dict:
    """The spec saved with one variant: the run's, with that method alone (as ``python -m ghosted export``)."""
    return fitted.config.with_options(methods=[method]).to_dict()

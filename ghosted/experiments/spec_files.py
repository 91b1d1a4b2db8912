"""Reading an experiment spec back from a file: a results JSON (``run --out``), a ``ghosted_recipe.json``, the
app's recipe, or a saved model folder. Every file is untrusted input: read once within a size bound, and its
spec rebuilt field by field by ``ExperimentSpec.from_dict``.
"""

from __future__ import annotations

from pathlib import Path

from ghosted.core.untrusted import read_json_file
from ghosted.experiments.spec import ExperimentSpec

# Why a recipe holds no experiment spec (the "no_spec" key a save writes), in the words the refusal uses.
NO_SPEC = {"windows": "its model was fitted on calibration windows no spec draws again (held-out windows given "
                      "beside them, an in-memory text, or a recover() call outside a session)",
           "no-run": "its model was saved without the run that made it (no recipe=run given to save)",
           "older": "it was written by an older Ghosted, before results and recipes recorded the spec"}

def load_spec(path: str | Path) -> ExperimentSpec:
    """The spec held by a results JSON (``run --out``), a ``ghosted_recipe.json``, the app's recipe, or a
    saved model folder (its recipe)."""
    from ghosted.models.loading import RECIPE_FILE

    file = Path(path)
    if file.is_dir():
        file = file / RECIPE_FILE
    if not file.exists():
        raise FileNotFoundError(f"No recipe at {file}: give a results JSON (run --out), a {RECIPE_FILE} or the "
                                "folder of a saved model.")
    data = read_json_file(file, "recipe")  # a regular file of bounded size, read once
    spec = data.get("spec") if isinstance(data, dict) else None
    if spec is None:
        key = data.get("no_spec") if isinstance(data, dict) else None  # untrusted: only a known key is read
        why = NO_SPEC.get(key, NO_SPEC["older"]) if isinstance(key, str) else NO_SPEC["older"]
        raise ValueError(f"{file} holds no experiment spec: {why}. Rerun it with flags (its \"config\" or "
                         "\"settings\" say which); loading a model saved with it still works.")
    try:
        return ExperimentSpec.from_dict(spec)
    except (TypeError, ValueError) as err:  # the same kind, naming the file
        raise type(err)(f"{file}: {err}") from None


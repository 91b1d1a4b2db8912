"""Export page: results (CSV, JSON), the recipe that reproduces them, and the recovered model."""

import io
import json
import tempfile
import zipfile
from pathlib import Path

import streamlit as st

from ghosted.service.frontend import recipes, save_recovered, workbench as wb
from pages import _ui


def zipped(model, lm, run, spec: dict) -> bytes:
    """The recovered model as a zip of a Hugging Face folder (built only when downloaded)."""

    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_recovered(model, Path(tmp) / "model", lm, recipe=run, spec=spec)
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:  # weights do not compress
            for file in sorted(folder.rglob("*")):
                archive.write(file, file.relative_to(folder.parent))
    return buffer.getvalue()


def model_section(cfg, lm, stored: wb.FittedRun) -> None:
    """The chosen variant as a zip (built on click) or saved to a folder; off where not allowed."""
    st.subheader("Recovered model")
    if not cfg.allow_model_download:
        st.info(f"Model download is off in the {cfg.name} deployment. Run Ghosted on a workstation "
                "(or use the recipe above with `python -m ghosted run`) to get the weights.")
        return
    run = stored.run
    names = list(run.results)
    method = st.selectbox("Variant", names, format_func=_ui.label, index=min(1, len(names) - 1))
    model = run.results[method].model
    spec = recipes.variant_spec(stored, method)
    st.download_button("Download the model (zip)", data=lambda: zipped(model, lm, run, spec),
                       file_name=f"ghosted-{method}.zip", mime="application/zip", icon=":material/download:")
    st.caption("A Hugging Face folder: kept weights, tokenizer, `ghosted_recipe.json` and, when the "
               "method adds operators, `ghosted_operators.safetensors` (load with `ghosted.load_recovered`).")
    if cfg.allow_local_paths:
        with st.form("save_form"):
            target = st.text_input("Or save it to a folder on this machine", placeholder="./smollm2-ghost",
                                   key="save_target")
            overwrite = st.checkbox("Replace the model already in that folder", key="save_overwrite",
                                    help="Never allowed for the model's own folder or Ghosted's cache.")
            if st.form_submit_button("Save", key="save_submit"):
                save_to(model, lm, run, target, overwrite, spec)


def save_to(model, lm, run, target: str, overwrite: bool = False, spec: dict | None = None) -> None:
    """Save a variant into a folder on the server (workstations only); a non-empty folder only
    with ``overwrite``, the model's own folder and Ghosted's cache never."""

    if not target.strip():
        raise ValueError("Type a folder to save into.")
    try:
        with st.spinner("Saving..."):
            folder = save_recovered(model, Path(target.strip()).expanduser(), lm, recipe=run,
                                    overwrite=overwrite, spec=spec)
    except OSError as err:
        raise ValueError(f"Could not write to {target.strip()}: {err.strerror or err}") from None
    st.success(f"Saved to {folder.resolve()}")


_ui.require_frame(__file__)
st.title("Export")
lm = _ui.require_model()
stored = _ui.require_run("Nothing to export yet")
evaluated = stored.evaluation
st.subheader("Results")
cols = st.columns(3)
if evaluated:
    cols[0].download_button("Perplexity table (CSV)", evaluated.table.frame().to_csv(index=False),
                            "ghosted_perplexity.csv", "text/csv")
else:
    cols[0].caption("Evaluate perplexity on the Compare page to export it.")
cols[1].download_button("Gap errors (CSV)", stored.frames["errors"].to_csv(index=False),
                        "ghosted_gap_errors.csv", "text/csv")
cols[2].download_button("Full report (JSON)", json.dumps(recipes.report(lm, stored, evaluated), indent=2, default=str),
                        "ghosted_report.json", "application/json")
st.subheader("Recipe")
the_recipe = recipes.recipe(lm, stored, evaluated)
st.download_button("Recipe (JSON)", json.dumps(the_recipe, indent=2, default=str), "ghosted_recipe.json",
                   "application/json")
st.code(the_recipe["command"], language="bash")
with st.expander("Recipe contents"):
    st.json(the_recipe)
with _ui.user_errors("Not saved: "):
    model_section(_ui.deployment(), lm, stored)

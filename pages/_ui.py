"""Streamlit code shared by every page: state keys, the cached model, errors, long jobs, sidebar.

Cross-page facts live under explicit ``ghosted.*`` keys of ``st.session_state`` (widget keys do not
survive a page switch). The model is cached once per process and shared by every browser session,
so nothing here ever modifies it: pruned and recovered variants are new objects built by
``ghosted.recovery.fitting``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st
import torch

from ghosted.models.architecture import describe, layer_param_count, num_layers
from ghosted.models.assets import BUNDLED_MODEL
from ghosted.core.progress import Progress
from ghosted.experiments.deploy import DeployConfig, from_env
from ghosted.operators.checkpoint import load_any
from ghosted.models.loading import LoadedModel, ModelLoadError, source_kind
from ghosted.models.pruning import format_layers
from ghosted.data.sources import SourceUnavailableError

if TYPE_CHECKING:
    import pandas as pd

    from ghosted.experiments.spec import ExperimentSpec
    from ghosted.recovery.fitting import RecoveryRun

MODEL = "ghosted.model"  # dict: the load arguments chosen on the Model page
INFO = "ghosted.model_info"  # dict: facts about the loaded model, for the sidebar badge
SELECTION = "ghosted.selection"  # list[int]: the layers to drop
REASON = "ghosted.selection_reason"  # str: why a preset chose the selection
INFLUENCE = "ghosted.layer_influence"  # dict: model key, settings and the influence report
RUN = "ghosted.run"  # StoredRun: the current calibration and what was measured on it
BUSY = "ghosted.busy"  # name of the job now running, or None
FRAMED = "ghosted.framed"  # set by app.py while it runs a page
DEEP_LINK = "ghosted.deep_link"  # page asked for before app.py had ever run on this server
RESULTS = (SELECTION, REASON, INFLUENCE, RUN)  # what a model switch invalidates

# What a user can cause (a wrong value or kind of value, a missing or unreadable file, a model or text that
# cannot be loaded): shown with st.error and its message, never as a traceback (st.exception).
USER_ERRORS = (ValueError, TypeError, OSError, ModelLoadError, SourceUnavailableError)
DEFAULT_SPEC = {"source": BUNDLED_MODEL, "dtype": "auto", "device": "auto", "device_map": None,
                "trust_remote_code": False}


def init_state() -> None:
    """Defaults for the cross-page keys (the bundled model, nothing selected, no job)."""
    st.session_state.setdefault(MODEL, dict(DEFAULT_SPEC))
    st.session_state.setdefault(SELECTION, [])
    st.session_state.setdefault(BUSY, None)


def require_frame(page_file: str) -> None:
    """Make sure the page runs inside app.py (navigation, sidebar badge).

    A ``pages/`` folder next to the entrypoint makes Streamlit run a deep-linked page (e.g. /compare)
    on its own until some session has called ``st.navigation``, i.e. on the first request after a
    server start. Such a run goes through app.py first, which then opens the page asked for.
    """
    if not st.session_state.get(FRAMED):
        st.session_state[DEEP_LINK] = f"pages/{Path(page_file).name}"
        st.switch_page("app.py")


def open_deep_link() -> None:
    """In app.py, after ``st.navigation``: open the page a first request asked for."""
    if target := st.session_state.pop(DEEP_LINK, None):
        st.switch_page(target)


def deployment() -> DeployConfig:
    """The deployment preset named by the environment (GHOSTED_DEMO=1 or GHOSTED_DEPLOY=...)."""
    return from_env()


def model_key(spec: dict) -> str:
    """A string naming everything that changes the loaded model; tags results with their model."""
    return "|".join(str(spec.get(k)) for k in DEFAULT_SPEC)


def _release(loaded: LoadedModel) -> None:
    """Free an evicted model's memory (called by the cache when another model replaces it)."""
    del loaded
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@st.cache_resource(max_entries=1, on_release=_release, show_spinner="Loading the model...")
def load_cached(source: str, dtype: str, device: str, device_map: str | None,
                trust_remote_code: bool) -> LoadedModel:
    """One model for the whole server, keyed on every argument that changes it. Never mutate it."""
    return load_any(source, dtype=dtype, device=device, device_map=device_map,
                    trust_remote_code=trust_remote_code)  # a saved recovered folder keeps its operators


def check_spec(spec: dict, cfg: DeployConfig) -> None:
    """Refuse a model the deployment forbids, before anything is loaded."""
    source = spec["source"]
    try:
        kind = source_kind(source)
    except ModelLoadError:  # a missing path: say "no local paths here" first where that applies
        if cfg.allow_local_paths:
            raise
        kind = "folder"
    cfg.check_model(source, kind, spec["trust_remote_code"])


def load(spec: dict) -> LoadedModel:
    """Check ``spec`` against the deployment, load it (cached) and record the badge facts."""
    check_spec(spec, deployment())
    loaded = load_cached(**spec)
    facts = describe(loaded.model)
    st.session_state[INFO] = {"key": model_key(spec), "name": loaded.name, "device": loaded.device,
                              "dtype": loaded.dtype, "layers": facts["layers"],
                              "parameters": facts["parameters"]}
    return loaded


def require_model() -> LoadedModel:
    """The current model (the bundled one by default); stops the page with an error if it fails."""
    init_state()
    try:
        return load(st.session_state[MODEL])
    except USER_ERRORS as err:
        st.error(f"The model could not be loaded. {err}")
        st.page_link("pages/model.py", label="Choose another model", icon=":material/memory:")
        st.stop()


def current_key() -> str:
    """Key of the model this session works on (results are tagged with it)."""
    return model_key(st.session_state.get(MODEL, DEFAULT_SPEC))


def switch_model(spec: dict) -> None:
    """Make ``spec`` the current model; results of another model are dropped."""
    if model_key(spec) != current_key():
        for key in RESULTS:
            st.session_state.pop(key, None)
        st.session_state[SELECTION] = []
    st.session_state[MODEL] = spec


def stored(key: str) -> dict | None:
    """A stored result, if it belongs to the current model."""
    value = st.session_state.get(key)
    return value if value and value.get("model") == current_key() else None


@dataclass
class StoredRun:
    """One calibration of this session: the fitted run, how it was made, and what was measured on it since.

    The Calibrate & recover page stores it (``store_run``); every other page reads it through ``require_run``
    or ``current_run``. Results measured later hang on the run itself, so a new run replaces them all at
    once and an evaluation can never be shown next to another run than its own.
    """

    model: str  # key of the model it was fitted on (``model_key``)
    run: RecoveryRun  # the operators and the recovered models, from ``ghosted.recovery.fitting``
    config: ExperimentSpec  # the settings, as ``python -m ghosted run`` takes them (``run --recipe``)
    layers: list[int]  # the dropped layers
    methods: list[str]  # "none" (plain pruning) first, then every fitted method
    frames: dict[str, pd.DataFrame]  # the run's tidy frames for display (errors, spectra, sinks, ...)
    protocol: dict  # the calibration windows (source, part, count, length, seed)
    heldout_protocol: dict | None  # the held-out windows; None when none were held out
    seconds: float  # wall time of the calibration and every fit
    evaluation: dict | None = None  # Compare page: perplexity, size and latency table, and its protocol
    zeroshot: dict | None = None  # Compare page: zero-shot accuracy frame, protocols, skipped tasks, notes
    generations: dict | None = None  # Compare page: prompts and each variant's continuations


def store_run(stored_run: StoredRun) -> None:
    """Make ``stored_run`` this session's run (what an earlier run measured goes with it)."""
    st.session_state[RUN] = stored_run


def current_run() -> StoredRun | None:
    """This session's run, if it was fitted on the current model."""
    stored_run = st.session_state.get(RUN)
    return stored_run if stored_run is not None and stored_run.model == current_key() else None


def require_run(needed_for: str) -> StoredRun:
    """This session's run; without one, say what it is needed for, link the page that makes it, stop."""
    stored_run = current_run()
    if stored_run is None:
        st.info(f"{needed_for}: calibrate and fit the recovery methods first (a small run takes seconds).",
                icon=":material/healing:")
        st.page_link("pages/recover.py", label="Calibrate & recover", icon=":material/arrow_forward:")
        st.stop()
    return stored_run


@contextmanager
def user_errors(prefix: str = ""):
    """Show a user mistake (bad path, impossible choice, offline source) as an error, no traceback."""
    try:
        yield
    except USER_ERRORS as err:
        st.error(f"{prefix}{err}", icon=":material/error:")


def start_job(name: str) -> None:
    """Form callback: mark a job as running, so its button renders disabled until it ends."""
    st.session_state[BUSY] = name


def busy() -> bool:
    """True while one of this session's jobs runs (its buttons are disabled)."""
    return bool(st.session_state.get(BUSY))


def run_job(name: str, label: str, work: Callable[[Progress], object]) -> object | None:
    """Run ``work(progress)`` inside ``st.status`` with a progress bar; None on a user error.

    The busy flag is cleared however the job ends, also when a rerun (a click elsewhere, a page
    switch) interrupts it, so the button never stays disabled.
    """
    if st.session_state.get(BUSY) != name:
        return None
    try:
        with st.status(label, expanded=True) as status:
            try:
                result = work(StreamlitProgress())
            except USER_ERRORS as err:
                status.update(label=f"{label}: stopped", state="error")
                st.error(str(err), icon=":material/error:")
                return None
            status.update(label=f"{label}: done", state="complete", expanded=False)
            return result
    finally:
        st.session_state[BUSY] = None


class StreamlitProgress:
    """``ghosted.core.progress.Progress`` in the app: one ``st.progress`` bar that each stage refills,
    with ``stage: done/total`` as its text; a message (``total == 0``) is a caption line under it."""

    def __init__(self):
        self.bar = st.progress(0.0, text="starting")

    def __call__(self, stage: str, done: int, total: int) -> None:
        if total <= 0:
            st.caption(stage)
            return
        self.bar.progress(min(done / total, 1.0), text=f"{stage}: {done}/{total}")


def selection() -> list[int]:
    """The layers to drop, as chosen on the Influence page."""
    return list(st.session_state.get(SELECTION, []))


def set_selection(layers) -> None:
    """Store the layers to drop (the one cross-page record of the selection)."""
    st.session_state[SELECTION] = sorted({int(i) for i in layers})


def check_selection(model, layers: list[int]) -> None:
    """Refuse an empty selection or one that removes every layer."""
    if not layers:
        raise ValueError("Choose at least one layer to drop (Influence page) first.")
    if len(set(layers)) >= num_layers(model):
        raise ValueError(f"That drops all {num_layers(model)} layers: keep at least one.")


def removed_share(model, layers: list[int]) -> float:
    """Share of the model's parameters that dropping ``layers`` removes."""
    total = sum(p.numel() for p in model.parameters())
    return sum(layer_param_count(model, i) for i in layers) / max(total, 1)


def selection_text(model, layers: list[int]) -> str:
    """E.g. "20-25 (6 of 30 layers, 17.9 % of parameters)"."""
    if not layers:
        return "no layers selected"
    share = removed_share(model, layers)
    return (f"{format_layers(layers)} ({len(layers)} of {num_layers(model)} layers, "
            f"{share:.1%} of parameters)")


def sidebar() -> None:
    """The badge shown on every page: deployment, loaded model and device, current selection."""
    cfg = deployment()
    with st.sidebar:
        st.markdown("### :material/blur_on: Ghosted")
        if cfg.is_restricted:
            st.caption(f"**{cfg.name}** deployment: limited models and sizes.")
        try:
            loaded = load(st.session_state[MODEL])
        except USER_ERRORS:
            st.warning("No model loaded. Choose one on the Model page.", icon=":material/memory:")
            return
        info = st.session_state[INFO]
        st.success(f"**{info['name']}**  \n{info['device']} · {info['dtype']} · {info['layers']} layers",
                   icon=":material/memory:")
        st.markdown(f"**Layers to drop:** {selection_text(loaded.model, selection())}")
        if run := current_run():
            st.caption(f"Recovered: {', '.join(label(m) for m in run.methods)}")


def label(method: str) -> str:
    """Display name of a method, from the registry: 'none' is the plainly pruned model ('pruned')."""
    from ghosted.recovery.methods import label_of

    return label_of(method)

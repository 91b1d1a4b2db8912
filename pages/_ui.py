"""Streamlit code shared by every page: state keys, the cached model, errors, long jobs, sidebar.

Cross-page facts live under explicit ``ghosted.*`` keys of ``st.session_state`` (widget keys do not
survive a page switch). The model is cached once per process and shared by every browser session,
so nothing here ever modifies it: pruned and recovered variants are new objects built by
``ghosted.recovery.fitting``.
"""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Callable
from urllib.parse import urlencode

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from ghosted.service.frontend import (DeployConfig, admit, JobQueue, LoadedModel, Progress, describe, from_env,
                                         heap, links, load_any, num_layers, precompute, release_gpu_cache,
                                         workbench as wb)
from pages import _restore
from pages._frame import DEEP_LINK, FRAMED, open_deep_link, require_frame  # noqa: F401 (re-exported)
from pages._status import (  # noqa: F401 (re-exported: pages call them here)
    USER_ERRORS, log_answered, log_event, log_panel, page_run, user_errors, wait_text)
from pages._selection import (  # noqa: F401 (re-exported: the pages call them through _ui)
    SELECTION, check_selection, selection, selection_text, set_selection)

MODEL = "ghosted.model"  # dict: the load arguments chosen on the Model page
INFO = "ghosted.model_info"  # dict: facts about the loaded model, for the sidebar badge
REASON = "ghosted.selection_reason"  # str: why a preset chose the selection
INFLUENCE = "ghosted.influence"  # InfluenceRequest: the influence report this session asked for
RUN = "ghosted.run"  # FitRequest: the calibration and fit this session asked for
EVALUATION = "ghosted.evaluation"  # EvalRequest: perplexity of the run's variants
ZEROSHOT = "ghosted.zeroshot"  # ZeroShotRequest: zero-shot accuracy of the run's variants
GENERATIONS = "ghosted.generations"  # GenerationRequest: the run's variants continuing prompts
BUSY = "ghosted.busy"  # name of the job whose button was clicked and not yet queued, or None
OWNER = "ghosted.owner"  # this session's token in the job queue (``owner``)
LINK_READ = "ghosted.link_read"  # True once this session's URL query parameters were read
RESULTS = (SELECTION, REASON, INFLUENCE, RUN, EVALUATION, ZEROSHOT, GENERATIONS)  # what a model switch drops
MEASURED = {EVALUATION: "evaluation", ZEROSHOT: "zeroshot", GENERATIONS: "generations"}  # on a fitted run
POLL_S = 1.0  # how often a waiting page asks the queue for news

DEFAULT_SPEC = wb.DEFAULT_MODEL


def init_state() -> None:
    """Defaults for the cross-page keys (the bundled model, nothing selected, no job)."""
    st.session_state.setdefault(MODEL, dict(DEFAULT_SPEC))
    st.session_state.setdefault(SELECTION, [])
    st.session_state.setdefault(BUSY, None)


def open_link() -> None:
    """Once per browser session, in app.py: restore the experiment the URL's query parameters name
    (``ghosted.service.links``) and ask for its run and evaluation (shown at once when computed)."""
    if st.session_state.get(LINK_READ):
        return
    st.session_state[LINK_READ] = True
    params = st.query_params.to_dict()
    if "layers" not in params:
        return
    try:
        spec = {**DEFAULT_SPEC, "source": str(params.get("model", DEFAULT_SPEC["source"]))}
        lm = load(spec)
        switch_model(spec)
        link = links.from_query(params, current_key(), num_layers(lm.model), deployment())
        for request in (link.fit, link.evaluation):
            if request is not None:
                admit(request, lm, deployment())  # refused at once, before anything is queued
    except USER_ERRORS as err:
        st.error(f"This link could not be opened. {err}", icon=":material/link_off:")
        return
    set_selection(link.fit.layers)
    st.session_state[REASON] = "from the link you opened"
    _restore.remember(link)  # the link's settings show in the forms of their pages
    ask(RUN, link.fit)
    if link.evaluation is not None:
        ask(EVALUATION, link.evaluation)


def experiment_link() -> str | None:
    """The URL that reopens this session's run and evaluation (None for a run on an uploaded text)."""
    fit = request_of(RUN)
    if fit is None:
        return None
    query = links.to_query(st.session_state[MODEL]["source"], fit, request_of(EVALUATION))
    if query is None:
        return None
    base = (st.context.url or "").split("?")[0]
    return f"{base}?{urlencode(query)}"


def deployment() -> DeployConfig:
    """The deployment preset named by the environment (GHOSTED_DEMO=1 or GHOSTED_DEPLOY=...)."""
    return from_env()


model_key = wb.model_key  # a string naming everything that changes the loaded model


def _release(loaded: LoadedModel) -> None:
    """Free an evicted model's memory (called by the cache when another model replaces it)."""
    del loaded
    heap.thaw()  # the released model's objects can be collected again
    gc.collect()
    release_gpu_cache()


@st.cache_resource(max_entries=1, on_release=_release, show_spinner="Loading the model...")
def load_cached(source: str, dtype: str, device: str, device_map: str | None,
                trust_remote_code: bool) -> LoadedModel:
    """One model for the whole server, keyed on every argument that changes it. Never mutate it."""
    loaded = load_any(source, dtype=dtype, device=device, device_map=device_map,
                      trust_remote_code=trust_remote_code)  # a saved recovered folder keeps its operators
    spec = {"source": source, "dtype": dtype, "device": device, "device_map": device_map,
            "trust_remote_code": trust_remote_code}
    _IDENTITIES[wb.model_key(spec)] = wb.local_identity(loaded)  # what is on disk now, as it was loaded
    heap.freeze_long_lived()  # collections after every page run stay cheap (ghosted.core.heap)
    return loaded


_IDENTITIES: dict[str, dict | None] = {}  # model key -> the content identity of the model loaded under it


def check_spec(spec: dict, cfg: DeployConfig) -> None:
    """Refuse a model the deployment forbids, before anything is loaded."""
    cfg.check_source(spec["source"], spec["trust_remote_code"])


def load(spec: dict) -> LoadedModel:
    """Check ``spec`` against the deployment, load it (cached under its canonical arguments) and record the
    badge facts."""
    check_spec(spec, deployment())
    spec = wb.canonical_model(spec, deployment())
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
    """Key of the model this session works on (results are tagged with it): its load arguments and, for a
    model from the server's disk, the content identity of what was loaded (not its path alone)."""
    spec = st.session_state.get(MODEL, DEFAULT_SPEC)
    return model_key(spec, _IDENTITIES.get(model_key(spec)))


def switch_model(spec: dict) -> None:
    """Make ``spec`` the current model (under its canonical arguments); results of another model are dropped."""
    spec = wb.canonical_model(spec, deployment())
    if model_key(spec) != model_key(st.session_state.get(MODEL, DEFAULT_SPEC)):
        for key in RESULTS:
            st.session_state.pop(key, None)
        st.session_state[SELECTION] = []
    st.session_state[MODEL] = spec


def backend_settings() -> DeployConfig:
    """The deployment, with its statistics cache bound applied to this process (an explicit
    ``$GHOSTED_STATS_CACHE_GB`` wins)."""
    cfg = deployment()
    wb.bound_stats_cache(cfg)
    return cfg


def backend() -> JobQueue:
    """The one job queue and result store of this server, shared by every browser session (created on
    first use; a module global rather than ``st.cache_resource``, so that clearing Streamlit's caches
    never drops jobs that are running)."""
    global _BACKEND
    with _BACKEND_LOCK:
        if _BACKEND is None:
            cfg = backend_settings()
            store = wb.shared_store(max_entries=cfg.shared_results, idle_s=cfg.idle_release_s)
            _BACKEND = JobQueue(store, alive=session_alive, max_owner_jobs=cfg.max_visitor_jobs,
                                max_owner_gb=cfg.max_visitor_gb)
        return _BACKEND


_BACKEND: JobQueue | None = None
_BACKEND_LOCK = threading.Lock()
_WARMED = False  # the precomputed fits were queued (``warm_up``)
WARM_OWNER = "server/warm-up"  # owner of the server's own jobs (always alive)


def owner() -> str:
    """Who waits for a job: "<server session id>/<a token of this session's state>" (the token tells
    apart sessions that share an id, as AppTest's do)."""
    ctx = get_script_run_ctx()
    token = st.session_state.setdefault(OWNER, uuid.uuid4().hex[:12])
    return f"{ctx.session_id if ctx is not None else 'script'}/{token}"


def session_alive(owner_id: str) -> bool:
    """False once the browser session has expired: connected, or disconnected but still kept for a reconnect
    (Streamlit keeps a dropped session's state for a while, so a few seconds' network drop keeps its jobs;
    a closed tab gives its place up when the session is forgotten). True where no server runs (tests) and
    for the server's own warm-up jobs."""
    from streamlit.runtime import Runtime

    if owner_id == WARM_OWNER:
        return True
    if not Runtime.exists():
        return True
    runtime, session_id = Runtime.instance(), owner_id.rsplit("/", 1)[0]
    sessions = getattr(runtime, "_session_mgr", None)  # the runtime names no public reader of the kept sessions
    if sessions is None or not hasattr(sessions, "get_session_info"):
        return runtime.is_active_session(session_id)  # an embedded runtime (AppTest): connected ones only
    return sessions.get_session_info(session_id) is not None


def warm_up() -> None:
    """Once per server, on its first page: queue the precomputed plan's fits for the default model (the
    influence report and the statistics are on disk; the fitted runs hold models, kept in memory only),
    so that the presets' runs are ready before anyone asks. Sessions asking for one join its job."""
    global _WARMED
    with _BACKEND_LOCK:
        if _WARMED or model_key(DEFAULT_SPEC) != current_key():
            return
        _WARMED = True
    try:
        lm = load(dict(DEFAULT_SPEC))
        plan = precompute.server_plan(deployment())
        requests = precompute.warm_requests(plan, backend().store, model_key(DEFAULT_SPEC), num_layers(lm.model))
    except USER_ERRORS:
        return  # a broken list or model: the pages say so when they are used; nothing to warm
    for fit in requests:
        backend().submit(fit.key(), fit.kind, work_of(fit, lm), WARM_OWNER, timed=False)  # not in estimates


def request_of(name: str):
    """This session's request under ``name``, if it belongs to the current model."""
    request = st.session_state.get(name)
    if name in MEASURED and request is not None and request.fit != st.session_state.get(RUN):
        return None  # measured on an earlier run
    model = getattr(getattr(request, "fit", request), "model", None)
    return request if request is not None and model == current_key() else None


def result(name: str):
    """The shared result of this session's request under ``name`` (read-only), or None."""
    request = request_of(name)
    return None if request is None else backend().store.get(request.key())


def work_of(request, lm: LoadedModel) -> Callable[[Progress], object]:
    """The job computing ``request``: a measurement also fits its run again if the store released it."""
    if isinstance(request, (wb.InfluenceRequest, wb.FitRequest)):
        return lambda progress: request.compute(lm, progress)
    fitted = backend().store.get(request.fit.key())
    if fitted is None:
        return lambda progress: request.compute(lm, request.fit.compute(lm, progress), progress)
    return lambda progress: request.compute(lm, fitted, progress)


def ask(name: str, request) -> None:
    """Make ``request`` this session's under ``name`` and queue it (joined with an identical one, or
    answered from the store at once), after the one door's checks (``cost.admit``: the model checks of
    the command line, the deployment's budget per job); the request it replaces stops being waited for."""
    lm = load(st.session_state[MODEL])
    cost = admit(request, lm, deployment())
    key, me = request.key(), owner()
    superseded = st.session_state.get(name)
    if superseded is not None and superseded.key() != key:
        backend().cancel(superseded.key(), me)  # its panel is gone: nobody here waits for it any more
    st.session_state[name] = request
    status = backend().submit(key, request.kind, work_of(request, lm), me, gb=cost.gb)
    log_event("asked", key=key, kind=request.kind, owner=me, state=status.state)


def start_job(name: str) -> None:
    """Form callback: remember the click, so that a rerun cannot lose it before the job is queued."""
    st.session_state[BUSY] = name


def clicked(name: str) -> bool:
    """True when ``name``'s button was clicked and its request is still to be queued."""
    return st.session_state.get(BUSY) == name


def queue_clicked(name: str, key: str, build: Callable[[], object]) -> None:
    """After a form: if its button was clicked, build its request (checked) and queue it; a user
    mistake is shown as an error. The click is forgotten only once handled."""
    if not clicked(name):
        return
    try:
        ask(key, build())
    except USER_ERRORS as err:
        st.error(str(err), icon=":material/error:")
    st.session_state[BUSY] = None


def busy(key: str | None = None) -> bool:
    """True while a click waits to be queued, or (with ``key``) while that request's job waits or runs."""
    if st.session_state.get(BUSY):
        return True
    request = request_of(key) if key else None
    if request is None:
        return False
    status = backend().status(request.key(), owner())
    return status is not None and not status.finished


def answer(name: str, label: str):
    """The result of this session's request under ``name``; while its job waits or runs, a panel that
    polls the queue (place, estimated wait, progress, cancel) and None. A result the store released is
    computed again; a failed job shows why and is forgotten."""
    request = request_of(name)
    if request is None:
        return None
    queue = backend()
    status = queue.status(request.key(), owner())
    if status is None:  # released while this session was away, or never queued: ask again
        ask(name, request)
        status = queue.status(request.key(), owner())
    if status is None or status.state == "done":
        found = status.result if status is not None and status.result is not None else result(name)
        if found is not None:
            log_answered(request.key(), owner())
        return found
    if status.finished:
        st.session_state.pop(name, None)
        if status.state == "cancelled":
            st.info(f"{label}: cancelled.", icon=":material/cancel:")
        elif isinstance(status.error, USER_ERRORS):
            st.error(f"{label}: stopped. {status.error}", icon=":material/error:")
        else:  # the operator's log has the traceback (ghosted.service.jobs)
            st.error(f"{label}: stopped by an internal error ({type(status.error).__name__}: {status.error}). "
                     "Try again; if it persists, tell the server's operator.", icon=":material/error:")
        return None
    job_panel(request.key(), label)
    return None


@st.fragment(run_every=POLL_S)
def job_panel(key: str, label: str) -> None:
    """What this session's job is doing, refreshed every ``POLL_S`` seconds without blocking the page;
    the whole page reruns once the job has ended."""
    queue = backend()
    status = queue.status(key, owner())
    if status is None or status.finished:
        st.rerun()
    log_panel(status, owner())
    with st.container(border=True):
        share = status.done / status.total if status.total else 0.0
        st.progress(min(max(share, 0.0), 1.0), text=f"**{label}**: {wait_text(status)}")
        st.button("Cancel", key=f"cancel_{key}", on_click=queue.cancel, args=(key, owner()),
                  icon=":material/cancel:")


def current_run() -> wb.FittedRun | None:
    """This session's fitted run (shared, read-only) with this session's measurements on it."""
    fitted = result(RUN)
    if fitted is None:
        return None
    fit_key = st.session_state[RUN].key()
    measured = {field: value for name, field in MEASURED.items()
                if (request := request_of(name)) is not None and request.fit.key() == fit_key
                and (value := backend().store.get(request.key())) is not None}
    return fitted.with_results(**measured)


def require_run(needed_for: str) -> wb.FittedRun:
    """This session's run; without one, say what it is needed for, link the page that makes it, stop."""
    stored_run = current_run()
    if stored_run is None:
        if request_of(RUN) is not None:
            answer(RUN, "Calibrating and fitting")
            st.stop()
        st.info(f"{needed_for}: calibrate and fit the recovery methods first (a small run takes seconds).",
                icon=":material/healing:")
        st.page_link("pages/recover.py", label="Calibrate & recover", icon=":material/arrow_forward:")
        st.stop()
    return stored_run


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


label = wb.label  # display name of a method: 'none' is the plainly pruned model

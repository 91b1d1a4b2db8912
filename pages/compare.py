"""Compare page: perplexity, boundary errors, spectra, generations, size and speed of each variant."""

import streamlit as st

from ghosted.service.frontend import IntervalConfig, lessons, offered_range, parse_tasks, workbench as wb
from pages import _assets, _charts, _fidelity, _restore, _text, _ui

LATENCY_TOKENS = wb.LATENCY_TOKENS  # tokens of the prompt timed per variant
DEFAULTS = wb.EvalRequest()  # the page's defaults: what the precompute script stores
BUNDLED_TASK = "bundled-lastword"  # the offline task (ghosted.evaluation.lastword)
DEMO_MAX_EXAMPLES = 100  # examples per task in a restricted (public demo) deployment
INTERVALS = IntervalConfig()  # how the evaluation's intervals are drawn (named in the caption)


def eval_form(cfg, fit: wb.FitRequest) -> None:
    """Evaluation text and size; a click queues the evaluation of ``fit``'s variants."""
    _restore.place(_restore.EVALUATION_KEYS)  # an opened link's settings
    kind = _text.text_kind(cfg, "bundled:wiki", "eval", "Evaluation text (a part never used for calibration)")
    with st.form("eval_form"):
        text = _text.text_inputs(cfg, kind, "eval")
        left, right = st.columns(2)
        eval_tokens = left.number_input("Tokens to score", *offered_range("eval_tokens"), DEFAULTS.eval_tokens,
                                        step=1024, key="eval_tokens")
        eval_seq_len = right.number_input("Window (tokens)", *offered_range("eval_seq_len"), DEFAULTS.eval_seq_len,
                                          step=128, key="eval_seq_len")
        if cfg.max_eval_tokens:
            st.caption(f"This deployment scores at most {cfg.max_eval_tokens:,} tokens.")
        st.form_submit_button("Evaluate perplexity", type="primary", key="evaluate_run",
                              disabled=_ui.busy(_ui.EVALUATION), on_click=_ui.start_job, args=("evaluate",))
    _ui.queue_clicked("evaluate", _ui.EVALUATION, lambda: checked(
        cfg, wb.EvalRequest(fit=fit, text=text(), eval_tokens=int(eval_tokens), eval_seq_len=int(eval_seq_len))))


def checked(cfg, request):
    """``request`` once the deployment allows it."""
    request.check(cfg)
    return request


def show_perplexity(result: wb.Evaluation) -> None:
    """Bar chart (with 95 % intervals) and table of perplexities, paired differences, fidelity to dense,
    and the protocol beside them."""
    table, p = result.table, result.protocol
    chart, side = st.columns([3, 2])
    chart.plotly_chart(_charts.perplexity_bars(table), key="ppl_chart")
    side.markdown(f"**Protocol**  \nsource: {p.get('source')} ({p.get('part')} part)  \n"
                  f"tokens scored: {p.get('scored_tokens'):,} in {p.get('n_windows')} windows of "
                  f"{p.get('seq_len')}  \nBOS: {p.get('bos')}  \ndtype: {p.get('dtype')} · device: "
                  f"{p.get('device')}")
    st.dataframe(table.interval_rows(), hide_index=True,
                 column_config={"ppl": st.column_config.NumberColumn(format="%.3f"),
                                "KL from dense": st.column_config.NumberColumn(format="%.4f"),
                                "nll": st.column_config.NumberColumn(format="%.4f")})
    st.caption(f"95 % intervals: a seeded bootstrap over the {p.get('n_windows')} evaluation windows "
               f"({INTERVALS.resamples} resamples, seed {INTERVALS.seed}). Differences are paired: every variant "
               "is scored on the same tokens and each resample draws the same windows for all, so Δ is "
               "variant − pruned (or − ghost) in perplexity; **ns**: its interval holds zero, not significant. "
               "KL from dense: mean per-token KL divergence of the next-token distribution from the dense "
               "model's (nats); top-1 agreement: share of tokens where the most likely next token is dense's.")


def show_frontier(result: wb.Evaluation) -> None:
    """Parameters added against perplexity for every fitted method: what each recovery costs in size."""
    table = result.table
    if not table.has_frontier:  # nothing fitted, or an evaluation stored without parameter counts
        return
    st.subheader("The recovery frontier")
    st.plotly_chart(_charts.frontier_scatter(table), key="frontier_chart")
    st.caption("Circles: fitted in closed form from calibration statistics; diamonds: trained by gradient "
               "steps (ReplaceMe's cosine variant, LLM-Streamline). A folded operator (Prune&Comp, "
               "ReplaceMe folded into a projection) adds no parameters; a d x d operator adds d² per gap, "
               "a rank-R one 2·d·R.")


def show_boundary(stored: wb.FittedRun) -> None:
    """Share of ‖Δ‖² removed, anti-symmetric share of M, and the spectra, from the fit's statistics."""
    frames = stored.frames
    st.subheader("How much of the discrepancy each method removes")
    left, right = st.columns([3, 2])
    left.plotly_chart(_charts.removed_bars(frames["errors"]), key="removed_chart")
    asym = frames["asymmetry"]
    right.markdown("**Anti-symmetric share of M = W − I** (full-stream operators)")
    if len(asym):
        right.dataframe(asym, hide_index=True)
    else:
        right.caption("No full-stream operator fitted.")
    right.caption("norm_ratio = ‖A‖/‖M‖ with A = (M − Mᵀ)/2; energy_ratio is its square. A diagonal or "
                  "symmetric operator has none.")
    spectra = frames["spectra"]
    gaps = list(dict.fromkeys(spectra.gap))
    chosen = st.selectbox("Gap (removed layers)", gaps) if len(gaps) > 1 else gaps[0]
    st.plotly_chart(_charts.spectra_lines(spectra, chosen), key="spectra_chart")


def show_sinks(stored: wb.FittedRun) -> None:
    """The sink report: how many tokens, where, and their share of ‖Δ‖² and of XᵀX, per gap."""
    report = stored.frames.get("sinks")
    if report is None or not len(report):
        return
    with st.expander("Attention sinks at each gap (why ghost-robust exists)"):
        st.dataframe(lessons.sink_table(report), hide_index=True)
        st.caption("Sink tokens: the first token of each window (and, if set, tokens whose norm exceeds a "
                   "multiple of the median). RMS norms are of X (entering the removed block) and Y (leaving "
                   "it). The Learn page explains what a large share does to the paper's fit.")
        positions = stored.frames.get("positions")
        if positions is not None and len(positions):
            st.plotly_chart(_charts.position_share_bars(positions, report.gap.iloc[0]), key="sink_positions")


def zeroshot_form(cfg, fit: wb.FitRequest) -> None:
    """Tasks and examples; lm-evaluation-harness task names only where hub data may be read."""
    most = DEMO_MAX_EXAMPLES if cfg.is_restricted else 500
    with st.form("zeroshot_form"):
        left, right = st.columns(2)
        bundled = left.checkbox(f"{BUNDLED_TASK} (offline: the last word of Wikipedia paragraphs)", True,
                                key="zeroshot_bundled")
        task_limit = right.number_input("Examples per task", 1, most, min(100, most), step=50, key="zeroshot_limit")
        harness = st.text_input("lm-evaluation-harness tasks (online), comma list", "", key="zeroshot_harness",
                                placeholder="arc_easy, hellaswag, piqa", disabled=not cfg.allow_hub_datasets,
                                help="Task names of lm-evaluation-harness; their data comes from the Hugging Face "
                                     "hub, so offline they are skipped with a note.")
        st.form_submit_button("Score zero-shot accuracy", key="zeroshot_run", disabled=_ui.busy(_ui.ZEROSHOT),
                              on_click=_ui.start_job, args=("zeroshot",))
    tasks = ([BUNDLED_TASK] if bundled else []) + (parse_tasks(harness) if cfg.allow_hub_datasets else [])
    _ui.queue_clicked("zeroshot", _ui.ZEROSHOT,
                      lambda: checked(cfg, wb.ZeroShotRequest(fit=fit, tasks=tuple(tasks),
                                                                  task_limit=int(task_limit))))


def show_zeroshot(scored: wb.ZeroShot) -> None:
    """Accuracy bars with error bars, the table (average over tasks when several), the protocol."""
    for note in scored.notes:
        st.info(note, icon=":material/cloud_off:")
    if scored.frame.empty:
        return
    chart, side = st.columns([3, 2])
    chart.plotly_chart(_charts.accuracy_bars(scored), key="zeroshot_chart")
    side.dataframe(scored.table(intervals=True), hide_index=True)
    side.markdown("**Protocol**  \n" + "  \n".join(
        f"{p['task']} v{p.get('version')}: {p.get('examples')} examples, {p.get('num_fewshot')}-shot, "
        f"{'/'.join(p.get('metrics') or [p.get('metric')])}, scored by {p.get('scorer')}"
        for p in scored.protocols.values()))
    if BUNDLED_TASK in scored.protocols:
        side.caption(f"{BUNDLED_TASK}: {scored.protocols[BUNDLED_TASK].get('selection')}; an answer counts "
                     "when every token of the last word is the model's top choice.")
    side.caption("95 % intervals: a seeded bootstrap over the examples for bundled-lastword; ±1.96 standard "
                 "errors for lm-evaluation-harness tasks (their reported stderr).")


def zeroshot_section(stored: wb.FittedRun) -> None:
    """The zero-shot section: form, job, results."""
    st.subheader("Zero-shot accuracy")
    st.caption("What pruning costs in answers, not only in perplexity (the paper reports both).")
    zeroshot_form(_ui.deployment(), _ui.request_of(_ui.RUN))
    if scored := _ui.answer(_ui.ZEROSHOT, "Scoring zero-shot accuracy"):
        show_zeroshot(scored)


def departure_note(name: str, departures: list | None, prompt: int) -> str:
    """A variant's name with where its continuation of prompt ``prompt`` first departs from dense's."""
    if departures is None:  # dense itself, or a result without departures
        return name
    at = departures[prompt]
    return f"{name} · same as dense" if at is None else f"{name} · departs from dense at token {at}"


def generations(stored: wb.FittedRun) -> None:
    """Sample continuations side by side."""
    st.subheader("Generations")
    cfg = _ui.deployment()
    with st.form("generate_form"):
        prompts = st.text_area("Prompts, one per line", "\n".join(_assets.prompts()), key="prompts")
        left, right = st.columns(2)
        new_tokens = left.number_input("New tokens", 1, 2048, wb.GenerationRequest().new_tokens, key="new_tokens")
        chat = right.checkbox("Use the chat template", help="for instruct models")
        st.form_submit_button("Generate", key="generate_run", disabled=_ui.busy(_ui.GENERATIONS),
                              on_click=_ui.start_job, args=("generate",))
    lines = tuple(p for p in prompts.splitlines() if p.strip())
    _ui.queue_clicked("generate", _ui.GENERATIONS, lambda: checked(cfg, wb.GenerationRequest(
        fit=_ui.request_of(_ui.RUN), prompts=lines, new_tokens=int(new_tokens), chat=bool(chat))))
    shown = _ui.answer(_ui.GENERATIONS, "Generating")
    for i, prompt in enumerate(shown.prompts if shown else []):
        st.markdown(f"**{prompt}**")
        for col, (name, texts) in zip(st.columns(len(shown.outputs)), shown.outputs.items()):
            col.caption(departure_note(name, shown.departures.get(name), i))
            col.write(texts[i] or "(nothing)")
    if shown and shown.departures:
        st.caption("Greedy decoding. Under each variant's name: the token (counted from 0 in dense's "
                   "continuation) where its text first departs from the dense model's.")


def link_section() -> None:
    """The URL that reopens this experiment, with a copy button (a teacher sends it to the class)."""
    url = _ui.experiment_link()
    if url is None:
        st.caption("A run on an uploaded text has no link: the text stays in this session.")
        return
    with st.expander("Copy link to this experiment", icon=":material/link:"):
        st.code(url, language=None, wrap_lines=True)
        st.caption("The copy button is at the right of the box. Whoever opens the link gets this model, "
                   "these layers, methods and settings, and the results at once once they are computed.")


def evaluation_section(stored: wb.FittedRun) -> None:
    """The perplexity form, its job, and the tables and charts of its result."""
    eval_form(_ui.deployment(), _ui.request_of(_ui.RUN))
    if evaluated := _ui.answer(_ui.EVALUATION, "Scoring every variant"):
        show_perplexity(evaluated)
        st.subheader("Size and speed")
        st.dataframe(evaluated.table.size_rows(), hide_index=True)
        st.caption(f"Latency: the faster of 2 forward passes (after a warm-up) over {LATENCY_TOKENS} tokens, "
                   "on this machine now.")
        show_frontier(evaluated)


_ui.require_frame(__file__)
st.title("Compare")
lm = _ui.require_model()
stored = _ui.require_run("Nothing to compare yet")
st.caption(f"Layers {', '.join(map(str, stored.layers))} dropped; variants: dense, "
           f"{', '.join(_ui.label(m) for m in stored.methods)}.")
link_section()
evaluation_section(stored)
zeroshot_section(stored)
show_boundary(stored)
show_sinks(stored)
generations(stored)
_fidelity.token_section("compare")
_fidelity.lens_section("compare")

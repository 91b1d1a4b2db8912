"""What the cut did, on the Compare and Learn pages: each token's loss change, and the logit lens.

Two sections drawn for the current run, each a form whose request goes through the job queue and the
shared store like every other measurement (``ghosted.service.probes``):

  * the token view: the text once per variant, each token coloured by how much the variant's loss on it
    moved from the dense model's (red: higher, green: lower), with the tokens the cut hurt most and those
    a recovery repaired most;
  * the lens view: a grid, one row per layer boundary and one column per variant, of the next token read
    from the residual stream there (final norm and head applied), the removed layers marked.

Tokens are untrusted text (the user's own, or whatever the tokenizer makes of it): every character that is
not a letter, a digit or a space is written as an HTML character reference before it reaches the page, so
no token can open a tag, an attribute, Markdown or a formula.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from ghosted.service.frontend import probes
from pages import _assets, _ui

TOKENS = "ghosted.token_losses"  # TokenLossRequest: each token's loss change on the current run
LENS = "ghosted.lens"  # LensRequest: the logit lens of the current run
SATURATION_NATS = 2.0  # a loss change this large (either way) gets the full colour
HURT, REPAIRED = (220, 38, 38), (22, 163, 74)  # red: loss above the dense model's; green: below it
READ = (37, 99, 235)  # lens cells: blue, deeper the surer the prediction
STYLE_ROW = "white-space:pre-wrap;line-height:1.9;font-family:monospace;font-size:0.9em"
STYLE_CELL = "padding:2px 6px;border:1px solid rgba(128,128,128,0.3);white-space:pre;font-family:monospace"
TOKEN_HELP = ("Each token of the text is scored as the next token after the ones before it. Its colour is how "
              "much the variant's loss on it (−log p, in nats) moved from the dense model's: red where the "
              f"variant is less sure of the true token, green where it is surer; full colour at ±{SATURATION_NATS:g} "
              "nats. Hover over a token to read its numbers.")
LENS_HELP = ("Every layer adds its update to the residual stream. Applying the model's final norm and output head "
             "to the stream *between* layers, as the model does after its last one, shows what it would predict "
             "if it stopped there: early rows are guesses, the last row is the model's own answer. The pruned "
             "model has no stream entering the removed layers (✂): the stream before them goes straight to "
             "the layers after. A good recovery hands those later layers a stream they can read, so its rows "
             "after the gap look like the dense model's again. **Bold**: the dense model's final answer.")


def escape(token: str) -> str:
    """``token`` as HTML that shows it literally: letters, digits and spaces kept, a newline shown as ↵,
    every other character as a numeric character reference (no tag, attribute, Markdown or formula)."""
    visible = str(token).replace("\r", "").replace("\n", "↵")
    return "".join(c if c.isalnum() or c == " " else f"&#{ord(c)};" for c in visible)


def colour(delta: float) -> str:
    """The background of a token whose loss moved by ``delta`` nats: red up, green down, clear at 0."""
    if not math.isfinite(delta):
        return "rgba(128,128,128,0.35)"
    r, g, b = HURT if delta > 0 else REPAIRED
    return f"rgba({r},{g},{b},{min(abs(delta) / SATURATION_NATS, 1.0) * 0.85:.3f})"


def token_span(row, variant: str, reference: str) -> str:
    """One token of a row of the token frame, coloured by ``variant``'s loss change, its numbers on hover."""
    delta = row[f"{variant} Δ"]
    numbers = f"Δ {delta:+.2f} nats ({reference} {row[reference]:.2f}, {variant} {row[variant]:.2f})"
    return f'<span style="background-color:{colour(delta)}" title="{escape(numbers)}">{escape(row["token"])}</span>'


def token_html(frame: pd.DataFrame, variant: str, reference: str = probes.REFERENCE) -> str:
    """One line of HTML: every token of ``frame`` coloured by ``variant``'s loss change against ``reference``."""
    spans = "".join(token_span(row, variant, reference) for _, row in frame.iterrows())
    return f'<div style="{STYLE_ROW}">{spans}</div>'


def _forget_stale(name: str) -> None:
    """Drop this session's request under ``name`` when it was made on an earlier run."""
    request = st.session_state.get(name)
    if request is not None and request.fit != st.session_state.get(_ui.RUN):
        st.session_state.pop(name)


def _checked(request):
    """``request`` once the deployment allows it."""
    request.check(_ui.deployment())
    return request


def _form(where: str, what: str, label: str, text_widget, default_tokens: int, button: str, key: str, build):
    """A form with a text, a token count and a button; a click queues ``build(text, tokens)`` under ``key``."""
    cap = _ui.deployment().max_probe_tokens
    name = f"{where}_{what}"
    with st.form(f"{name}_form"):
        text = text_widget(label, key=f"{name}_text")
        tokens = st.number_input("Tokens read (the first ones)", 2, cap or 4096, min(default_tokens, cap or 4096),
                                 key=f"{name}_max")
        if cap:
            st.caption(f"This deployment reads at most {cap:,} tokens of a text.")
        st.form_submit_button(button, key=f"{name}_run", disabled=_ui.busy(key), on_click=_ui.start_job,
                              args=(name,))
    _ui.queue_clicked(name, key, lambda: _checked(build(text, int(tokens))))
    _forget_stale(key)


def token_section(where: str) -> None:
    """The token view's form for the current run, and its result once computed."""
    st.subheader("What the cut did to each token")
    fit = _ui.request_of(_ui.RUN)
    default = probes.TokenLossRequest()
    _form(where, "tokens", "Text to read", lambda label, key: st.text_area(label, probes.default_passage(), key=key),
          default.max_tokens, "Score each token", TOKENS,
          lambda text, tokens: probes.TokenLossRequest(fit=fit, passage=text, max_tokens=tokens))
    if view := _ui.answer(TOKENS, "Scoring each token"):
        show_tokens(view, where)


def show_tokens(view: probes.TokenView, where: str) -> None:
    """The text once per variant, coloured; the tokens the cut hurt most and those a recovery repaired."""
    st.caption(TOKEN_HELP)
    frame = view.frame
    for variant in view.variants:
        change = view.mean_change(variant)
        st.markdown(f"**{variant}** · mean change {change:+.3f} nats over {len(frame)} tokens")
        st.markdown(token_html(frame, variant, view.losses.reference), unsafe_allow_html=True)
    left, right = st.columns(2)
    left.markdown(f"**Hurt most by the cut** ({view.cut} against {view.losses.reference})")
    left.dataframe(view.hurt(), hide_index=True)
    if not view.recovered:
        right.caption("No recovered model in this run: fit one on the Calibrate & recover page.")
        return
    chosen = right.selectbox("Repaired most by", view.recovered, key=f"{where}_repaired_by")
    right.dataframe(view.repaired(chosen), hide_index=True)
    right.caption(f"repaired = the {view.cut} model's loss minus {chosen}'s, in nats.")


def lens_section(where: str) -> None:
    """The lens view's form for the current run, and its result once computed."""
    st.subheader("The logit lens: what the stream says at every layer")
    fit = _ui.request_of(_ui.RUN)
    default = probes.LensRequest()
    _form(where, "lens", "Prompt", lambda label, key: st.text_input(label, _assets.prompts()[0], key=key),
          default.max_tokens, "Read every layer", LENS,
          lambda text, tokens: probes.LensRequest(fit=fit, prompt=text, max_tokens=tokens))
    if view := _ui.answer(LENS, "Reading every layer"):
        show_lens(view)


def boundary_name(boundary: int, view: probes.LensView) -> str:
    """How a row of the lens is named: the embeddings, the stream into a layer, or the output."""
    if boundary == 0:
        return "0 · embeddings"
    if boundary == view.depth:
        return f"{boundary} · output (the answer)"
    if boundary in view.removed:
        return f"✂ {boundary} · into removed layer {boundary}"
    return f"{boundary} · into layer {boundary}"


def lens_cell(token, p, answer) -> str:
    """One cell of the lens: the token read (bold when it is the dense model's final answer) and its
    probability, on a blue as deep as that probability; an em dash where the variant has no such stream."""
    if not isinstance(token, str) or p is None or not math.isfinite(p):
        return f'<td style="{STYLE_CELL};color:gray">—</td>'
    shown = f"<b>{escape(token)}</b>" if token == answer else escape(token)
    r, g, b = READ
    return f'<td style="{STYLE_CELL};background-color:rgba({r},{g},{b},{0.6 * p:.3f})">{shown} {p:.2f}</td>'


def lens_html(view: probes.LensView) -> str:
    """The lens as an HTML table: one row per boundary, one column per variant, the cut's rows shaded."""
    frame, answer = view.frame.set_index("boundary"), view.answer
    head = "".join(f'<th style="{STYLE_CELL}">{escape(v)}</th>' for v in ("boundary", *view.variants))
    rows = []
    for boundary, row in frame.iterrows():
        shade = "background-color:rgba(128,128,128,0.18)" if boundary in view.removed else ""
        cells = "".join(lens_cell(row.get(v), row.get(f"{v} p"), answer) for v in view.variants)
        rows.append(f'<tr style="{shade}"><td style="{STYLE_CELL}">{escape(boundary_name(boundary, view))}</td>'
                    f"{cells}</tr>")
    return f'<table style="border-collapse:collapse"><tr>{head}</tr>{"".join(rows)}</table>'


def show_lens(view: probes.LensView) -> None:
    """The lens grid, the prompt's tokens and the explanation."""
    tokens = "".join(f'<span style="border:1px solid rgba(128,128,128,0.5);margin-right:2px">{escape(t)}</span>'
                     for t in view.tokens)
    st.markdown(f'<div style="{STYLE_ROW}">Prompt tokens: {tokens} → ?</div>', unsafe_allow_html=True)
    st.markdown(lens_html(view), unsafe_allow_html=True)
    st.caption(LENS_HELP)

"""A link's settings in the forms: what an opened link asked for shows in the widgets of its pages.

``ghosted.service.links`` turns a URL into a run and its evaluation; this module puts the same
values into the widgets that ask for them (the Calibrate & recover form, the Compare page's evaluation
form), so that a student who opens a teacher's link sees the teacher's settings, can change one and run
again. Streamlit drops a widget's state when its page is not drawn, so the values wait under ``FORM``
until the page that owns them draws its form (``place``), and are put in place once.
"""

from __future__ import annotations

import streamlit as st

FORM = "ghosted.form"  # dict: widget key -> the value a link asked for, not yet shown in its widget
RUN_SETTINGS = ("calib_seqs", "seq_len", "heldout_seqs", "seed", "methods", "ghost_mode", "batch_size", "granularity")
EVAL_SETTINGS = ("eval_tokens", "eval_seq_len")  # each widget keyed by its setting's name (the spec's, the link's)
CALIBRATION_KEYS = ("calib_kind", "calib_path", "calib_dataset", *RUN_SETTINGS)
EVALUATION_KEYS = ("eval_kind", "eval_path", "eval_dataset", *EVAL_SETTINGS)


def text_values(prefix: str, text: str) -> dict:
    """The text widgets (``pages/_text.py``) that name ``text``: a bundled text, a local file or a dataset."""
    if text.startswith("bundled:"):
        return {f"{prefix}_kind": text}
    kind = "path" if ("/" in text or "." in text) and not text.startswith("hf:") else "dataset"
    return {f"{prefix}_kind": kind, f"{prefix}_{kind}": text}


def values_of(link) -> dict:
    """Widget key -> value for every setting ``link`` names (a ``links.Link``)."""
    fit = link.fit
    values = {**text_values("calib", fit.text), **{name: getattr(fit, name) for name in RUN_SETTINGS}}
    values["methods"] = list(fit.methods)  # a multiselect's value is a list
    if link.evaluation is not None:
        ev = link.evaluation
        values.update({**text_values("eval", ev.text), **{name: getattr(ev, name) for name in EVAL_SETTINGS}})
    return values


def remember(link) -> None:
    """Keep ``link``'s settings until their pages draw (called once, when the link is opened)."""
    st.session_state[FORM] = values_of(link)


def place(keys: tuple[str, ...]) -> None:
    """Before a page draws its form: give the widgets of ``keys`` the values a link asked for (once)."""
    pending = st.session_state.get(FORM) or {}
    for key in keys:
        if key in pending:
            st.session_state[key] = pending.pop(key)

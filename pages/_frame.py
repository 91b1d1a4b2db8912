"""The frame every page runs in: app.py's navigation and sidebar, also for a page opened by its own URL."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

FRAMED = "ghosted.framed"  # set by app.py while it runs a page
DEEP_LINK = "ghosted.deep_link"  # page asked for before app.py had ever run on this server


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

"""How a page says what happens: user mistakes shown as errors (never a traceback), and the words for
a queued or running job's state.
"""

from __future__ import annotations

from contextlib import contextmanager

import streamlit as st

from ghosted.experiments.frontend import JobStatus, ModelLoadError, SourceUnavailableError

# What a user can cause (a wrong value or kind of value, a missing or unreadable file, a model or text that
# cannot be loaded): shown with st.error and its message, never as a traceback (st.exception).
USER_ERRORS = (ValueError, TypeError, OSError, ModelLoadError, SourceUnavailableError)


@contextmanager
def user_errors(prefix: str = ""):
    """Show a user mistake (bad path, impossible choice, offline source) as an error, no traceback."""
    try:
        yield
    except USER_ERRORS as err:
        st.error(f"{prefix}{err}", icon=":material/error:")


def wait_text(status: JobStatus) -> str:
    """E.g. "place 3 in the queue, about 40 s" or "running: calibration 4/8, about 12 s left"."""
    about = "" if status.wait_s is None else f", about {status.wait_s:.0f} s"
    others = status.shared_with
    shared = f" (shared with {others} other session{'s' if others > 1 else ''})" if others else ""
    if status.state == "queued":
        return f"waiting: place {status.position} in the queue{about}{shared}"
    stage = (f": {status.stage}" + (f" {status.done}/{status.total}" if status.total else "")) if status.stage else ""
    left = "" if status.wait_s is None else f", about {status.wait_s:.0f} s left"
    return f"running{stage}{left}{shared}"

"""How a page says what happens: user mistakes shown as errors (never a traceback), the words for a queued
or running job's state, and the operator's record of what each session was told (the page log).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import streamlit as st

from ghosted.service.frontend import JobStatus, ModelLoadError, SourceUnavailableError, eventlog

ANSWERED = "ghosted.answered"  # request keys this session was answered for (logged once each)

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


def page_run(title: str):
    """Time one page run for the operator's page log (``$GHOSTED_PAGE_LOG``; nothing without it): how long
    the server took to draw the page, read by ``bench/load.py`` while others' jobs run."""
    return eventlog.timed(eventlog.log_path("GHOSTED_PAGE_LOG"), page=title)


def log_event(event: str, **fields) -> None:
    """One line of the operator's page log (``$GHOSTED_PAGE_LOG``; nothing without it): a session asked for
    a job ("asked"), its queue panel told it its place and wait ("panel"), its answer came ("answered").
    ``bench/load.py`` reads them to count who waited without being told."""
    path = eventlog.log_path("GHOSTED_PAGE_LOG")
    if path:
        eventlog.append(path, {"event": event, "time": round(time.time(), 3), **fields})


def log_panel(status: JobStatus, owner: str) -> None:
    """What one refresh of a session's queue panel showed it."""
    log_event("panel", key=status.key, kind=status.kind, owner=owner, state=status.state, position=status.position,
              wait_s=None if status.wait_s is None else round(status.wait_s, 1))


def log_answered(key: str, owner: str) -> None:
    """The first time this session is shown the result of ``key``."""
    answered = st.session_state.setdefault(ANSWERED, set())
    if key not in answered:
        answered.add(key)
        log_event("answered", key=key, owner=owner)

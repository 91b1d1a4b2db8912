"""Operators' logs: one JSON line per event, appended to a file an environment variable names.

A server's operator (or ``bench/load.py``) sets ``GHOSTED_JOB_LOG`` to record every ended job and
``GHOSTED_PAGE_LOG`` to record every page run with how long the server took to draw it; without them nothing
is written. A log that cannot be written warns once and the server goes on.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


def log_path(variable: str) -> str | None:
    """The file ``$variable`` names, or None when it is unset or blank."""
    return os.environ.get(variable, "").strip() or None


def append(path: str, record: dict) -> bool:
    """Append ``record`` as one JSON line to ``path``; False (with a warning) when it cannot be written."""
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
    except OSError as err:
        warnings.warn(f"Could not write the log {path} ({err}).", RuntimeWarning, stacklevel=2)
        return False
    return True


@contextmanager
def timed(path: str | None, **fields) -> Iterator[None]:
    """Log ``fields`` with the wall-clock start and the seconds the block took, however it ends (a page run
    that a newer click stops is logged too, as the time the server spent on it)."""
    started, clock = time.time(), time.perf_counter()
    try:
        yield
    finally:
        if path:
            append(path, {**fields, "started": round(started, 3), "seconds": round(time.perf_counter() - clock, 4)})

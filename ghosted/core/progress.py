"""One progress protocol for the whole library: ``progress(stage, done, total)``.

Every library function that reports progress takes ``progress: Progress | None = None``; ``None``
is silent. The library never draws anything itself: the front ends do, the command line with
``TqdmProgress`` (one bar per stage, on stderr), the app with Streamlit's progress bar
(``pages/_ui.py``). Nothing in ``ghosted`` but this module imports tqdm.

The calls an implementation receives:

  * ``progress(stage, done, total)`` with ``total > 0``: ``done`` of ``total`` steps of ``stage``, a
    short label ("calibration", "held-out statistics", "perplexity x3 (shared 20 layers)"). A stage
    may start with ``done == 0``; ``done`` never decreases within it and its last call has
    ``done == total``. A call with another label starts another stage: the previous one is over
    (a stage of the same label that starts again from a lower ``done`` is a new stage too).
  * ``progress(text, 0, 0)``: a message, one line and no bar (``message(progress, text)``), for the
    few places that only say what they are doing, e.g. the grid's "shortgpt n=7: layers 20-26".

Library code reports through ``for_stage`` (the ``(done, total)`` callback of one loop, a no-op for
``None``), ``counted`` (an iterable that reports each item as it finishes, like ``tqdm(items)``),
``message`` and ``lines`` (a one-argument ``say`` function that sends messages).

Example:
    >>> with TqdmProgress() as progress:          # every bar is closed on leaving, even on an error
    ...     run = ghosted.fit(lm, "20-26", calib, progress=progress)
    >>> ghosted.fit(lm, "20-26", calib, progress=lambda stage, done, total: print(stage, done, total))
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
Say = Callable[[str], None]  # one line to the user, e.g. ``lines(progress)``


class Progress(Protocol):
    """Receives ``(stage, done, total)``; ``total == 0`` is a message (see the module docstring)."""

    def __call__(self, stage: str, done: int, total: int) -> None: ...


def silent(stage: str, done: int, total: int) -> None:
    """The progress that shows nothing (what ``None`` means)."""


def for_stage(progress: Progress | None, stage: str) -> Callable[[int, int], None]:
    """The ``(done, total)`` callback of one stage; does nothing for ``None`` or a stage of no steps
    (``total <= 0``), so a loop over nothing is never mistaken for a message."""
    if progress is None:
        return lambda done, total: None

    def step(done: int, total: int) -> None:
        if total > 0:
            progress(stage, done, total)

    return step


def counted(items: Sequence[T], progress: Progress | None, stage: str) -> Iterator[T]:
    """``items`` one by one; reports ``(stage, 0, n)`` first and ``(stage, k, n)`` once item k is done."""
    step, total = for_stage(progress, stage), len(items)
    step(0, total)
    for done, item in enumerate(items, start=1):
        yield item
        step(done, total)


def message(progress: Progress | None, text: str) -> None:
    """Send one line (no bar) to ``progress``; nothing for ``None``."""
    if progress is not None:
        progress(text, 0, 0)


def lines(progress: Progress | None) -> Say:
    """A ``say(line)`` function that sends each line to ``progress`` as a message."""
    return lambda text: message(progress, text)


class TqdmProgress:
    """``Progress`` as tqdm bars on stderr: one bar per stage, closed when the stage reaches its
    total, when another stage starts, and by ``close()`` / leaving the ``with`` block (even on an
    error). Messages are written above the bars.

    Example:
        >>> with TqdmProgress() as progress:
        ...     perplexity(model, windows, progress=progress)
    """

    def __init__(self, file=None, disable: bool = False, leave: bool = False):
        self.file = file  # None: sys.stderr at the time of each call (so redirections apply)
        self.disable = disable  # True: no bars and no messages (the command line's --quiet)
        self.leave = leave  # keep finished bars on screen
        self.stage: str | None = None
        self.bar = None  # the open bar of ``stage``, if any
        self.opened: list = []  # every bar ever opened (for tests and ``close``)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.disable:
            return
        if total <= 0:
            tqdm.write(stage, file=self._file())
            return
        if self.bar is None or stage != self.stage or done < self.bar.n or total != self.bar.total:
            self._open(stage, total)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self._close_bar()

    def _file(self):
        return self.file if self.file is not None else sys.stderr

    def _open(self, stage: str, total: int) -> None:
        self._close_bar()
        self.stage = stage
        self.bar = tqdm(total=total, desc=stage, file=self._file(), leave=self.leave, dynamic_ncols=True)
        self.opened.append(self.bar)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = None

    def close(self) -> None:
        """Close every bar this object opened (safe to call twice)."""
        self.bar = None
        for bar in self.opened:
            bar.close()

    def __enter__(self) -> TqdmProgress:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

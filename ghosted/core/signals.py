"""Every ending of a run is handled like Ctrl-C: SIGTERM and SIGHUP become an exception.

``timeout``, Slurm, ``docker stop``, a Space restart and a closed terminal end a process with SIGTERM
or SIGHUP, whose default action kills it on the spot: no partial report, no journal line, no
message. Inside ``signals_as_interrupts()`` they raise ``Stopped`` instead, a ``KeyboardInterrupt``
that carries the signal, so every ``except KeyboardInterrupt`` that keeps finished work (``run``'s
partial report, ``grid``'s journal, ``export``'s staged folder) keeps it for them too, and the
process exits with the signal's code (``128 + signal``, like a shell).

Used by the command line (``ghosted.cli.main``, around every subcommand) and by any long-lived job
runner that wants the same behaviour (the app's job queue).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

HANDLED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))  # POSIX only
CTRL_C_EXIT = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal (SIGTERM, SIGHUP): handled exactly like Ctrl-C, with its number."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"stopped by {signal_name(self.signum)}")


def signal_name(signum: int) -> str:
    """``15`` -> ``"SIGTERM"`` (the number itself for a signal Python does not name)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(err: BaseException) -> int:
    """The exit code of a stopped process: ``128 + signal`` for ``Stopped``, 130 for a plain Ctrl-C."""
    return 128 + err.signum if isinstance(err, Stopped) else CTRL_C_EXIT


def describe_stop(err: BaseException) -> str:
    """How a run ended, for reports: ``"interrupted (Ctrl-C)"`` or ``"stopped by SIGTERM"``."""
    return str(err) if isinstance(err, Stopped) else "interrupted (Ctrl-C)"


@contextmanager
def signals_as_interrupts(signums: tuple[int, ...] = HANDLED):
    """Within the block, each of ``signums`` raises ``Stopped`` in the main thread.

    Only the first signal raises: later ones (``docker stop`` and process supervisors often repeat
    it) are ignored while the finished work is being written. The previous handlers are restored
    when the block ends. Outside the main thread (where Python cannot install handlers) the block
    runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def stop(signum, _frame):
        if raised:
            return
        raised.append(signum)
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

"""Long-lived objects out of the garbage collector's sight, so that a shared server stays quick.

A loaded model with its libraries (torch, transformers, pandas, plotly, streamlit) is about half a
million Python objects that live as long as the process. A full collection walks all of them: about
0.3 s on one core, holding the interpreter lock the whole time. A server that collects often (Streamlit
collects after every script run, and a class of thirty reruns pages every second while it waits) then
spends the lock on collections, and the threads computing fits, which take the lock back after every
tensor operation, wait at each one: a fit that takes 30 s alone took 25 minutes with ten waiting pages.

``freeze_long_lived`` moves every object alive now into the collector's permanent generation (``gc.freeze``),
after loading a model: later collections only look at what was made since, and cost microseconds.
Objects are still freed as soon as nothing refers to them; only reference cycles among frozen objects
wait until ``thaw`` (called when a model is released, before its memory is collected).
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> int:
    """Collect once, then freeze everything alive (a loaded model and its libraries); returns the number
    of objects frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw() -> None:
    """Give the frozen objects back to the collector (a model is being released)."""
    gc.unfreeze()

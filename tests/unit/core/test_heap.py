"""Long-lived objects frozen out of the collector's sight (ghosted.core.heap), and the server set so."""

import gc
import tomllib
from pathlib import Path

from ghosted.core import heap

ROOT = Path(__file__).resolve().parents[3]


def test_freeze_hides_what_is_alive_and_thaw_gives_it_back():
    kept = [[i] for i in range(1000)]  # long-lived objects, as a loaded model's modules
    try:
        frozen = heap.freeze_long_lived()
        # other threads (an earlier test's job workers) may free a few frozen objects meanwhile, never add any
        assert frozen >= len(kept) and len(kept) <= gc.get_freeze_count() <= frozen
    finally:
        heap.thaw()
    assert gc.get_freeze_count() == 0


def test_frozen_objects_are_still_freed_when_nothing_refers_to_them():
    import weakref

    class Held:
        pass

    held = Held()
    ref = weakref.ref(held)
    try:
        heap.freeze_long_lived()
        del held
        assert ref() is None  # reference counting frees it; only cycles wait for thaw
    finally:
        heap.thaw()


def test_the_server_does_not_collect_after_every_page_run():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False

"""The fast tier's guard (tests/conftest.py): a unit test not marked slow cannot load the bundled model,
neither in its own process nor in a Python process it starts (tests/guard/sitecustomize.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LOAD = "from ghosted.models.loading import load_model; load_model({source}); print('loaded')"


def bundled_gguf() -> str:
    from ghosted.models.assets import bundled_gguf_path

    try:
        return str(bundled_gguf_path())
    except FileNotFoundError:
        pytest.skip("the bundled model is not installed")


@pytest.mark.parametrize("by_path", [False, True], ids=["by name", "by its GGUF file"])
def test_loading_the_bundled_model_fails_a_fast_test(by_path):
    from ghosted.models.loading import load_model

    source = [bundled_gguf()] if by_path else []
    with pytest.raises(pytest.fail.Exception, match="bundled model"):
        load_model(*source)


def test_a_process_the_test_starts_cannot_load_it_either():
    """One process (each costs an interpreter with torch), by name: the path takes the same patch."""
    proc = subprocess.run([sys.executable, "-c", LOAD.format(source="")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 86 and "loaded" not in proc.stdout
    assert "fast-tier guard" in proc.stderr and "marked slow" in proc.stderr


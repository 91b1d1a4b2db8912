"""ruff is clean on the code base (the rules are in pyproject.toml's [tool.ruff])."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PATHS = ["ghosted", "pages", "app.py", "bench", "tests"]


def ruff_command() -> list[str]:
    """ruff from this interpreter's environment, else from PATH; skip if neither has it."""
    try:
        import ruff  # noqa: F401

        return [sys.executable, "-m", "ruff"]
    except ImportError:
        found = shutil.which("ruff")
        if found is None:
            pytest.skip("ruff is not installed (pip install -r requirements.txt installs it)")
        return [found]


def test_ruff_is_clean():
    out = subprocess.run([*ruff_command(), "check", "--no-cache", "--output-format", "concise", *PATHS],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"ruff found problems (ruff check --fix fixes some):\n{out.stdout}{out.stderr}"

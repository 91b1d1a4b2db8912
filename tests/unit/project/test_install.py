"""The install script installs the checkout itself: ``import ghosted`` and the ``ghosted`` command work
from any folder, and they are a checkout's code (an editable install), not a copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = Path(sys.executable).parent  # the environment's scripts folder (.venv/bin)


def test_install_script_installs_the_checkout_editable():
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "install --no-deps -e ." in script
    assert 'build-backend = "setuptools.build_meta"' in (ROOT / "pyproject.toml").read_text()


def test_ghosted_imports_from_any_folder_from_a_checkout(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import ghosted.core.version as v; print(v.__file__)"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"ghosted is not installed in this environment (bash scripts/install.sh): {out.stderr}"
    checkout = Path(out.stdout.strip()).resolve().parents[2]  # ghosted/core/version.py -> the checkout
    assert "site-packages" not in checkout.parts, f"a copy, not the checkout (editable): {out.stdout}"
    assert 'name = "ghosted"' in (checkout / "pyproject.toml").read_text()


def test_the_console_script_runs(tmp_path):
    command = SCRIPTS / "ghosted"
    assert command.exists(), "no `ghosted` command in this environment (bash scripts/install.sh installs it)"
    out = subprocess.run([str(command), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "prune layers, recover them" in out.stdout

"""The version is declared twice (pyproject.toml for the installer, ghosted.core.version for the code): one value.

That no module reads it from the top package is test_layout's rule (a): an import of ``ghosted`` is a higher layer."""

import tomllib
from pathlib import Path

import ghosted
from ghosted.core.version import __version__

ROOT = Path(__file__).resolve().parents[3]


def test_the_code_and_the_package_metadata_give_one_version():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert __version__ == declared == ghosted.__version__


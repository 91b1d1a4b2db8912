"""The version is declared twice (pyproject.toml for the installer, ghosted.core.version for the code): one value."""

import tomllib
from pathlib import Path

import ghosted
from ghosted.core.version import __version__

ROOT = Path(__file__).resolve().parents[3]


def test_the_code_and_the_package_metadata_give_one_version():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert __version__ == declared == ghosted.__version__


def test_no_module_reads_the_version_from_the_top_package():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "ghosted").rglob("*.py")
                 if p.name != "__init__.py" or p.parent.name != "ghosted"
                 if "from ghosted import __version__" in p.read_text(encoding="utf-8")]
    assert offenders == []

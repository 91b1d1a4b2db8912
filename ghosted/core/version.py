"""Ghosted's version, in the lowest package so that every layer can read it without importing upward."""

__version__ = "0.1.0"  # the same as pyproject.toml's [project] version (tests/unit/project checks it)

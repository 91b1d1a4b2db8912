"""What the checks need to know about a model, read from the loaded model or from its config alone.

``ModelFacts`` holds the layer count, the positions and the width; ``facts_of_model`` reads them from a
loaded model, ``model_facts`` from a model source without loading weights or running its code (what
``--dry-run`` and the checks before loading use).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from pathlib import Path


def is_whole_number(value) -> bool:
    """True for ints (numpy ints too), never for bools (True would silently mean 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass
class ModelFacts:
    """What the checks need from a model: its layer count and positions (None: not known)."""

    layers: int | None
    max_positions: int | None
    hidden_size: int | None = None
    note: str = ""  # why a fact is missing (e.g. a hub config offline)


def facts_of_config(config) -> ModelFacts:
    """Layer count, positions and width from a transformers config (the text config of a VLM)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    width = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
    return ModelFacts(layers, positions, width)


def facts_of_model(model) -> ModelFacts:
    """Facts of a loaded model: its real layer count (a pruned model's too) and its config's positions."""
    from ghosted.models.architecture import num_layers

    facts = facts_of_config(model.config)
    facts.layers = num_layers(model)
    return facts


def model_facts(source: str) -> ModelFacts:
    """Facts from the model's config only, no weights and no code: the bundled or a .gguf model's metadata
    (or its converted copy), a folder's config.json, or a hub config (unknown facts when it cannot be
    read). A config that needs the model's own code is read as plain JSON: ``--dry-run`` never runs it."""
    from transformers import AutoConfig

    from ghosted.core.untrusted import check_gguf_header
    from ghosted.models.assets import bundled_gguf_path, cache_dir, file_sha256
    from ghosted.models.loading import source_kind

    kind = source_kind(source)
    try:
        if kind in ("bundled", "gguf"):
            gguf = bundled_gguf_path() if kind == "bundled" else Path(source).expanduser()
            if gguf.is_dir():
                gguf = sorted(gguf.glob("*.gguf"))[0]
            converted = cache_dir() / "models" / file_sha256(gguf)[:16]
            if (converted / "config.json").exists():
                return facts_of_config(AutoConfig.from_pretrained(converted))
            check_gguf_header(gguf)  # a crafted or truncated file: one clear error, nothing allocated
            return facts_of_config(AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name))
        return facts_of_config(AutoConfig.from_pretrained(os.path.expanduser(source), trust_remote_code=False))
    except (OSError, ValueError, KeyError) as err:
        if kind == "folder":
            return _facts_of_raw_config(Path(source).expanduser(), err)
        if kind != "hub":
            raise ValueError(f"Could not read the model config of {source}: {err}") from err
        return ModelFacts(None, None, note=f"config of {source} not readable here ({type(err).__name__}): "
                                           "layers and positions are checked after loading")


def _facts_of_raw_config(folder: Path, err: Exception) -> ModelFacts:
    """Facts read from a folder's config.json as plain JSON (a config class shipped as code is never run)."""
    from types import SimpleNamespace

    from ghosted.core.untrusted import read_json_file

    raw = read_json_file(folder / "config.json", "model config")
    if not isinstance(raw, dict):
        raise ValueError(f"Could not read the model config of {folder}: {err}") from err
    raw = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    facts = facts_of_config(SimpleNamespace(**{k: v for k, v in raw.items() if isinstance(k, str)}))
    if not all(v is None or is_whole_number(v) for v in (facts.layers, facts.max_positions, facts.hidden_size)):
        raise ValueError(f"Could not read the model config of {folder}: its sizes are not whole numbers.")
    return facts

"""Where a recovered model may not be saved: the target folder's checks and the folders it must never be.

A non-empty target needs ``overwrite`` (and then must hold a saved model), and the caches and the
folder a model was loaded from are refused even with ``overwrite``. ``ghosted.operators.checkpoint``
calls ``check_target_folder`` before writing anything.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ghosted.models.assets import BUNDLED_MODEL, bundled_gguf_path, cache_dir, check_can_create


def check_target_folder(path: str | Path, overwrite: bool = False,
                        protected: list[tuple[Path, str]] = ()) -> Path:
    """``path`` as a Path if a model may be saved there; a ValueError saying why not otherwise.

    Refused: a file; a non-empty folder unless ``overwrite`` (and even then one that holds no
    ``config.json``: overwrite replaces a model folder, never any folder); a folder that cannot be
    created; and,
    even with ``overwrite``, any folder that is, is inside or contains one of ``protected``
    (``(folder, what it is)`` pairs, see ``protected_folders``). Paths are compared resolved.
    """
    if not str(path).strip():
        raise ValueError("No output folder given: name a folder to save the model into.")
    out = Path(path).expanduser()
    resolved = out.resolve()
    for folder, what in protected:
        guarded = Path(folder).expanduser().resolve()
        if resolved == guarded or guarded in resolved.parents:
            where = "is" if resolved == guarded else "is inside"
            raise ValueError(f"Refusing to save into {out}: it {where} {what} ({guarded}), which "
                             "would be damaged. Choose a folder outside it.")
        if resolved in guarded.parents:
            raise ValueError(f"Refusing to save into {out}: it contains {what} ({guarded}), which "
                             "replacing it would delete. Choose another folder.")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder: name a folder to save the model into.")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(f"{out} is not empty: choose a new folder, or pass --overwrite "
                             "(overwrite=True) to replace what is in it.")
        if not (out / "config.json").exists():  # overwrite replaces a model, not any folder
            raise ValueError(f"{out} is not empty and holds no saved model (no config.json): "
                             "--overwrite replaces only a model folder. Choose a new folder, or "
                             "empty this one yourself.")
    check_can_create(out)
    return out


def protected_folders(*sources) -> list[tuple[Path, str]]:
    """Folders no model may be saved into: Ghosted's and the hub's caches, and where each of
    ``sources`` (a ``LoadedModel``, a model, or a ``--model`` string) was loaded from."""
    from huggingface_hub.constants import HF_HUB_CACHE

    found = [(cache_dir(), "Ghosted's cache (it holds the converted bundled model)"),
             (Path(HF_HUB_CACHE), "the Hugging Face hub cache")]
    for source in sources:
        found += [(folder, "the folder the model was loaded from") for folder in _source_folders(source)]
    return found


def _source_folders(source) -> list[Path]:
    """Local folders a model source lives in (none for a hub id or a model built in memory)."""
    if source is None:
        return []
    if isinstance(source, nn.Module):
        return _source_folders(getattr(source.config, "_name_or_path", "") or None)
    if not isinstance(source, (str, Path)):  # a LoadedModel
        names = [source.source, source.extra.get("location"), source.model]
        return [folder for name in names for folder in _source_folders(name)]
    if str(source) in (BUNDLED_MODEL, "bundled", "default"):
        try:
            return [bundled_gguf_path().parent]
        except FileNotFoundError:
            return []
    path = Path(source).expanduser()
    if not str(source).strip() or not path.exists():
        return []
    return [path if path.is_dir() else path.parent]

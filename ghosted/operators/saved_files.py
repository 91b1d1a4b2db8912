"""Which files of a saved model folder Ghosted wrote, so that ``--overwrite`` replaces only those.

``save_recovered`` lists every file it writes in the recipe (``files``); a folder saved before
that is read by the names a save writes (``SAVED_NAMES``). Replacing a saved model keeps every
other file (a README, notes, an evaluation the user put there) in the new folder.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

from ghosted.models.loading import RECIPE_FILE

# Files a save writes, for folders saved before the recipe listed them (``files``): these are
# Ghosted's; anything else in such a folder is the user's and is kept by ``overwrite``.
SAVED_NAMES = ("config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
               "model.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json",
               "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
               "chat_template.*", "ghosted_*")


def ghosted_files(folder: Path) -> set[str]:
    """The names in a saved ``folder`` that Ghosted wrote: those its recipe lists (``files``), or,
    for an older recipe or none, those matching ``SAVED_NAMES``."""
    try:
        listed = json.loads((folder / RECIPE_FILE).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    names = [p.name for p in folder.iterdir()]
    if isinstance(listed, list):
        return {n for n in names if n in listed}
    return {n for n in names if any(fnmatch.fnmatchcase(n, pattern) for pattern in SAVED_NAMES)}


def keep_user_files(old: Path, staged: Path, ghosted: set[str]) -> list[str]:
    """Link every file of ``old`` that Ghosted did not write into ``staged`` (unless the new model
    has a file of that name): an overwrite replaces the model, never what the user put next to it.
    Hard links (copies across file systems), so ``old`` keeps them until the new folder is in place."""
    kept = []
    for path in sorted(old.iterdir()):
        if path.name in ghosted or (staged / path.name).exists():
            continue
        if path.is_symlink():
            os.symlink(os.readlink(path), staged / path.name)
        elif path.is_dir():
            shutil.copytree(path, staged / path.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(path, staged / path.name)
        kept.append(path.name)
    return kept


def _link_or_copy(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)

"""A cheap identity of the checkpoint a model was loaded from, for the statistics cache's keys.

The hub commit when the model came from the hub; the GGUF's sha256 for the bundled model or a
converted .gguf (already the name of its converted folder); otherwise, for each file of the model's
folder, its name, size, modification time, inode and change time, and for each weight file a
sha256 of its header and of samples spread over its data. A checkpoint rewritten in place with its
times kept (``cp -p``, ``rsync -a``, ``tar``) gets a new change time, which no user can set, and,
with other weights, other samples; so it never reuses the statistics of the weights it replaced.
Never a hash of every weight: about 128 KiB is read per weight file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from torch import nn

from ghosted.models.architecture import has_operators
from ghosted.models.assets import cache_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")  # sampled files
SAMPLE_BYTES = 4096  # bytes read at each sample of a weight file's data
SAMPLES = 16  # samples per weight file (plus its first 64 KiB, the header)
HEADER_BYTES = 65536  # a safetensors header (names, shapes, offsets) fits in this for most checkpoints


def model_identity(model: nn.Module) -> dict | None:
    """A cheap identity of the checkpoint ``model`` was loaded from, or None if it has none.

    None for models built in memory (no folder, no hub commit) and for ghosted's own variants
    (pruned views and recovered models carry ``ghosted_layers``): a folded ReplaceMe map changes
    a weight in place without a trace that could be checked without hashing the weights.
    """
    if hasattr(model, "ghosted_layers") or has_operators(model):
        return None
    config = getattr(model, "config", None)
    name = str(getattr(config, "_name_or_path", "") or "")
    if not name:
        return None
    path = Path(name)
    if path.is_dir():
        converted = cache_dir() / "models"
        if path.resolve().parent == converted.resolve():  # a converted GGUF: named by its sha256
            return {"gguf_sha256": path.name}
        return {"folder": str(path.resolve()), "files": folder_fingerprint(path)}
    commit = getattr(config, "_commit_hash", None)
    return {"hub": name, "revision": commit} if commit else None


def folder_fingerprint(folder: Path) -> list[list]:
    """[name, size, mtime_ns, inode, ctime_ns, sample sha256] of every file in ``folder`` (recursively),
    sorted by name; the sample hash (``content_sample``) only for weight files, "" for the others.

    The change time and inode cannot be kept by a copy (``cp -p``, ``rsync -a`` keep only the
    modification time), and the samples catch other weights even where they could.
    """
    rows = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = file.stat()
        sample = content_sample(file, stat.st_size) if file.name.endswith(WEIGHT_SUFFIXES) else ""
        rows.append([str(file.relative_to(folder)), stat.st_size, stat.st_mtime_ns, stat.st_ino,
                     stat.st_ctime_ns, sample])
    return rows


def content_sample(file: Path, size: int) -> str:
    """sha256 of a file's first ``HEADER_BYTES`` and of ``SAMPLES`` blocks spread over the rest:
    about 128 KiB read whatever the file's size."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        digest.update(handle.read(HEADER_BYTES))
        for i in range(SAMPLES):
            handle.seek(HEADER_BYTES + (max(size - HEADER_BYTES, 0) * i) // SAMPLES)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def describe_identity(identity: dict) -> str:
    """One short line for a model identity (the cache listing)."""
    if "gguf_sha256" in identity:
        return f"gguf sha256 {identity['gguf_sha256']}"
    if "hub" in identity:
        return f"{identity['hub']}@{str(identity['revision'])[:12]}"
    if "folder" in identity:
        return f"{identity['folder']} ({len(identity.get('files', []))} files)"
    return json.dumps(identity)[:60]

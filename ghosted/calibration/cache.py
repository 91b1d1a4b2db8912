"""Calibration statistics kept on disk, so that the same calibration pass never runs twice.

The float64 statistics of a calibration pass (``calibration.collect_stats``) are the expensive part
of every recovery on a large model: one forward pass over every calibration window. Each finished
pass is saved here (tensors in safetensors, metadata in a small JSON file next to it) under a key
made of everything that determines it:

  * a cheap identity of the model (``calibration.identity.model_identity``: the hub commit, the
    GGUF's sha256, or its folder's files with their inodes, change times and samples of each weight
    file, so a checkpoint rewritten in place with its times kept is not mistaken for the old one).
    In-memory variants built by ghosted (pruned views, recovered models) have no such identity and
    are not cached;
  * the dtype and device type the pass ran in, the torch and transformers versions and the attention
    implementation (the code that computes the stream);
  * the sha256 of the calibration windows (input ids and attention mask);
  * the gaps, and every setting that changes the statistics (``CalibrationConfig``: batch size,
    ReplaceMe and LinearPatch sums, reservoir size, seed; the sink rule).

A later ``run``, ``export``, grid cell or app action with the same key loads the statistics instead
of running the model; ``--no-cache`` turns this off. Entries are written atomically (a temporary file
renamed into place, the JSON last), and an entry that cannot be read back is ignored with a warning
and recomputed. The folder is ``$GHOSTED_STATS_CACHE``, else ``ghosted.models.assets.cache_dir() / "stats"``.
Statistics grow with the width squared (about 1.3 GB per gap and pass at d = 4096), so the least
recently used entries are deleted beyond ``$GHOSTED_STATS_CACHE_GB`` (default 20 GB).

Ghosted deletes only what it wrote: the folder carries a marker file (``MARKER``) written when
Ghosted creates it or adopts it (empty, or holding only an older Ghosted's entries), and an entry
is Ghosted's when its name is ``<32 hex digits>.json`` / ``.safetensors`` and its JSON holds the key
whose digest is that name (a tensor file left without its JSON: its own metadata names the digest).
Eviction and ``clear`` remove only such entries, and ``clear`` refuses a folder without the marker.
A write that fails (a full disk, a read-only folder) warns once; the run goes on with the
statistics in memory, and ``StatsCache.written`` says what was really saved.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import uuid
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ghosted.models.assets import cache_dir, file_sha256, process_alive
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.core.progress import Progress, for_stage
from ghosted.calibration.stats import BoundaryStats
from ghosted.calibration.stored import device_or_cpu, flatten, restore_detector, sink_state, unflatten
from ghosted.calibration.identity import describe_identity, model_identity  # noqa: F401  (model_identity: API)

FORMAT = 2  # bump when the stored layout changes: older entries then simply stop matching (2: owned)
DEFAULT_LIMIT_GB = 20.0  # total size kept on disk unless $GHOSTED_STATS_CACHE_GB says otherwise
MARKER = ".ghosted-stats-cache"  # the file that makes a folder Ghosted's statistics cache
STAMP = "ghosted calibration statistics"  # in each entry's JSON and tensor-file metadata
_ENTRY = re.compile(r"^(?P<digest>[0-9a-f]{32})\.(json|safetensors)$")  # an entry's files
_TEMP = re.compile(r"^[0-9a-f]{32}\.(json|safetensors)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}$")  # one being written


class ForeignFolder(ValueError):
    """The statistics folder is not Ghosted's: no marker, and files Ghosted did not write."""


def stats_dir() -> Path:
    """The folder holding the entries (``$GHOSTED_STATS_CACHE`` overrides the default)."""
    env = os.environ.get("GHOSTED_STATS_CACHE")
    return Path(env) if env else cache_dir() / "stats"


# --- key ---------------------------------------------------------------------------------------------

def windows_hash(windows) -> str:
    """sha256 of the windows' input ids and attention mask (shapes and dtypes included)."""
    digest = hashlib.sha256()
    mask = getattr(windows, "attention_mask", None)
    for tensor in (windows.input_ids, mask):
        if tensor is None:
            digest.update(b"none")
            continue
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def _dtype_device(model: nn.Module) -> tuple[str, str]:
    param = next(model.parameters())
    device = "device_map" if getattr(model, "hf_device_map", None) else param.device.type
    return str(param.dtype).replace("torch.", ""), device


def _rule_of(detector) -> dict | None:
    if detector is None:
        return None
    return {k: v for k, v in asdict(detector.rule).items()}


def cache_key(identity: dict, model: nn.Module, windows, gaps: list[Gap], config: CalibrationConfig,
              detector=None) -> dict:
    """Everything that determines a calibration pass's statistics, as plain JSON."""
    import transformers

    dtype, device = _dtype_device(model)
    code = {"torch": torch.__version__, "transformers": transformers.__version__,  # the model's code and kernels
            "attention": getattr(getattr(model, "config", None), "_attn_implementation", None)}
    return {"format": FORMAT, "model": identity, "dtype": dtype, "device": device, "code": code,
            "windows": windows_hash(windows), "tokens": int(windows.input_ids.numel()),
            "gaps": [[g.start, g.end] for g in gaps], "calibration": asdict(config),
            "sinks": _rule_of(detector)}


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


# --- the cache ----------------------------------------------------------------------------------------

@dataclass
class CacheEntry:
    """One stored pass, as ``python -m ghosted cache`` lists it."""

    digest: str  # file stem of the entry
    model: str  # short description of the model identity
    gaps: str  # e.g. "[20, 27)"
    tokens: int  # calibration tokens (windows x length)
    bytes: int  # size on disk
    created: str  # UTC time it was written


class StatsCache:
    """The on-disk statistics cache (``folder``: ``stats_dir()`` unless given)."""

    def __init__(self, folder: str | Path | None = None, limit_gb: float | None = None):
        self.folder = Path(folder) if folder else stats_dir()
        self.limit_gb = limit_gb if limit_gb is not None else float(
            os.environ.get("GHOSTED_STATS_CACHE_GB", DEFAULT_LIMIT_GB))  # older entries go beyond this
        self.written: list[str] = []  # digests this object saved (what a report may call cached)
        self.failure: str | None = None  # why saving stopped (warned once; later passes are not saved)

    def _paths(self, digest: str) -> tuple[Path, Path]:
        return self.folder / f"{digest}.safetensors", self.folder / f"{digest}.json"

    def load(self, key: dict, detector=None) -> dict[Gap, BoundaryStats] | None:
        """The stored statistics for ``key``, or None (missing or unreadable: warns, never raises)."""
        digest = key_digest(key)
        tensors_path, meta_path = self._paths(digest)
        if not meta_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("key") != json.loads(json.dumps(key, default=str)):
                raise ValueError("its key does not match its file name")
            if file_sha256(tensors_path) != meta["sha256"]:
                raise ValueError("its tensor file was changed or truncated")
            from safetensors.torch import load_file

            stats = unflatten(load_file(str(tensors_path)), meta["stats"], device_or_cpu)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
            warnings.warn(f"Ignoring the unreadable calibration statistics in {meta_path} ({err}); "
                          "computing them again.", RuntimeWarning, stacklevel=3)
            return None
        restore_detector(detector, meta.get("detector"))
        os.utime(meta_path)  # recently used: the last to be evicted
        return stats

    def store(self, key: dict, stats: dict[Gap, BoundaryStats], detector=None) -> Path:
        """Write one entry atomically: the tensors, then the JSON that makes the entry visible."""
        self.claim()
        digest = key_digest(key)
        tensors_path, meta_path = self._paths(digest)
        tensors, stats_meta = flatten(stats)
        tag = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp_tensors = tensors_path.with_name(tensors_path.name + tag)
        tmp_meta = meta_path.with_name(meta_path.name + tag)
        try:
            save_file(tensors, str(tmp_tensors), metadata={"ghosted": STAMP, "digest": digest})
            meta = {"ghosted": STAMP, "key": key, "stats": stats_meta, "detector": sink_state(detector),
                    "sha256": file_sha256(tmp_tensors), "bytes": tmp_tensors.stat().st_size,
                    "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
            tmp_meta.write_text(json.dumps(meta, indent=1, default=str))
            os.replace(tmp_tensors, tensors_path)
            os.replace(tmp_meta, meta_path)  # last: the entry exists only once both are complete
        finally:
            for tmp in (tmp_tensors, tmp_meta):
                tmp.unlink(missing_ok=True)
        self.written.append(digest)
        self.evict(keep=digest)
        return meta_path

    def claim(self) -> None:
        """Make sure the folder is Ghosted's: create it with the marker, or adopt an empty folder or
        one holding only entries (an older Ghosted's cache); a ``ForeignFolder`` error otherwise."""
        marker = self.folder / MARKER
        if marker.exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        others = [p.name for p in self.folder.iterdir() if not (_ENTRY.match(p.name) or _TEMP.match(p.name))]
        if others:
            raise ForeignFolder(f"{self.folder} is not Ghosted's statistics cache (no {MARKER} file, and it "
                                f"holds {len(others)} other file(s) such as {others[0]}); set "
                                "$GHOSTED_STATS_CACHE to a new or empty folder.")
        marker.write_text(json.dumps({"ghosted": "statistics cache", "format": FORMAT}) + "\n")

    def owned(self) -> list[Path]:
        """The JSON files of the entries Ghosted provably wrote here (name and key digest agree)."""
        if not self.folder.is_dir():
            return []
        return [p for p in sorted(self.folder.glob("*.json")) if _ENTRY.match(p.name) and _json_digest(p) == p.stem]

    def evict(self, keep: str = "") -> list[str]:
        """Delete Ghosted's least recently used entries until the total is within ``limit_gb``; never
        ``keep``, never a file Ghosted did not write."""
        entries = sorted(self.owned(), key=lambda p: p.stat().st_mtime)  # oldest first
        sizes = {p: p.stat().st_size + _size(p.with_suffix(".safetensors")) for p in entries}
        total, removed = sum(sizes.values()), []
        for meta_path in entries:
            if total <= self.limit_gb * 2**30:
                break
            if meta_path.stem == keep:
                continue
            _remove_entry(meta_path)
            total -= sizes[meta_path]
            removed.append(meta_path.stem)
        return removed

    def entries(self) -> list[CacheEntry]:
        """Every entry Ghosted wrote, newest first."""
        found = []
        for meta_path in self.owned():
            tensors_path = meta_path.with_suffix(".safetensors")
            size = _size(tensors_path) + meta_path.stat().st_size
            try:
                meta = json.loads(meta_path.read_text())
                key = meta["key"]
                gaps = ", ".join(f"[{s}, {e})" for s, e in key["gaps"])
                found.append(CacheEntry(meta_path.stem, describe_identity(key["model"]), gaps,
                                        int(key["tokens"]), size, meta.get("created", "")))
            except (OSError, ValueError, KeyError, TypeError):
                found.append(CacheEntry(meta_path.stem, "(unreadable entry)", "", 0, size, ""))
        return sorted(found, key=lambda e: e.created, reverse=True)

    def others(self) -> list[str]:
        """Names in the folder that are not Ghosted's (left alone by ``clear`` and eviction)."""
        if not self.folder.is_dir():
            return []
        mine = {MARKER, *(n for p in self.owned() for n in (p.name, p.stem + ".safetensors"))}
        return sorted(p.name for p in self.folder.iterdir()
                      if p.name not in mine and not _orphan(p) and not _TEMP.match(p.name))

    def clear(self) -> int:
        """Delete every entry Ghosted wrote (and its stray temporary files); returns the bytes freed.

        Refuses (``ForeignFolder``) a folder without the marker: Ghosted did not create it, so nothing
        in it is deleted. Any other file in the folder stays."""
        if not self.folder.is_dir():
            return 0
        if not (self.folder / MARKER).exists():
            raise ForeignFolder(f"Refusing to clear {self.folder}: it has no {MARKER} file, so it is not a "
                                "statistics cache Ghosted created; nothing was deleted.")
        freed = 0
        for meta_path in self.owned():
            freed += meta_path.stat().st_size + _size(meta_path.with_suffix(".safetensors"))
            _remove_entry(meta_path)
        for path in list(self.folder.iterdir()):
            stale = _TEMP.match(path.name) and not process_alive(int(_TEMP.match(path.name)["pid"]))
            if stale or _orphan(path):
                freed += _size(path)
                path.unlink(missing_ok=True)
        return freed


def _json_digest(meta_path: Path) -> str | None:
    """The digest of the key an entry's JSON holds (None when it is unreadable or not an entry)."""
    try:
        meta = json.loads(meta_path.read_text())
        return key_digest(meta["key"]) if isinstance(meta, dict) and isinstance(meta.get("key"), dict) else None
    except (OSError, ValueError):
        return None


def _orphan(path: Path) -> bool:
    """A tensor file Ghosted wrote whose JSON is gone (a crash between the two renames)."""
    match = _ENTRY.match(path.name)
    if not match or path.suffix != ".safetensors" or path.with_suffix(".json").exists():
        return False
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
    except Exception:  # noqa: BLE001  unreadable: not provably Ghosted's, so it stays
        return False
    return meta.get("ghosted") == STAMP and meta.get("digest") == match["digest"]


def _remove_entry(meta_path: Path) -> None:
    meta_path.unlink(missing_ok=True)  # the JSON first: the entry is gone before its tensors are
    meta_path.with_suffix(".safetensors").unlink(missing_ok=True)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def resolve_cache(cache) -> StatsCache | None:
    """``True`` -> the default cache, ``False``/``None`` -> none, a ``StatsCache`` -> itself."""
    if cache is True:
        return StatsCache()
    return cache or None


def collect_cached(cache: StatsCache | None, identity: dict | None, model: nn.Module, windows,
                   gaps: list[Gap], config: CalibrationConfig, *, sink_detector=None,
                   progress: Progress | None = None, label: str = "calibration"
                   ) -> tuple[dict[Gap, BoundaryStats], str]:
    """``collect_stats`` through the cache: (statistics, "reused" or "computed").

    Without a cache or an identity this is ``collect_stats`` itself. A stored entry is returned
    without any forward pass; otherwise the pass runs and its statistics are stored as soon as it
    finishes (a failure to write warns and does not stop the run).
    """
    if cache is None or identity is None:
        return collect_stats(model, windows, gaps, config, sink_detector=sink_detector,
                             progress=progress, label=label), "computed"
    key = cache_key(identity, model, windows, gaps, config, sink_detector)
    stored = cache.load(key, sink_detector)
    if stored is not None and set(stored) == set(gaps):
        for_stage(progress, f"{label} (reused)")(1, 1)
        return stored, "reused"
    stats = collect_stats(model, windows, gaps, config, sink_detector=sink_detector, progress=progress,
                          label=label)
    if cache.failure is None:  # after a failed write, later passes are not tried (one warning per cache)
        try:
            cache.store(key, stats, sink_detector)
        except (OSError, ForeignFolder, SafetensorError) as err:
            cache.failure = (f"Could not save calibration statistics to {cache.folder} ({err}); the run goes "
                             "on with them in memory, and they are not cached.")
            warnings.warn(cache.failure, RuntimeWarning, stacklevel=2)
    return stats, "computed"

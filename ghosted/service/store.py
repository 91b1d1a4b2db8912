"""Results computed once for everyone: a process-wide store keyed by what determines each result.

Many people on one server (a public demo, a class following the same steps) ask for the same things:
the influence report at the page defaults, the run of the same preset, its evaluation. Each request
is named by a key (``request_key``: a digest of the model's identity, the windows, the layers and every
setting), and the store keeps the result under it, so the second person to ask gets the first one's
result at once (the job queue, ``ghosted.service.jobs``, asks the store before computing).

Two layers:

  * memory: every result, shared by every session, read-only (like the cached model: a page reads a
    stored result, never changes it). Bounded: at most ``max_entries`` (the least recently used go
    first), and an entry no one has read for ``idle_s`` seconds is released; a session that comes back
    later finds its result on disk or has it computed again.
  * disk (optional, ``folder``): results of the kinds that have a codec (plain JSON, never pickle) are
    also written there, atomically, one ``<digest>.json`` per result, so precomputed answers survive a
    restart (``python -m ghosted precompute`` fills it at image build). Files are read back as untrusted
    input: a file that does not parse, or whose key does not match its name, is ignored with a warning.

Example:
    >>> store = ResultStore(max_entries=32)
    >>> key = request_key("influence", {"model": "bundled", "windows": 16})
    >>> store.put(key, report, kind="influence"); store.get(key) is report
    True
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1  # bump when a codec's layout changes: older files then simply stop matching
MAX_FILE_BYTES = 32 * 2**20  # a stored result larger than this is not read (the largest real one: ~1 MB)
MAX_DEPTH = 32  # nesting of a stored result's JSON, at most (a codec's layout needs under 10)
_LOG = logging.getLogger(__name__)
PREFIX = "ghosted-result-"  # every file the store writes starts so; nothing else in the folder is touched


def request_key(kind: str, fields: dict) -> str:
    """The key of one request: a digest of its kind and every field that changes its result."""
    text = json.dumps({"format": FORMAT, "kind": kind, **fields}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


@dataclass(frozen=True)
class Codec:
    """How one kind of result is written to and read from a JSON file."""

    encode: Callable[[object], dict]  # result -> JSON-ready dict
    decode: Callable[[dict], object]  # that dict (from an untrusted file) -> result; raises ValueError


@dataclass
class _Entry:
    value: object
    kind: str
    used: float  # time.monotonic() of the last put or get


class ResultStore:
    """Thread-safe results by key: memory (bounded) over an optional folder of JSON files."""

    def __init__(self, max_entries: int = 64, idle_s: float | None = None, folder: str | Path | None = None,
                 codecs: dict[str, Codec] | None = None, clock: Callable[[], float] = time.monotonic):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}.")
        self.max_entries = max_entries  # results kept in memory
        self.idle_s = idle_s  # release a result no one read for this long; None: never
        self.folder = Path(folder) if folder else None  # JSON copies of results with a codec
        self.codecs = dict(codecs or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.write_failure: str | None = None  # why the folder could not be written (then memory only)

    def get(self, key: str):
        """The result for ``key`` (memory, then disk), or None."""
        with self._lock:
            self._release_idle()
            entry = self._entries.get(key)
            if entry is not None:
                entry.used = self._clock()
                self._entries.move_to_end(key)
                return entry.value
        value, kind = self._read(key)
        if value is not None:
            self._remember(key, value, kind)
        return value

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def put(self, key: str, value, kind: str = "") -> None:
        """Keep ``value`` under ``key`` (and on disk when its kind has a codec)."""
        self._remember(key, value, kind)
        self._write(key, value, kind)

    def forget(self, key: str) -> None:
        """Drop ``key`` from memory (the disk copy stays)."""
        with self._lock:
            self._entries.pop(key, None)

    def keys(self) -> list[str]:
        """The keys held in memory, least recently used first."""
        with self._lock:
            self._release_idle()
            return list(self._entries)

    def release_idle(self) -> list[str]:
        """Release the results no one read for ``idle_s`` seconds; returns their keys."""
        with self._lock:
            return self._release_idle()

    def _release_idle(self) -> list[str]:
        if self.idle_s is None:
            return []
        now = self._clock()
        idle = [k for k, e in self._entries.items() if now - e.used > self.idle_s]
        for key in idle:
            del self._entries[key]
        return idle

    def _remember(self, key: str, value, kind: str) -> None:
        with self._lock:
            self._entries[key] = _Entry(value, kind, self._clock())
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def path_of(self, key: str) -> Path | None:
        """Where ``key``'s JSON copy lives (None without a folder)."""
        return self.folder / f"{PREFIX}{key}.json" if self.folder else None

    def _write(self, key: str, value, kind: str) -> None:
        """The JSON copy, written atomically; a folder that cannot be written (read-only, full) turns the
        store to memory only, said once (``write_failure``), and the job that asked still ends done."""
        codec, path = self.codecs.get(kind), self.path_of(key)
        if codec is None or path is None or self.write_failure is not None:
            return
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"format": FORMAT, "key": key, "kind": kind, "result": codec.encode(value)},
                                      default=str))
            os.replace(tmp, path)
        except (OSError, ValueError, TypeError) as err:
            self.write_failure = f"{type(err).__name__}: {err}"
            warnings.warn(f"Could not save a {kind} result to {self.folder} ({err}); results are kept in memory "
                          "only from now on.", RuntimeWarning, stacklevel=3)
        finally:
            if tmp.parent.is_dir():
                tmp.unlink(missing_ok=True)

    def _read(self, key: str) -> tuple[object | None, str]:
        """A stored result read as untrusted input: bounded in size before it is read, its key, kind, format,
        depth and types checked; anything else is skipped with a warning for the operator (never raised)."""
        path = self.path_of(key)
        if path is None or not path.is_file():
            return None, ""
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise ValueError(f"{size:,} bytes, over the {MAX_FILE_BYTES:,} a stored result may have")
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("key") != key or data.get("format") != FORMAT:
                raise ValueError("its key or format does not match its name")
            kind = data.get("kind")
            if not isinstance(kind, str) or not key.startswith(f"{kind}-"):
                raise ValueError(f"its kind {kind!r} is not the kind its key names")
            codec = self.codecs.get(kind)
            if codec is None:
                raise ValueError(f"no reader for results of kind {kind!r}")
            check_depth(data["result"], MAX_DEPTH)
            return codec.decode(data["result"]), kind
        except Exception as err:  # noqa: BLE001 - whatever a crafted file makes a decoder raise, it is skipped
            _LOG.warning("Ignoring the unreadable stored result %s (%s: %s)", path, type(err).__name__, err)
            warnings.warn(f"Ignoring the unreadable stored result {path} ({err}); computing it again.",
                          RuntimeWarning, stacklevel=3)
            return None, ""


def check_depth(value, limit: int) -> None:
    """Refuse JSON nested deeper than ``limit`` (iteratively: a deep value cannot exhaust the stack here)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            raise ValueError(f"nested deeper than {limit} levels")
        if isinstance(item, dict):
            pending.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            pending.extend((v, depth + 1) for v in item)

"""The grid's journal: every finished part of a grid, one JSON line each, so a stopped grid resumes.

``GridJournal`` appends a record as each part finishes (flushed and synced); ``settings_digest`` is what
every record is keyed under, so that a part is only taken again under the very same settings and model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class GridJournal:
    """The finished parts of a grid, one JSON line each in ``grid.jsonl``, appended as each finishes.

    A record is ``{"kind", "settings", "key", ...payload}``: ``settings`` is a digest of everything
    that changes a result (``settings_digest``), ``key`` says which part it is (a selection and n, a
    dense text, or a cell: its layers, methods and texts). ``resume=True`` takes the records of the
    journal already there; a journal already there without ``resume`` needs ``overwrite`` (never
    deleted otherwise), and is then replaced only when the first new part is written, so a stop
    before that leaves it as it was. The folder is marked as Ghosted's output folder.
    """

    def __init__(self, out_dir: str | Path, resume: bool = False, overwrite: bool = False):
        from ghosted.core.ownership import claim_output_dir

        self.check(out_dir, resume, overwrite)
        self.path = Path(out_dir) / "grid.jsonl"
        self.records = self._read() if resume else []
        self._replace = not resume and self.path.exists()  # overwrite: replaced by the first new record
        claim_output_dir(out_dir)

    @staticmethod
    def check(out_dir: str | Path, resume: bool = False, overwrite: bool = False) -> None:
        """Refuse to start a new grid over an earlier grid's journal without ``resume`` or ``overwrite``."""
        path = Path(out_dir) / "grid.jsonl"
        if path.exists() and not (resume or overwrite):
            raise ValueError(f"{path} holds an earlier grid's finished cells: add --resume (resume=True) to go on "
                             "from them, or --overwrite (overwrite=True) to start again, or choose another folder.")

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut short by a crash: that part is simply done again
                continue
        return records

    def find(self, kind: str, settings: str, key: dict) -> dict | None:
        """The latest record of this part under these settings, or None."""
        want = json.loads(json.dumps(key, default=str))
        for record in reversed(self.records):
            if (record.get("kind"), record.get("settings"), record.get("key")) == (kind, settings, want):
                return record
        return None

    def add(self, kind: str, settings: str, key: dict, **payload) -> None:
        """Append one finished part (flushed and synced, so a crash right after keeps it)."""
        record = json.loads(json.dumps({"kind": kind, "settings": settings, "key": key, **payload},
                                       default=_plain))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        target, self._replace = (self.path.with_name(f".grid.jsonl.tmp-{os.getpid()}") if self._replace
                                 else self.path), False
        with open(target, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if target != self.path:
            os.replace(target, self.path)  # the earlier grid's journal goes only now
        self.records.append(record)


def _plain(value):
    """JSON for what the rows may hold besides plain types (numpy numbers, paths)."""
    return value.item() if hasattr(value, "item") else str(value)


def settings_digest(cfg, lm) -> str:
    """What every result of a grid (``cfg``, a ``GridConfig``, on ``lm``, a ``LoadedModel``) depends on: the
    settings (not which cells, nor the cache) and
    the model's identity (so a changed checkpoint at the same path is not mistaken for the old one)."""
    from ghosted.calibration.cache import model_identity

    # part of each record's key instead (a cell of another draw carries its seed), or changes no result
    which_cells = ("selections", "n_values", "methods", "evals", "cache", "seeds")
    settings = {k: v for k, v in vars(cfg.flat()).items() if k not in which_cells}
    settings["model_identity"] = model_identity(lm.model)
    settings["model_name"] = lm.name
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:24]

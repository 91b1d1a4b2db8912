"""How Ghosted knows a file is its own, so that it replaces only what it wrote.

* A results JSON (``run --out``) carries ``"ghosted": "results"`` at its top: Ghosted replaces a
  file at ``--out`` only when it holds that stamp (or the user passes ``--overwrite``).
* An output folder (``grid --out-dir``, ``influence --out-dir``) carries a marker file,
  ``.ghosted-output``, written when Ghosted creates the folder or first writes into it; Ghosted
  rewrites its own file names (``grid.csv``, ``blocks.csv``, ...) there only in a folder with the
  marker, or in a folder where none of those names exists yet (nothing is replaced), or with
  ``--overwrite``.
* The statistics cache has its own marker and proves each entry (``ghosted.calibration.cache``);
  a saved model folder lists its files in its recipe (``ghosted.operators.saved_files``).

Whatever the flags, nothing is ever written inside the folder a model was loaded from, nor inside
Ghosted's or the hub's caches (``ghosted.experiments.validate.check_out_file``/``check_out_dir``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS_STAMP = "results"  # the value of "ghosted" at the top of a results JSON
OUTPUT_MARKER = ".ghosted-output"  # the file that makes a folder one of Ghosted's output folders


def stamped(payload: dict) -> dict:
    """``payload`` with the results stamp first (a results JSON Ghosted may later replace)."""
    return {"ghosted": RESULTS_STAMP, **{k: v for k, v in payload.items() if k != "ghosted"}}


def written_by_ghosted(path: str | Path) -> bool:
    """True when ``path`` is a results JSON Ghosted wrote (its stamp); False for anything else,
    unreadable files included. Reads at most 64 MiB (a results JSON is far smaller)."""
    path = Path(path)
    try:
        if not path.is_file() or path.stat().st_size > 64 * 2**20:
            return False
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(payload, dict) and payload.get("ghosted") == RESULTS_STAMP


def write_results(path: str | Path, payload: dict) -> Path:
    """Write a stamped results JSON atomically (a temporary sibling renamed into place), so a
    stopped write never leaves half a file where a whole one was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(stamped(payload), indent=2, default=str))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def owns_folder(folder: str | Path) -> bool:
    """True when ``folder`` carries Ghosted's output marker."""
    return (Path(folder) / OUTPUT_MARKER).is_file()


def claim_output_dir(folder: str | Path) -> Path:
    """Create ``folder`` if needed and mark it as Ghosted's output folder (once checked with
    ``validate.check_out_dir``); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / OUTPUT_MARKER
    if not marker.exists():
        marker.write_text("Ghosted writes its results here (grid.*, blocks.csv, ...); it replaces only "
                          "those files, and only in a folder with this marker.\n")
    return folder


def foreign_files(folder: str | Path, names) -> list[str]:
    """Which of ``names`` exist in ``folder`` without Ghosted's marker (files it would replace but
    cannot prove it wrote)."""
    folder = Path(folder)
    if not folder.is_dir() or owns_folder(folder):
        return []
    return [name for name in names if (folder / name).exists()]


def check_not_protected(path: str | Path, flag: str, protected) -> None:
    """Refuse ``path`` when it is, or is inside, one of ``protected`` (``(folder, what it is)`` pairs:
    the loaded model's folder, Ghosted's and the hub's caches), whatever the flags."""
    resolved = Path(path).expanduser().resolve()
    for folder, what in protected:
        guarded = Path(folder).expanduser().resolve()
        if resolved == guarded or guarded in resolved.parents:
            raise ValueError(f"Refusing to write {flag} {path}: it is inside {what} ({guarded}), which it "
                             "would damage. Choose a place outside it.")


def check_replace_file(path: str | Path, flag: str, overwrite: bool, protected=()) -> None:
    """A results file may be written at ``path``: never inside ``protected``; an existing file only
    when Ghosted wrote it (its stamp) or ``overwrite``."""
    check_not_protected(path, flag, protected)
    target = Path(path).expanduser()
    if target.exists() and not overwrite and not written_by_ghosted(target):
        raise ValueError(f"{flag} {path} exists and is not a results file Ghosted wrote (no \"ghosted\" stamp): "
                         "choose another file, or add --overwrite to replace it.")


def check_write_into(folder: str | Path, flag: str, names, overwrite: bool, protected=()) -> None:
    """Ghosted's files ``names`` may be written into ``folder``: never inside ``protected``; files of
    those names that Ghosted cannot prove it wrote (no marker) only with ``overwrite``."""
    check_not_protected(folder, flag, protected)
    existing = [] if overwrite else foreign_files(Path(folder).expanduser(), names)
    if existing:
        raise ValueError(f"{flag} {folder} already holds {', '.join(existing)}, which Ghosted did not write "
                         f"(no {OUTPUT_MARKER} marker): choose another folder, or add --overwrite to replace them.")

"""``python -m ghosted cache``: list the saved calibration statistics, or clear them."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="list or clear the saved calibration statistics",
                       description="Calibration statistics are saved after each calibration pass and reused "
                                   "by any later run, export or grid cell with the same model, windows, gaps "
                                   "and settings (no forward pass the second time). This lists them (model, "
                                   "gaps, tokens, size, date) or clears them. The folder is "
                                   "$GHOSTED_STATS_CACHE, else the 'stats' folder of Ghosted's cache "
                                   "($GHOSTED_CACHE or ~/.cache/ghosted).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--clear", action="store_true",
                   help="delete every saved entry (only files Ghosted wrote, in a folder it created)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what is saved (and what --clear would delete), change nothing")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.calibration.cache import StatsCache

    cache = StatsCache()
    if args.dry_run:
        entries = cache.entries()
        action = "--clear would delete" if args.clear else "saved"
        print(f"dry run: {action} {len(entries)} entries, {sum(e.bytes for e in entries) / 2**20:.1f} MiB "
              f"in {cache.folder}; nothing changed")
        return 0
    if args.clear:
        freed = cache.clear()  # Ghosted's entries only; a folder without its marker is refused
        others = cache.others()
        left = f"; {len(others)} other file(s) left, not Ghosted's: {', '.join(others[:5])}" if others else ""
        print(f"cleared {cache.folder} ({freed / 2**20:.1f} MiB freed){left}")
        return 0
    entries = cache.entries()
    print(f"calibration statistics in {cache.folder}: {len(entries)} entries, "
          f"{sum(e.bytes for e in entries) / 2**20:.1f} MiB")
    if entries:
        print(format_entries(entries))
    return 0


def format_entries(entries) -> str:
    """A plain-text table: model, gaps, tokens, size, date (newest first)."""
    head = f"{'model':<44}{'gaps':<20}{'tokens':>10}{'MiB':>10}  created"
    lines = [head, "-" * len(head)]
    for e in entries:
        model = e.model if len(e.model) <= 42 else "..." + e.model[-39:]
        lines.append(f"{model:<44}{e.gaps:<20}{e.tokens:>10,}{e.bytes / 2**20:>10.2f}  {e.created}")
    return "\n".join(lines)

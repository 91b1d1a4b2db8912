"""What the load benchmark reads from the server's logs: the jobs it ran (``GHOSTED_JOB_LOG``), how long it
took to draw each page while jobs ran, and what each session was told while it waited (``GHOSTED_PAGE_LOG``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread(values: list[float]) -> dict:
    """Median, 95th percentile and count of ``values`` (None when there are none)."""
    return {"median_s": statistics.median(values) if values else None, "p95_s": quantile(values, 0.95),
            "count": len(values)}


def job_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def job_summary(log: Path, skip: int = 0) -> dict:
    """What the server computed, from its job log (after its first ``skip`` jobs, the warm-up): per kind,
    jobs done and their summed seconds."""
    jobs = [json.loads(line) for line in job_lines(log)[skip:]]
    out = {}
    for job in jobs:
        entry = out.setdefault(job["kind"], {"done": 0, "other": 0, "seconds": 0.0})
        if job["state"] == "done":
            entry["done"] += 1
            entry["seconds"] += job["seconds"] or 0.0
        else:
            entry["other"] += 1
    return out


def busy_page_runs(pages: Path, jobs: Path, since: float) -> dict:
    """The server's side of page switches: how long it took to draw each page it was asked for after
    ``since`` (wall clock) while a job was running, from its page log and job log (median, p95, count)."""
    running = [(j["ended"] - j["seconds"], j["ended"]) for j in map(json.loads, job_lines(jobs)) if j["seconds"]]
    runs = [r["seconds"] for r in map(json.loads, job_lines(pages))
            if "page" in r and r["started"] >= since and any(start <= r["started"] < end for start, end in running)]
    return spread(runs)


def told(pages: Path, since: float, quick_s: float = 2.0) -> dict:
    """What the sessions that waited for a job were told, from the page log after ``since``: how many asked
    for a job that was not yet done ("waited"), how many of those the queue's panel reached ("panel"), how many
    saw a place in the queue ("place"), how many waited longer than ``quick_s`` (two polls of the panel)
    without ever being shown it ("silent"), and the first estimate a queued session was shown against the
    wait it then had (seconds to its answer)."""
    events = _events(pages, since)
    asked = {pair: at for pair, (at, _, state) in _first_asks(events).items() if state != "done"}
    panels = [e for e in events if e["event"] == "panel" and (e["owner"], e["key"]) in asked]
    answered = {(e["owner"], e["key"]): e["time"] for e in events if e["event"] == "answered"}
    shown = {(e["owner"], e["key"]) for e in panels}
    quick = {pair for pair, at in asked.items() if answered.get(pair, float("inf")) - at <= quick_s}
    first_estimate = {}
    for e in panels:
        if e["state"] == "queued" and e["wait_s"] is not None:
            first_estimate.setdefault((e["owner"], e["key"]), e)
    pairs = [(e["wait_s"], answered[pair] - e["time"]) for pair, e in first_estimate.items() if pair in answered]
    return {"waited": len({owner for owner, _ in asked}), "panel": len({owner for owner, _ in shown}),
            "place": len({e["owner"] for e in panels if e["state"] == "queued"}),
            "silent": len({owner for owner, _ in set(asked) - shown - quick}),
            "estimate": spread([p[0] for p in pairs]), "actual": spread([p[1] for p in pairs])}


def answer_times(pages: Path, since: float) -> dict:
    """The server's part of each step, from the page log after ``since``: per kind of request, the seconds from
    a session's first ask to the page that showed it the result (median, p95, count); the browser's own time to
    draw that page is not in it."""
    events = _events(pages, since)
    asked = _first_asks(events)
    waits = {}
    for e in events:
        if e["event"] == "answered" and (e["owner"], e["key"]) in asked:
            at, kind, _ = asked[(e["owner"], e["key"])]
            waits.setdefault(kind, []).append(e["time"] - at)
    return {kind: spread(values) for kind, values in sorted(waits.items())}


def _events(pages: Path, since: float) -> list[dict]:
    """The page log's events (asked, panel, answered) from ``since`` on; the page runs left out."""
    return [e for e in map(json.loads, job_lines(pages)) if "event" in e and e["time"] >= since]


def _first_asks(events: list[dict]) -> dict[tuple[str, str], tuple[float, str, str]]:
    """(owner, request key) -> (time, kind, the job's state then) of that session's first ask for it."""
    asked = {}
    for e in events:
        if e["event"] == "asked":
            asked.setdefault((e["owner"], e["key"]), (e["time"], e.get("kind", ""), e["state"]))
    return asked

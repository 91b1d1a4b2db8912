"""The report of the load benchmark: the table in docs/BENCHMARKS.md and the sentence in docs/DEPLOY.md,
written from the cells in ``bench/results/load.json`` (``python -m bench.load --report``).
"""

from __future__ import annotations

import json

from bench._common import ROOT, table, write_section

RESULTS = ROOT / "bench" / "results" / "load.json"
DEPLOY = ROOT / "docs" / "DEPLOY.md"


def cell_name(cell: dict) -> str:
    pinned = f"-server-on-{cell['server_cores']}-cores" if cell.get("server_cores") else ""
    return f"{cell['sessions']}-{cell['choices']}{'-precomputed' if cell['precomputed'] else ''}{pinned}"


def load_results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"cells": {}}


def seconds(entry: dict, digits: int | None = None) -> str:
    """Median / p95 in seconds ("-" when nothing was measured); by default one decimal under 10 s."""
    if entry.get("median_s") is None:
        return "-"
    if digits is None:
        digits = 1 if entry["median_s"] < 10 else 0
    return f"{entry['median_s']:.{digits}f} / {entry['p95_s']:.{digits}f}"


def report_table(results: dict) -> str:
    header = ["sessions", "choices", "precomputed", "cores: server / browsers", "influence s (median / p95)",
              "recovered run s", "compared s", "whole flow s", "server's part s: recovered run; compared",
              "page switch while jobs run s",
              "server's page run while jobs run s", "waited for a job: saw the queue's panel / their place",
              "first estimate / actual wait s (median)", "errors",
              "server peak MiB", "jobs computed", "wall / summed job time", "CPU s: server / browsers", "load before"]
    rows = []
    for cell in sorted(results["cells"].values(), key=lambda c: (c["precomputed"], c["choices"], c["sessions"])):
        switch = cell["page_switch"]
        rows.append([cell["sessions"], cell["choices"], "yes" if cell["precomputed"] else "no", cores_text(cell),
                     seconds(cell["influence"]), seconds(cell["recovered"]), seconds(cell["compared"]),
                     seconds(cell["total"]), answer_text(cell), seconds(switch, 1) if switch["count"] else "-",
                     page_runs_text(cell),
                     saw_text(cell), estimate_text(cell), cell["errors"],
                     f"{cell['server_peak_mib']:.0f}", jobs_text(cell), wall_ratio(cell), cpu_text(cell),
                     f"{cell['load_before']:.1f}" if "load_before" in cell else "-"])
    return table(header, rows)


def cores_text(cell: dict) -> str:
    """Where the server and the browsers ran: pinned apart, or sharing every core."""
    if cell.get("server_cores"):
        return f"{cell['server_cores']} / {cell['cores'] - cell['server_cores']}"
    return f"{cell['cores']} shared"


def saw_text(cell: dict) -> str:
    """Of the sessions that waited for a job, from the server's page log: those the queue's panel reached /
    those shown their place in it, and those who waited without it ("silent"); cells measured before the
    log recorded it: what the sessions' browsers drew, of all sessions."""
    said = cell.get("told")
    if said is None:
        panel = sum(bool(r.get("queue_text")) for r in cell.get("records", []))
        return f"{panel} / {cell['saw_queue_place']} of {cell['sessions']} (browsers)"
    if not said["waited"]:
        return "none waited"
    return f"{said['panel']} / {said['place']} of {said['waited']}, {said['silent']} silent"


def estimate_text(cell: dict) -> str:
    """The first wait estimate a queued session was shown against the wait it had (medians, with the count)."""
    said = cell.get("told")
    if not said or not said["estimate"]["count"]:
        return "-"
    return (f"{said['estimate']['median_s']:.0f} / {said['actual']['median_s']:.0f} "
            f"({said['estimate']['count']} waits)")


def answer_text(cell: dict) -> str:
    """The server's part of the recovered run and the comparison: ask to the page that showed the result."""
    answers = cell.get("server_answer")
    if answers is None:
        return "-"
    return "; ".join(seconds(answers[kind]) if kind in answers else "-" for kind in ("fit", "evaluate"))


def page_runs_text(cell: dict) -> str:
    """The server's time to draw a page asked for while a job ran, with the count ("-": none, or not logged)."""
    runs = cell.get("server_page_run") or {"count": 0}
    return f"{seconds(runs, 2)} ({runs['count']} runs)" if runs["count"] else "-"


def jobs_text(cell: dict) -> str:
    """The jobs the server ran, e.g. "1 influence, 8 fit, 8 evaluate" ("-" without a job log)."""
    jobs = cell.get("jobs")
    if jobs is None:
        return "-"
    return ", ".join(f"{j['done']} {kind}" for kind, j in sorted(jobs.items()) if j["done"]) or "none"


def cpu_text(cell: dict) -> str:
    """CPU seconds the server and the (low-priority) browsers used while the class was there."""
    if "server_cpu_s" not in cell:
        return "-"
    return f"{cell['server_cpu_s']:.0f} / {cell['browser_cpu_s']:.0f}"


def wall_ratio(cell: dict) -> str:
    """Wall time of the whole cell over the summed time of the jobs it computed: at most 1 when no
    session waited on anything but the jobs themselves, run one after another."""
    if not cell.get("job_seconds"):
        return "-"
    return f"{cell['wall_s'] / cell['job_seconds']:.2f}"


def deploy_sentence(results: dict) -> str:
    """What a class gets on this machine: a lone visitor, and the largest class with the same and with
    different choices, each on the precomputed presets when that was measured."""
    cells = [c for c in results["cells"].values() if c["total"]["median_s"] is not None]
    if not cells:
        return ("`python -m bench.load` has not yet measured a session that finished the flow on this machine; "
                "see docs/BENCHMARKS.md (section \"A class at once\") for what was run.")
    precomputed = [c for c in cells if c["precomputed"]] or cells
    precomputed = [c for c in precomputed if c.get("server_cores")] or precomputed  # browsers apart: closer to a class
    lone = min(precomputed, key=lambda c: (c["sessions"], c["choices"] != "same"))
    largest = max(c["sessions"] for c in precomputed)
    classes = [c for c in precomputed if c["sessions"] == largest and c is not lone]
    where = (f"the server on {lone['server_cores']} of {lone['cores']} cores and the browsers on the others"
             if lone.get("server_cores") else f"{lone['cores']} cores shared by the server and the browsers")
    parts = [f"Measured with `python -m bench.load` on {where} ({lone['date']}, the server in demo "
             f"mode{', precomputed' if lone['precomputed'] else ''}): a lone visitor following the teaching flow "
             f"had compared results after {lone['total']['median_s']:.0f} s"]
    for c in sorted(classes, key=lambda c: c["choices"]):
        place = told_words(c) if c["choices"] == "different" else ""
        switch = (f", page switches while jobs ran {seconds(c['page_switch'], 1)} s (median / p95) in the browser"
                  if c["page_switch"]["count"] else "")
        if (c.get("server_page_run") or {}).get("count"):
            runs = c["server_page_run"]
            switch += (f", the server drew a page asked for while jobs ran in {seconds(runs, 2)} s "
                       f"(median / p95 of {runs['count']} pages)")
        parts.append(f"{plural(c['sessions'], 'session')} at once with {c['choices']} choices after "
                     f"{c['total']['median_s']:.0f} s (median; 95th percentile {c['total']['p95_s']:.0f} s), "
                     f"{c['total']['finished']} of {c['sessions']} finished, {c['errors']} error(s){place}{switch}, "
                     f"the server at most {c['server_peak_mib'] / 1024:.1f} GiB{cpu_words(c)}")
    return "; ".join(parts) + ". The full table is in docs/BENCHMARKS.md (section \"A class at once\")."


def told_words(cell: dict) -> str:
    """Who of a class waited for a job and what the queue's panel told them."""
    said = cell.get("told")
    if said is None:
        return f", {saw_text(cell).split(' / ')[0]} of them saw the queue's panel before their run was done"
    if not said["waited"]:
        return ", none of them waited for a job"
    return (f", {said['panel']} of the {said['waited']} who waited for a job saw the queue's panel "
            f"({said['place']} with their place in it, {said['silent']} waited without it)")


def cpu_words(cell: dict) -> str:
    """Who used the cores while the class was there (the browsers run on the server's machine here)."""
    if "server_cpu_s" not in cell:
        return ""
    return (f"; meanwhile the server used {cell['server_cpu_s']:.0f} CPU seconds and the "
            f"{plural(cell['sessions'], 'browser')} on its cores {cell['browser_cpu_s']:.0f}")


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def write_report(results: dict, argv: list[str] | None) -> None:
    body = (report_table(results) + "\n\nTimes are per session, from opening the app (influence) or from the "
            "step's first click; \"page switch\" is the time from a click on the top bar to the next page's "
            "title, while that session's run was being computed, as its browser saw it (a held-back browser waits "
            "for the CPU to draw, see below); \"server's page run\" is the server's own part: how long it took "
            "to run any page asked for while a job ran (its page log, `GHOSTED_PAGE_LOG`). The same log says who "
            "asked for a job that was not yet done (\"waited\"), which of them the queue's panel reached and "
            "showed a place, who waited more than two seconds without it (\"silent\"), and the first estimate "
            "a queued session was shown against the seconds it then waited for its answer. "
            "\"server's part\" of a step is, from the same log, the time from a session's ask to the page that showed "
            "it the result, its browser's drawing left out. Each cell starts a fresh server and visits it "
            "once before the sessions and waits until it is quiet (untimed: the model loads and the server "
            "computes its warm-up, the precomputed runs, as on a "
            "server that has been up). \"jobs computed\" and the summed job time come from the server's job "
            "log (`GHOSTED_JOB_LOG`), the warm-up's jobs left out; \"wall / summed job time\" below 1 means the "
            "workers ran jobs side by side "
            "and no session waited on anything but them. The browsers share the server's cores in a CPU group at "
            "nice 19's weight (`bench/load_browsers.py`; in a class they run on the students' machines, so here "
            "they get what the server leaves): \"CPU s\" gives what the server and the browsers used while the "
            "class was there (\"-\" for cells measured before it was recorded). \"load before\" is the machine's "
            "1-minute load "
            "average when the cell started (other work on the machine slows every number). Cells not listed "
            "were not run.")
    write_section("load", "A class at once: N browser sessions on one demo server", argv, body)
    from ghosted.core.docblocks import markers, write_block

    write_block(DEPLOY, *markers("load:classroom"), deploy_sentence(results))

"""A class at once: N real browser sessions follow the teaching flow against one demo server.

``streamlit run app.py`` in demo mode on this machine (fresh statistics cache and result store unless
``--precomputed``, which runs ``scripts/precompute.py`` into them first), and N sessions of one headless
chromium (Debian's ``/usr/bin/chromium``, driven by Playwright; one browser, one context per session)
that each follow the teaching flow at the same time: Influence with the page's defaults, the preset
"Streamline block of n", Calibrate & recover with the defaults, Compare with 1,024 evaluation tokens.
With ``--choices same`` every session picks n = 6; with ``different`` session i picks n = 2 + i mod 8
(different blocks, so different runs). While its run is computed each session switches to the Model page
and back, timing both page switches. The browsers run at nice 19's CPU weight (``bench/load_browsers.py``): in a
class they run on the students' machines, so here they take only what the server leaves; each cell records
how they were held back and the CPU seconds the server and the browsers used.

Per step: the median and 95th percentile of the sessions' times, page-switch latency while jobs run,
errors, and the server's peak memory (RSS of its process tree, sampled every 0.5 s). Results go to
``bench/results/load.json`` (one cell per N and choices, merged with the cells already there); the table
in docs/BENCHMARKS.md and the sentence in docs/DEPLOY.md are written from that file (``--report`` rewrites
them without measuring).

    python -m bench.load --sessions 1,10 --choices same,different
    python -m bench.load --sessions 1,10,30 --precomputed --server-cores 2   # on a machine with more cores
    python -m bench.load --report
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import ROOT, machine, today
from bench.load_browsers import cpu_group, low_priority_browser, remove_group, split_cores
from bench.load_usage import Usage, tree_rss_mib, wait_quiet
from bench.load_logs import answer_times, busy_page_runs, job_lines, job_summary, quantile, told
from bench.load_report import RESULTS, cell_name, load_results, write_report
from tests.e2e.conftest import _free_port, _wait_healthy, stop  # the browser tests' server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
STEP_TIMEOUT_MS = int(os.environ.get("GHOSTED_LOAD_STEP_S", 3600)) * 1000  # one step of one session, at most
EVAL_TOKENS = 1024  # the teaching flow's evaluation size
STEPS = ("influence", "recovered", "compared")
SHOTS = os.environ.get("GHOSTED_LOAD_SHOTS")  # a folder for a screenshot of each session that fails


# --- the server -------------------------------------------------------------------------------------------

def start_server(workdir: Path, precomputed: bool, cores: list[int] | None = None) -> tuple[subprocess.Popen, str]:
    """The demo app on a loopback port, with its own statistics cache and result store under ``workdir``;
    given ``cores``, it runs on those alone."""
    env = {**os.environ, "GHOSTED_DEMO": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "GHOSTED_STATS_CACHE": str(workdir / "stats"), "GHOSTED_RESULTS": str(workdir / "results"),
           "GHOSTED_JOB_LOG": str(workdir / "jobs.jsonl"), "GHOSTED_PAGE_LOG": str(workdir / "pages.jsonl")}
    env.pop("GHOSTED_DEPLOY", None)
    if precomputed:
        copy_precomputed(env, workdir)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless=true",
                               f"--server.port={port}", "--server.address=127.0.0.1",
                               "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server, limit_s=180)
    except RuntimeError:
        stop(server)
        raise
    return server, url


_PRECOMPUTED: dict[str, Path] = {}  # the commit's precomputed store, made once per benchmark run


def copy_precomputed(env: dict, workdir: Path) -> None:
    """Give a cell's fresh server the image build's answers: ``scripts/precompute.py`` runs once per
    benchmark (into a folder kept for the run), and each cell gets its own copy of its statistics and
    results, so no cell sees what an earlier cell computed."""
    if "dir" not in _PRECOMPUTED:
        folder = Path(tempfile.mkdtemp(prefix="ghosted-load-precomputed-"))
        once = {**env, "GHOSTED_STATS_CACHE": str(folder / "stats"), "GHOSTED_RESULTS": str(folder / "results"),
                "GHOSTED_JOB_LOG": str(folder / "jobs.jsonl")}
        subprocess.run([sys.executable, "scripts/precompute.py"], cwd=ROOT, env=once, check=True)
        _PRECOMPUTED["dir"] = folder
    for part in ("stats", "results"):
        if (_PRECOMPUTED["dir"] / part).is_dir():
            shutil.copytree(_PRECOMPUTED["dir"] / part, workdir / part)


# --- one session ------------------------------------------------------------------------------------------

async def idle(page) -> None:
    await page.wait_for_selector("[data-testid='stApp'][data-test-connection-state='CONNECTED']"
                                 "[data-test-script-state='notRunning']", timeout=STEP_TIMEOUT_MS)


async def go(page, title: str) -> float:
    """Switch page by the top bar; seconds until the new page's title shows."""
    started = time.perf_counter()
    await page.get_by_role("link", name=title, exact=True).first.click()
    await page.locator("h1").first.filter(has_text=title.split(" ")[0]).wait_for(timeout=STEP_TIMEOUT_MS)
    return time.perf_counter() - started


async def fill(page, key: str, value) -> None:
    box = page.locator(f".st-key-{key} input")
    await box.fill(str(value))
    await box.press("Tab")
    await idle(page)


async def click(page, key: str) -> None:
    await page.locator(f".st-key-{key} button").click()


async def switch_away_and_back(page, title: str, record: dict) -> None:
    """While this session's job runs: to the Model page and back, both switches timed."""
    record["switches"].append(await go(page, "Model"))
    record["switches"].append(await go(page, title))


def say(record: dict, what: str) -> None:
    print(f"session {record['session']}: {what}", file=sys.stderr, flush=True)


async def flow(browser, url: str, n_block: int, record: dict) -> None:
    """The teaching flow in one browser context; fills ``record`` with step times and errors."""
    context = await browser.new_context(viewport={"width": 1280, "height": 2000})
    page = await context.new_page()
    page.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        started = time.perf_counter()
        await page.goto(url)
        await idle(page)
        await go(page, "Influence")
        await click(page, "influence_run")
        await page.locator(".st-key-influence_bars .trace.bars .point path").nth(29).wait_for()
        record["influence"] = time.perf_counter() - started
        say(record, f"influence report after {record['influence']:.0f} s")
        await idle(page)
        await fill(page, "influence_n", n_block)
        await click(page, "influence_apply")  # the first preset: "Streamline block of n"
        await page.get_by_text(re.compile(rf"Selected: .*\({n_block} of 30 layers")).wait_for()
        await idle(page)
        step = time.perf_counter()
        await go(page, "Calibrate & recover")
        await click(page, "calibrate_run")
        panel = page.locator("[data-testid='stProgress']").first
        done = page.get_by_text(re.compile(r"^Run: layers"))
        await panel.or_(done).first.wait_for()  # the queue's panel, or the run at once (shared or precomputed)
        shown = await panel.all_inner_texts()  # at once: the panel may be gone by now (its job ended)
        record["queue_text"] = shown[0] if shown else ""
        if record["queue_text"]:
            await switch_away_and_back(page, "Calibrate & recover", record)
        await done.wait_for()
        record["recovered"] = time.perf_counter() - step
        say(record, f"recovered run after {record['recovered']:.0f} s")
        await idle(page)
        step = time.perf_counter()
        await go(page, "Compare")
        await fill(page, "eval_tokens", EVAL_TOKENS)
        await click(page, "evaluate_run")
        await page.get_by_text("tokens scored:").first.wait_for()
        record["compared"] = time.perf_counter() - step
        say(record, f"compared after {record['compared']:.0f} s")
        record["total"] = time.perf_counter() - started
        if await page.get_by_test_id("stException").count():
            record["errors"].append("an exception box on the page")
    except Exception as err:  # noqa: BLE001 - a benchmark counts errors, it does not stop on one
        record["errors"].append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        say(record, f"error: {record['errors'][-1]}")
        if SHOTS:
            await page.screenshot(path=str(Path(SHOTS) / f"load-session-{record['session']}.png"), full_page=True)
    finally:
        await context.close()


async def warm_visit(browser, url: str, server_pid: int) -> float:
    """One untimed visit before the class arrives, as on a server that has been up: the model is loaded,
    the server's warm-up (the precomputed runs, ``pages/_ui.warm_up``) is queued, and the class comes
    once the server is quiet (its warm-up done). Returns the seconds that took."""
    started = time.perf_counter()
    context = await browser.new_context()
    page = await context.new_page()
    page.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        await page.goto(url)
        await idle(page)
    finally:
        await context.close()
    await asyncio.to_thread(wait_quiet, server_pid)
    return time.perf_counter() - started


async def sessions(url: str, count: int, choices: str, server_pid: int, record_warm, browser_path: str) -> list[dict]:
    from playwright.async_api import async_playwright

    records = [{"session": i, "block_n": 6 if choices == "same" else 2 + i % 8, "switches": [], "errors": []}
               for i in range(count)]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=browser_path, args=FLAGS)
        try:
            record_warm(await warm_visit(browser, url, server_pid))
            await asyncio.gather(*(flow(browser, url, r["block_n"], r) for r in records))
        finally:
            await browser.close()
    return records


# --- a cell: N sessions with the same or different choices ---------------------------------------------------

def summary(records: list[dict]) -> dict:
    out = {}
    for step in (*STEPS, "total"):
        values = [r[step] for r in records if step in r]
        out[step] = {"median_s": statistics.median(values) if values else None, "p95_s": quantile(values, 0.95),
                     "finished": len(values)}
    switches = [s for r in records for s in r["switches"]]
    out["page_switch"] = {"median_s": statistics.median(switches) if switches else None,
                          "p95_s": quantile(switches, 0.95), "count": len(switches)}
    out["errors"] = sum(len(r["errors"]) for r in records)
    out["saw_queue_place"] = sum("place" in r.get("queue_text", "") for r in records)
    return out


def run_cell(count: int, choices: str, precomputed: bool, server_cores: int | None = None) -> dict:
    group = cpu_group(f"ghosted-load-browsers-{os.getpid()}")
    split = split_cores(server_cores, sorted(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="ghosted-load-") as tmp:
        server, url = start_server(Path(tmp), precomputed, split[0] if split else None)
        load_before = os.getloadavg()[0]
        try:
            with Usage(server.pid) as usage:
                idle_mib = tree_rss_mib(server.pid)
                log, warm = Path(tmp) / "jobs.jsonl", {}

                def warmed(seconds: float) -> None:  # the class arrives: jobs, time and CPU from here are theirs
                    usage.sample()
                    warm.update(seconds=seconds, jobs=len(job_lines(log)), at=time.perf_counter(), since=time.time(),
                                server_cpu=usage.cpu_s("server"), browser_cpu=usage.cpu_s("browsers"))
                launcher, held_back = low_priority_browser(Path(tmp), CHROMIUM, group, split[1] if split else None)
                records = asyncio.run(sessions(url, count, choices, server.pid, warmed, launcher))
                wall = time.perf_counter() - warm["at"]
                usage.sample()
        finally:
            stop(server, grace_s=30)
            if group:
                remove_group(group[0])
        jobs = job_summary(log, skip=warm.get("jobs", 0))
        page_runs = busy_page_runs(Path(tmp) / "pages.jsonl", log, warm.get("since", 0.0))
        queue_told = told(Path(tmp) / "pages.jsonl", warm.get("since", 0.0))
        answers = answer_times(Path(tmp) / "pages.jsonl", warm.get("since", 0.0))
    return {"sessions": count, "choices": choices, "precomputed": precomputed, "wall_s": wall,
            "warm_up_s": warm.get("seconds"), "warm_up_jobs": warm.get("jobs"),
            "server_idle_mib": idle_mib, "server_peak_mib": usage.peak, **summary(records),
            "server_page_run": page_runs, "told": queue_told, "server_answer": answers, "jobs": jobs,
            "job_seconds": sum(j["seconds"] for j in jobs.values()), "load_before": load_before,
            "server_cpu_s": usage.cpu_s("server") - warm.get("server_cpu", 0.0),
            "browser_cpu_s": usage.cpu_s("browsers") - warm.get("browser_cpu", 0.0), "browsers": held_back,
            "records": records, "date": today(), "machine": machine(), "cores": os.cpu_count(),
            "server_cores": server_cores, "commit": commit()}


def commit() -> str:
    """The commit the server ran (the numbers belong to that code)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", default="1,10", help="comma list of session counts")
    p.add_argument("--choices", default="same,different", help="comma list of same and different")
    p.add_argument("--precomputed", action="store_true", help="run scripts/precompute.py before the sessions")
    p.add_argument("--server-cores", type=int, default=None,
                   help="pin the server to this many cores and the browsers to the rest (default: they share all)")
    p.add_argument("--report", action="store_true", help="only rewrite the docs from bench/results/load.json")
    args = p.parse_args(argv)
    results = load_results()
    if not args.report:
        for count in (int(n) for n in args.sessions.split(",")):
            for choices in (c.strip() for c in args.choices.split(",")):
                if choices not in ("same", "different"):
                    raise SystemExit(f"--choices: same or different, got {choices!r}")
                print(f"== {count} session(s), {choices} choices", file=sys.stderr)
                cell = run_cell(count, choices, args.precomputed, args.server_cores)
                results["cells"][cell_name(cell)] = cell
                RESULTS.parent.mkdir(parents=True, exist_ok=True)
                RESULTS.write_text(json.dumps(results, indent=1))  # each cell kept as soon as it is measured
                print(json.dumps({k: v for k, v in cell.items() if k != "records"}, indent=1), file=sys.stderr)
    write_report(results, argv)
    if "dir" in _PRECOMPUTED:
        shutil.rmtree(_PRECOMPUTED["dir"], ignore_errors=True)  # the folder this run made, nothing else


if __name__ == "__main__":
    main()

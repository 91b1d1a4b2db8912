"""What every benchmark shares: the machine, side-by-side timing, peak memory, and the report file.

Timings on a shared machine are noisy, so benchmarks never report an absolute time on its own:
each compares two or more things measured *in turn within one run* (round robin), and reports the
median over rounds of the per-round ratio. Load that comes and goes hits every contender of a round
alike and cancels in the ratio.

Each script saves what it measured as ``docs/results/bench/NAME.json`` (``docs/results/curve/NAME.json``
for the quality curves of docs/REPRODUCTION.md) and writes its section of the document from that file
(between ``<!-- bench:NAME -->`` markers) with the command, the machine and the date, so one script can
be rerun alone; ``python -m bench.docs`` rewrites every section from the committed files and
tests/unit/project/test_docs_numbers.py fails when a section and its file disagree.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "BENCHMARKS.md"
REPRODUCTION = ROOT / "docs" / "REPRODUCTION.md"
RESULTS = ROOT / "docs" / "results"  # committed results files, one per generated block
SECTION_DOCS = {"bench": REPORT, "curve": REPRODUCTION}  # kind of section -> the document that holds it


def machine() -> str:
    """One line: CPU model, cores, torch threads, versions (what a reader needs to compare)."""
    import torch

    model = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except (OSError, subprocess.CalledProcessError, AttributeError):
        pass
    return (f"{model}, {os.cpu_count()} cores, torch {torch.__version__} with "
            f"{torch.get_num_threads()} threads, Python {platform.python_version()}")


def today() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def round_robin(contenders: dict[str, Callable[[], object]], rounds: int, warmup: bool = True
                ) -> dict[str, list[float]]:
    """Seconds of each contender per round, run in turn (a, b, c, a, b, c, ...)."""
    if warmup:
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return times


def ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of times[num] / times[den] (same-round pairs, robust to drifting load)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def median(values: list[float]) -> float:
    return statistics.median(values)


def vm_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS: resident now; VmHWM: peak since last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def measured(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(peak RSS growth in MiB, seconds, result) of ``fn()`` in this process (call it in a child).

    Resets the process's peak-RSS mark, runs ``fn`` and reports how far resident memory rose above
    where it was. Tensors come back as numpy arrays (they must cross a process boundary).
    """
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := RSS now
    base = vm_kib("VmRSS")
    started = time.perf_counter()
    result = fn()
    seconds, peak_kib = time.perf_counter() - started, vm_kib("VmHWM") - base
    if hasattr(result, "numpy"):
        result = result.detach().cpu().numpy()
    return peak_kib / 1024, seconds, result


# Fixed malloc thresholds: blocks of 128 KiB and more are always mapped and unmapped, so resident
# memory follows the memory actually in use (glibc's adaptive threshold would otherwise keep freed
# per-batch buffers on the heap, and the peak would creep up with the number of batches).
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _child(job, args, conn) -> None:
    conn.send(job(*args))
    conn.close()


def in_child(job: Callable, *args, timeout: float = 3600):
    """``job(*args)`` in a fresh (spawned) Python process; returns what it returns.

    A fresh process per measurement means memory freed by an earlier one cannot hide a later one,
    and nothing (thread pools, caches) leaks between contenders; its C library maps every large
    block on its own (``_MALLOC_ENV``), so resident memory tracks the memory in use. ``job`` must be a module-level
    function that loads what it needs and wraps the measured part in ``measured``.
    """
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(job, args, child))
    saved = {k: os.environ.get(k) for k in _MALLOC_ENV}
    os.environ.update(_MALLOC_ENV)  # read by the child's C library at start-up
    main = sys.modules.get("__main__")
    if getattr(job, "__module__", None) != "__main__":  # the child need not run whatever runs as main: under
        sys.modules["__main__"] = types.ModuleType("__main__")  # a test, an app script an AppTest ran there
    try:
        proc.start()
    finally:
        sys.modules["__main__"] = main
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    child.close()
    if not parent.poll(timeout):
        proc.kill()
        raise RuntimeError(f"benchmark child gave no answer in {timeout:.0f} s")
    result = parent.recv()
    proc.join()
    return result


ORDER = ["calibration_speed", "depth", "calibration_memory", "shared_eval", "overhead", "solve_width",
         "vs_official"]  # the order bench.all runs them in (a new section goes at the end of its document)


def command_line(name: str, argv: list[str] | None) -> str:
    """The command that reproduces this run: ``python -m bench.NAME`` plus the arguments given."""
    given = sys.argv[1:] if argv is None else argv
    return " ".join([f"python -m bench.{name}", *given])


def section_path(kind: str, name: str) -> Path:
    """The results file of one section: docs/results/<kind>/<name>.json."""
    return RESULTS / kind / f"{name}.json"


def render_section(record: dict) -> str:
    """A section's Markdown from its results file: title, the command that regenerates it, date, machine, body."""
    return (f"## {record['title']}\n\n`{record['command']}`, {record['date']}; {record['machine']}.\n\n"
            f"{record['body'].strip()}")


def save_section(kind: str, name: str, title: str, argv: list[str] | None, body: str) -> None:
    """Save one measurement as its results file and write its section of the document from it; print the body."""
    from ghosted.core.docblocks import markers, write_block

    record = {"title": title, "command": command_line(name, argv), "date": today(), "machine": machine(),
              "body": body.strip()}
    path = section_path(kind, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    doc = SECTION_DOCS[kind]
    write_block(doc, *markers(f"{kind}:{name}"), render_section(record), append=True)
    print(f"wrote {path.relative_to(ROOT)} and its section of {doc.relative_to(ROOT)}", file=sys.stderr)
    print(body)


def write_section(name: str, title: str, argv: list[str] | None, body: str) -> None:
    """This benchmark's section of docs/BENCHMARKS.md (``argv``: the run's arguments), through its results file."""
    save_section("bench", name, title, argv, body)


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table; floats get 3 significant digits."""
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def session_fit(lm, drop: str, methods: list[str], fit, held=None, cache=None, **settings):
    """``methods`` fitted with ``drop`` removed on calibration windows the bench drew (``fit``, ``held``),
    through a ``Session`` on the default spec with ``settings`` (its flat names, e.g. ``rank=64``), the one
    place that calls ``recover``; ``cache``: a ``StatsCache`` of the bench's own (None: no statistics
    cache). Returns the ``RecoveryRun`` (``.results[method].model``, ``.calib_seconds``, ...)."""
    from ghosted.experiments.session import CalibrationWindows, Session
    from ghosted.experiments.spec import ExperimentSpec

    session = Session(ExperimentSpec().with_options(cache=False, **settings), loaded=lm,
                      windows=CalibrationWindows(fit, held))
    session.cache = cache  # the bench's own folder, or none
    return session.fit(drop, methods).recovery


def load_bundled(warm_up: bool = True):
    """The bundled model (float32 on CPU), loaded once per benchmark process.

    ``warm_up`` runs one short pass, which faults every weight page in (safetensors maps the file
    lazily) so neither the first timed contender nor a peak-memory reading pays for reading them.
    """
    from ghosted.models.loading import load_model

    lm = load_model(device="cpu")
    if warm_up:
        warm(lm.model)
    return lm


def warm(model) -> None:
    """One forward pass over 8 tokens (pages the weights in, starts the thread pool)."""
    import torch

    with torch.no_grad():
        model(input_ids=torch.ones(1, 8, dtype=torch.long), use_cache=False)


def write_reproduction_section(name: str, title: str, argv: list[str] | None, body: str) -> None:
    """The ``<!-- curve:NAME -->`` section of docs/REPRODUCTION.md, through its results file.

    For measurements of quality (perplexity curves) rather than speed; same layout as ``write_section``.
    """
    save_section("curve", name, title, argv, body)

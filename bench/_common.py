"""What every benchmark shares: the machine, side-by-side timing, peak memory, and the report file.

Timings on a shared machine are noisy, so benchmarks never report an absolute time on its own:
each compares two or more things measured *in turn within one run* (round robin), and reports the
median over rounds of the per-round ratio. Load that comes and goes hits every contender of a round
alike and cancels in the ratio.

Each script writes its own section of ``docs/BENCHMARKS.md`` (between ``<!-- bench:NAME -->``
markers) with the command, the machine and the date, so one script can be rerun alone.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "BENCHMARKS.md"
HEADER = """# Benchmarks

Every number here is a **ratio of two things measured side by side in one run** (round robin; the
median over rounds of the per-round ratio), so it holds on a loaded machine. Absolute seconds are
given for orientation only. Each section names the command that regenerates it; `python -m
bench.all` reruns every section (about 15-25 minutes on 2 idle cores).
"""


def ensure_path() -> None:
    """Let ``python bench/NAME.py`` import ``ghosted`` and ``bench`` like ``python -m bench.NAME``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


def _peak_child(fn, args, conn) -> None:
    Path("/proc/self/clear_refs").write_text("5")  # reset this process's peak RSS to its RSS now
    base = vm_kib("VmRSS")
    started = time.perf_counter()
    result = fn(*args)
    seconds, peak = time.perf_counter() - started, vm_kib("VmHWM") - base
    if hasattr(result, "numpy"):  # tensors would travel as shared-memory handles that die with us
        result = result.detach().cpu().numpy()
    conn.send((peak, seconds, result))
    conn.close()


def peak_in_child(fn: Callable, *args) -> tuple[float, float, object]:
    """(peak RSS growth in MiB, seconds, result) of ``fn(*args)`` in a forked child.

    The child starts as a copy of this process (model already loaded), resets its peak-RSS mark,
    runs ``fn`` and reports how far its resident memory rose above where it started. Each call is
    a fresh process, so memory freed by an earlier measurement cannot hide a later one.
    """
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_peak_child, args=(fn, args, child))
    proc.start()
    child.close()
    kib, seconds, result = parent.recv()
    proc.join()
    if type(result).__module__ == "numpy":
        import torch

        result = torch.from_numpy(result)
    return kib / 1024, seconds, result


def write_section(name: str, title: str, command: str, body: str) -> None:
    """Replace (or append) this benchmark's section of docs/BENCHMARKS.md."""
    section = (f"<!-- bench:{name} -->\n## {title}\n\n`{command}`, {today()}; {machine()}.\n\n"
               f"{body.strip()}\n<!-- /bench:{name} -->")
    text = REPORT.read_text() if REPORT.exists() else HEADER
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)
    print(f"wrote section '{name}' of {REPORT.relative_to(ROOT)}", file=sys.stderr)


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table; floats get 3 significant digits."""
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def load_bundled():
    """The bundled model (float32 on CPU), loaded once per benchmark process and warmed up.

    The warm-up pass faults every weight page in (safetensors maps the file lazily), so neither the
    first timed contender nor a forked child's peak memory pays for reading the weights.
    """
    import torch

    from ghosted.loading import load_model

    lm = load_model(device="cpu")
    with torch.no_grad():
        lm.model(input_ids=torch.ones(1, 8, dtype=torch.long), use_cache=False)
    return lm

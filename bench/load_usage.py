"""What the load benchmark's server and browsers use, read from /proc: process trees, memory, CPU time.

``Usage`` samples a cell's server (its resident memory and CPU) and the browsers (their CPU) in a thread;
``wait_quiet`` waits until a server has finished its warm-up.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants, MiB (from /proc)."""
    total = 0
    for current in tree_pids(pid):
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        except (OSError, AttributeError):
            pass
    return total / 1024


def cpu_seconds_by_pid(pids: list[int]) -> dict[int, float]:
    """CPU time (user + system) used so far by each of ``pids``, seconds (from /proc)."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for proc in pids:
        try:
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
            out[proc] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return out


class Usage:
    """Samples every 0.5 s in a thread: the server tree's RSS (``peak``, MiB) and the CPU seconds of the
    server's and of the browsers' processes (``cpu_s(...)``; a process that ends keeps its last sample), so
    a cell says whether the server or the browsers sharing its cores used them."""

    def __init__(self, server_pid: int):
        self.pid, self.peak, self._stop = server_pid, 0.0, threading.Event()
        self._cpu: dict[str, dict[int, float]] = {"server": {}, "browsers": {}}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, tree_rss_mib(self.pid))
        server = tree_pids(self.pid)
        ours = set(tree_pids(os.getpid())) - set(server) - {os.getpid()}  # playwright's driver and chromium
        for side, pids in (("server", server), ("browsers", sorted(ours))):
            self._cpu[side].update(cpu_seconds_by_pid(pids))

    def cpu_s(self, side: str) -> float:
        return sum(self._cpu[side].values())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by a process and its descendants, seconds (from /proc)."""
    return sum(cpu_seconds_by_pid(tree_pids(pid)).values())


def wait_quiet(pid: int, window_s: float = 5.0, busy_share: float = 0.1, limit_s: float = 900.0) -> None:
    """Return once the server's process tree used under ``busy_share`` of one core over ``window_s``
    seconds (its warm-up jobs are done), or after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    before = tree_cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = tree_cpu_seconds(pid)
        if now - before < busy_share * window_s:
            return
        before = now

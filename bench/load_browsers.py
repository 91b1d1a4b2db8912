"""The load benchmark's browsers held back, so that rendering is not counted as the server's.

In a class the browsers run on the students' machines; here thirty chromium tabs share the server's two
cores. ``nice -n 19`` alone does not hold them back: chromium sets its own processes' priorities (as root it
raises some to -8), and with the kernel's autogroups enabled it starts in a session of its own, whose group
competes with the server's as an equal, whatever the nice values inside it. So the browsers go into a CPU
control group of their own with the weight the kernel gives nice 19 (15 of 1,024 under cgroup v1, 1 of 100
under cgroup v2): when the server computes, they get what it leaves. Where no group can be made (not root, no
cpu controller), they run at ``nice -n 19`` and the cell says so.

On a machine with more cores than the server should have (``--server-cores K``), the server is pinned to
the first K cores and the browsers to the others, as in a class where each browser has its own machine.
"""

from __future__ import annotations

import shlex
from pathlib import Path

NICE_19_SHARES = 15  # cgroup v1 cpu.shares equal to the kernel's weight of nice 19 (nice 0 is 1,024)
NICE_19_WEIGHT = 1  # cgroup v2 cpu.weight closest to nice 19 (nice 0 is 100)
V1_CPU = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")


def cpu_group(name: str) -> tuple[Path, str] | None:
    """Make the CPU group ``name`` at nice 19's weight; (its cgroup.procs file, how it is set) or None."""
    for parent, knob, value, words in ((V1_CPU, "cpu.shares", NICE_19_SHARES, "cgroup v1 cpu.shares 15 of 1,024"),
                                       (V2_ROOT, "cpu.weight", NICE_19_WEIGHT, "cgroup v2 cpu.weight 1 of 100")):
        if not (parent / "cgroup.procs").exists() or (knob == "cpu.weight" and not _v2_has_cpu(parent)):
            continue
        group = parent / name
        try:
            group.mkdir(exist_ok=True)
            (group / knob).write_text(str(value))
        except OSError:
            continue
        return group / "cgroup.procs", words
    return None


def _v2_has_cpu(root: Path) -> bool:
    try:
        return "cpu" in (root / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def remove_group(procs: Path) -> None:
    """Remove the group this benchmark made, once its browsers have exited (an empty group only)."""
    try:
        procs.parent.rmdir()
    except OSError:
        pass


def split_cores(server_cores: int | None, available: list[int]) -> tuple[list[int], list[int]] | None:
    """(the server's cores, the browsers' cores): the first ``server_cores`` and the rest; None to share all."""
    if server_cores is None:
        return None
    if not 1 <= server_cores < len(available):
        raise SystemExit(f"--server-cores: between 1 and {len(available) - 1} on this machine "
                         f"({len(available)} cores), got {server_cores}")
    return available[:server_cores], available[server_cores:]


def low_priority_browser(folder: Path, chromium: str, group: tuple[Path, str] | None,
                         cores: list[int] | None = None) -> tuple[str, str]:
    """A chromium launcher that joins ``group`` (its children follow), runs at ``nice -n 19`` and, given
    ``cores``, only on those.

    Returns (the launcher's path, how the browsers were held back, in words for the results)."""
    join = f"echo $$ > {shlex.quote(str(group[0]))} 2>/dev/null || true\n" if group else ""
    pin = f"taskset -c {','.join(map(str, cores))} " if cores else ""
    launcher = folder / "chromium-low-priority"
    launcher.write_text(f"#!/bin/sh\n{join}exec {pin}nice -n 19 {shlex.quote(chromium)} \"$@\"\n")
    launcher.chmod(0o755)
    words = f"{group[1]} (nice 19's weight)" if group else "nice 19 only (no CPU group)"
    return str(launcher), words + (f", on {len(cores)} cores of their own" if cores else "")

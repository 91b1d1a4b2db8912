"""The load benchmark's own parts: what it measures of the server and the browsers, and its report."""

import json
import os
import subprocess
import sys
import time

import pytest

from bench.load import busy_page_runs
from bench.load_browsers import cpu_group, low_priority_browser, remove_group, split_cores
from bench.load_usage import Usage, cpu_seconds_by_pid, tree_pids
from bench.load_report import cell_name, cores_text, cpu_text, report_table


def test_usage_counts_the_server_tree_apart_from_the_rest(tmp_path):
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    server = subprocess.Popen([sys.executable, "-c", busy])
    try:
        usage = Usage(server.pid)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and usage.cpu_s("server") < 0.25:
            usage.sample()
            time.sleep(0.1)
        assert usage.cpu_s("server") >= 0.25  # the busy child is the server
        assert server.pid in tree_pids(server.pid) and os.getpid() not in tree_pids(server.pid)
        assert usage.peak > 0
    finally:
        server.kill()
        server.wait()


def test_cpu_seconds_skip_processes_that_are_gone():
    assert cpu_seconds_by_pid([os.getpid(), 2**22 + 1]).keys() == {os.getpid()}


def test_the_browser_launcher_joins_the_group_and_runs_niced(tmp_path):
    procs = tmp_path / "cgroup.procs"
    launcher, words = low_priority_browser(tmp_path, "/bin/sh", (procs, "a group"))
    out = subprocess.run([launcher, "-c", "echo $$; ps -o ni= -p $$"], capture_output=True, text=True, check=True)
    pid, nice = out.stdout.split()
    assert nice == "19" and procs.read_text().strip() == pid  # exec keeps the pid: chromium is in the group
    assert "a group" in words
    assert low_priority_browser(tmp_path, "/bin/sh", None)[1] == "nice 19 only (no CPU group)"


def test_the_cpu_group_gets_nice_19s_weight(tmp_path, monkeypatch):
    (tmp_path / "cgroup.procs").touch()
    monkeypatch.setattr("bench.load_browsers.V1_CPU", tmp_path)
    procs, words = cpu_group("browsers")
    assert procs == tmp_path / "browsers" / "cgroup.procs"
    assert (tmp_path / "browsers" / "cpu.shares").read_text() == "15" and "15 of 1,024" in words
    remove_group(procs)  # only an empty group goes; here the fake one holds cpu.shares, so it stays
    assert (tmp_path / "browsers").exists()


def test_the_report_gives_cpu_only_for_cells_that_measured_it():
    cell = {"sessions": 1, "choices": "same", "precomputed": True, "influence": {"median_s": 5, "p95_s": 5},
            "recovered": {"median_s": 4, "p95_s": 4}, "compared": {"median_s": 3, "p95_s": 3},
            "total": {"median_s": 12, "p95_s": 12}, "page_switch": {"count": 0}, "saw_queue_place": 0,
            "errors": 0, "server_peak_mib": 1700.0, "jobs": {}, "wall_s": 12.0, "job_seconds": 0, "cores": 2}
    assert cpu_text(cell) == "-"
    measured = {**cell, "server_cpu_s": 20.4, "browser_cpu_s": 6.2}
    assert cpu_text(measured) == "20 / 6"
    assert "20 / 6" in report_table({"cells": {"a": measured}})


def test_page_runs_count_only_while_a_job_ran_after_the_class_arrived(tmp_path):
    jobs, pages = tmp_path / "jobs.jsonl", tmp_path / "pages.jsonl"
    jobs.write_text("\n".join(json.dumps(j) for j in [{"seconds": 10.0, "ended": 110.0},   # ran 100-110
                                                      {"seconds": None, "ended": 120.0}]))  # cancelled in the queue
    pages.write_text("\n".join(json.dumps({"page": "Model", "started": t, "seconds": s})
                               for t, s in [(90.0, 9.0), (101.0, 0.2), (105.0, 0.4), (111.0, 5.0), (119.0, 7.0)]))
    runs = busy_page_runs(pages, jobs, since=95.0)
    assert runs["count"] == 2 and runs["median_s"] == pytest.approx(0.3)
    assert busy_page_runs(pages, tmp_path / "none.jsonl", since=0.0)["count"] == 0


def test_cores_split_between_the_server_and_the_browsers():
    assert split_cores(None, [0, 1]) is None
    assert split_cores(2, list(range(16))) == ([0, 1], list(range(2, 16)))
    with pytest.raises(SystemExit, match="between 1 and 1"):
        split_cores(2, [0, 1])


def test_the_launcher_pins_the_browser_to_its_cores(tmp_path):
    launcher, words = low_priority_browser(tmp_path, "/bin/sh", None, cores=[0])
    out = subprocess.run([launcher, "-c", "grep Cpus_allowed_list /proc/self/status"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split()[-1] == "0" and "1 cores of their own" in words


def test_the_report_names_where_the_server_and_browsers_ran():
    assert cores_text({"cores": 2}) == "2 shared"
    assert cores_text({"cores": 16, "server_cores": 2}) == "2 / 14"
    assert cell_name({"sessions": 30, "choices": "same", "precomputed": True, "server_cores": 2}) == \
        "30-same-precomputed-server-on-2-cores"

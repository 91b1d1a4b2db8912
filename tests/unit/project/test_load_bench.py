"""The load benchmark's own parts: what it measures of the server and the browsers, and its report."""

import json
import os
import subprocess
import sys
import time

import pytest

from bench.load_logs import answer_times, busy_page_runs, told
from bench.load_browsers import cpu_group, low_priority_browser, remove_group, split_cores
from bench.load_usage import Usage, cpu_seconds_by_pid, tree_pids
from bench.load_report import (answer_text, cell_name, cores_text, cpu_text, estimate_text, report_table,
                               saw_text)


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


def test_what_waiting_sessions_were_told_comes_from_the_page_log(tmp_path):
    def event(kind, owner, at, **fields):
        return {"event": kind, "owner": owner, "key": fields.pop("key", "fit-1"), "time": at, **fields}

    pages = tmp_path / "pages.jsonl"
    lines = [{"page": "Model", "started": 100.0, "seconds": 0.1},  # a page run: not an event
             event("asked", "early", 50.0, state="queued"),  # before the class arrived
             event("asked", "a", 100.0, state="queued"),
             event("panel", "a", 101.0, state="queued", position=2, wait_s=30.0),
             event("panel", "a", 102.0, state="running", position=0, wait_s=20.0),
             event("answered", "a", 121.0),
             event("asked", "b", 100.0, state="running"),
             event("panel", "b", 101.0, state="running", position=0, wait_s=None),
             event("answered", "b", 110.0),
             event("asked", "c", 100.0, state="done"),  # answered from the store: never waited
             event("asked", "d", 100.0, state="queued"),  # quick: answered before a panel was drawn
             event("answered", "d", 101.5),
             event("asked", "e", 100.0, state="queued"),  # waited with no panel: silent
             event("answered", "e", 140.0)]
    pages.write_text("\n".join(json.dumps(line) for line in lines))
    said = told(pages, since=90.0)
    assert (said["waited"], said["panel"], said["place"], said["silent"]) == (4, 2, 1, 1)
    assert said["estimate"]["median_s"] == 30.0 and said["actual"]["median_s"] == 20.0  # a: told 30, waited 20
    cell = {"sessions": 5, "told": said}
    assert saw_text(cell) == "2 / 1 of 4, 1 silent" and estimate_text(cell) == "30 / 20 (1 waits)"
    assert saw_text({"sessions": 5, "told": {**said, "waited": 0}}) == "none waited"


def test_the_servers_part_of_a_step_runs_from_the_first_ask_to_the_answer(tmp_path):
    pages = tmp_path / "pages.jsonl"
    lines = [{"event": "asked", "owner": "a", "key": "fit-1", "kind": "fit", "state": "queued", "time": 100.0},
             {"event": "asked", "owner": "a", "key": "fit-1", "kind": "fit", "state": "running", "time": 105.0},
             {"event": "answered", "owner": "a", "key": "fit-1", "time": 130.0},
             {"event": "asked", "owner": "b", "key": "fit-1", "kind": "fit", "state": "done", "time": 131.0},
             {"event": "answered", "owner": "b", "key": "fit-1", "time": 131.5},
             {"event": "asked", "owner": "b", "key": "evaluate-1", "kind": "evaluate", "state": "queued",
              "time": 140.0}]  # never answered: no time
    pages.write_text("\n".join(json.dumps(line) for line in lines))
    times = answer_times(pages, since=90.0)
    assert times["fit"]["count"] == 2 and times["fit"]["p95_s"] == 30.0 and "evaluate" not in times
    assert answer_text({"server_answer": times}) == "15 / 30; -" and answer_text({}) == "-"


def test_page_runs_leave_out_the_events_of_the_page_log(tmp_path):
    jobs, pages = tmp_path / "jobs.jsonl", tmp_path / "pages.jsonl"
    jobs.write_text(json.dumps({"seconds": 10.0, "ended": 110.0}))
    pages.write_text("\n".join(json.dumps(line) for line in [{"page": "Model", "started": 101.0, "seconds": 0.2},
                                                               {"event": "panel", "time": 102.0, "owner": "a"}]))
    assert busy_page_runs(pages, jobs, since=95.0)["count"] == 1


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

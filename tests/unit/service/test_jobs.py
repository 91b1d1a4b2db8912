"""The job queue: a fixed pool of workers, de-duplication, places and estimates, cancellation, owners leaving.

Jobs here are plain functions held at a gate (a ``threading.Event``), so every order is decided by the test,
never by timing; the clock of the estimates is a fake one.
"""

from __future__ import annotations

import threading

import pytest

from ghosted.service.jobs import JobCancelled, JobQueue, default_threads, default_workers
from ghosted.service.store import ResultStore

WAIT = 30  # seconds a test waits for a worker before failing (never reached when the queue works)


class Gate:
    """A job that says it started, waits until opened, then returns ``value`` (or keeps reporting progress)."""

    def __init__(self, value):
        self.value, self.started, self.opened, self.calls = value, threading.Event(), threading.Event(), 0

    def __call__(self, progress):
        self.calls += 1
        self.started.set()
        while not self.opened.wait(0.01):
            progress("working", 0, 1)  # where a cancelled job stops
        progress("working", 1, 1)
        return self.value


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_job_runs_and_its_result_goes_to_the_store():
    queue = JobQueue(workers=1)
    job = Gate("report")
    first = queue.submit("k1", "influence", job, "alice")
    assert first.state in ("queued", "running") and not first.finished
    job.opened.set()
    done = queue.wait("k1", WAIT)
    assert done.state == "done" and done.result == "report"
    assert queue.store.get("k1") == "report"
    assert queue.submit("k1", "influence", Gate("again"), "bob").result == "report"  # answered from the store


def test_identical_requests_share_one_job():
    queue = JobQueue(workers=1)
    job, twin = Gate("x"), Gate("y")
    queue.submit("same", "fit", job, "alice")
    second = queue.submit("same", "fit", twin, "bob")
    assert second.shared_with == 1
    job.opened.set()
    assert queue.wait("same", WAIT).result == "x"
    assert job.calls == 1 and twin.calls == 0


def test_places_in_the_queue_and_the_wait_estimate_from_past_durations():
    clock = FakeClock()
    queue = JobQueue(workers=1, clock=clock)
    first = Gate(1)
    queue.submit("a", "fit", first, "s1")
    assert first.started.wait(WAIT)
    clock.now = 10.0
    first.opened.set()
    queue.wait("a", WAIT)
    assert queue.expected_s("fit") == 10.0

    running, queued = Gate(2), Gate(3)
    queue.submit("b", "fit", running, "s1")
    assert running.started.wait(WAIT)
    clock.now = 14.0  # b has run 4 of its expected 10 seconds
    behind = queue.submit("c", "fit", queued, "s2")
    assert behind.state == "queued" and behind.position == 1
    assert behind.wait_s == pytest.approx(6.0 + 10.0)
    assert queue.status("b", "s1").position == 0 and queue.status("b", "s1").wait_s == pytest.approx(6.0)
    assert queue.submit("d", "evaluate", Gate(4), "s3").wait_s is None  # no evaluation measured yet
    running.opened.set()
    queued.opened.set()
    assert queue.wait("c", WAIT).state == "done"
    queue.cancel("d", "s3")


def test_an_untimed_job_gives_a_first_estimate_and_no_more():
    """A server's warm-up runs while the server starts: its durations would make every estimate too long, so
    they stand in only until a job of the same kind was timed."""
    clock = FakeClock()
    queue = JobQueue(workers=1, clock=clock)
    for key, timed, seconds in (("warm", False, 50.0), ("class", True, 10.0)):
        gate = Gate(key)
        queue.submit(key, "fit", gate, "s1", timed=timed)
        assert gate.started.wait(WAIT)
        clock.now += seconds
        gate.opened.set()
        assert queue.wait(key, WAIT).state == "done"
        assert queue.expected_s("fit") == (50.0 if not timed else 10.0)  # then the warm-up's 50 s no longer counts


def test_cancel_drops_a_queued_job_and_stops_a_running_one():
    queue = JobQueue(workers=1)
    running, queued = Gate("r"), Gate("q")
    queue.submit("run", "fit", running, "alice")
    assert running.started.wait(WAIT)
    queue.submit("wait", "fit", queued, "bob")
    queue.cancel("wait", "bob")
    assert queue.status("wait").state == "cancelled" and queued.calls == 0
    queue.cancel("run", "alice")
    ended = queue.wait("run", WAIT)
    assert ended.state == "cancelled" and isinstance(ended.error, JobCancelled)
    assert queue.store.get("run") is None


def test_a_shared_job_goes_on_while_one_owner_still_waits():
    queue = JobQueue(workers=1)
    job = Gate("kept")
    queue.submit("k", "fit", job, "alice")
    queue.submit("k", "fit", job, "bob")
    queue.cancel("k", "alice")
    job.opened.set()
    assert queue.wait("k", WAIT).result == "kept"


def test_an_owner_that_leaves_gives_up_its_place():
    gone = set()
    queue = JobQueue(workers=1, alive=lambda owner: owner not in gone)
    blocker, abandoned, kept = Gate("b"), Gate("a"), Gate("k")
    queue.submit("b", "fit", blocker, "alice")
    assert blocker.started.wait(WAIT)
    queue.submit("a", "fit", abandoned, "bob")
    queue.submit("k", "fit", kept, "carol")
    assert queue.status("k", "carol").position == 2
    queue.leave("bob")
    assert queue.status("k", "carol").position == 1
    queue.submit("a2", "fit", Gate("x"), "dave")
    gone.add("dave")  # closed the tab without a word: dropped when its turn comes
    blocker.opened.set()
    kept.opened.set()
    assert queue.wait("k", WAIT).state == "done"
    assert queue.wait("a2", WAIT).state == "cancelled"
    assert abandoned.calls == 0


def test_a_failure_is_kept_for_its_owner_and_a_new_submit_runs_again():
    queue = JobQueue(workers=1)

    def broken(progress):
        raise ValueError("Choose at least one criterion.")

    queue.submit("bad", "influence", broken, "alice")
    failed = queue.wait("bad", WAIT)
    assert failed.state == "failed" and str(failed.error) == "Choose at least one criterion."
    fixed = Gate("ok")
    fixed.opened.set()
    queue.submit("bad", "influence", fixed, "alice")
    assert queue.wait("bad", WAIT).result == "ok"


def test_workers_run_jobs_side_by_side():
    queue = JobQueue(workers=2, threads_per_job=1)
    first, second = Gate(1), Gate(2)
    queue.submit("one", "fit", first, "a")
    queue.submit("two", "fit", second, "b")
    assert first.started.wait(WAIT) and second.started.wait(WAIT)  # both running, neither finished
    first.opened.set()
    second.opened.set()
    assert queue.wait("one", WAIT).state == queue.wait("two", WAIT).state == "done"


def test_default_workers_from_cores_and_environment(monkeypatch):
    monkeypatch.delenv("GHOSTED_JOB_WORKERS", raising=False)
    assert default_workers(cores=2) == 2  # one thread per job by default
    assert default_workers(cores=2, threads_per_job=2) == 1
    assert default_workers(cores=16, threads_per_job=2) == 8
    assert default_workers(cores=1, threads_per_job=4) == 1
    monkeypatch.setenv("GHOSTED_JOB_WORKERS", "3")
    assert default_workers(cores=2) == 3
    monkeypatch.setenv("GHOSTED_JOB_WORKERS", "many")
    with pytest.raises(ValueError, match="GHOSTED_JOB_WORKERS"):
        default_workers()


def test_one_torch_thread_per_job_unless_told(monkeypatch):
    monkeypatch.delenv("GHOSTED_JOB_THREADS", raising=False)
    assert default_threads() == 1 and JobQueue(workers=1).threads_per_job == 1
    monkeypatch.setenv("GHOSTED_JOB_THREADS", "2")
    assert JobQueue(workers=1).threads_per_job == 2
    monkeypatch.setenv("GHOSTED_JOB_THREADS", "0")
    with pytest.raises(ValueError, match="GHOSTED_JOB_THREADS"):
        default_threads()


def test_the_store_shared_by_the_queue_is_the_one_given():
    store = ResultStore(max_entries=2)
    queue = JobQueue(store, workers=1)
    job = Gate("v")
    job.opened.set()
    queue.submit("k", "fit", job, "a")
    queue.wait("k", WAIT)
    assert store.get("k") == "v"


def test_every_ended_job_is_logged_one_json_line_each(tmp_path):
    import json

    log = tmp_path / "jobs.jsonl"
    queue = JobQueue(workers=1, log=str(log))
    done = Gate("report")
    queue.submit("k1", "influence", done, "alice")
    done.opened.set()
    assert queue.wait("k1", WAIT).state == "done"

    def broken(progress):
        raise ValueError("a bad setting")

    queue.submit("k2", "fit", broken, "bob")
    assert queue.wait("k2", WAIT).state == "failed"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["key"], e["kind"], e["state"], e["owners"]) for e in lines] == [
        ("k1", "influence", "done", 1), ("k2", "fit", "failed", 1)]
    assert all(e["seconds"] >= 0 for e in lines)


def test_an_unwritable_job_log_warns_once_and_the_jobs_go_on(tmp_path):
    queue = JobQueue(workers=1, log=str(tmp_path / "missing" / "jobs.jsonl"))
    job = Gate("x")
    queue.submit("k", "fit", job, "alice")
    with pytest.warns(RuntimeWarning, match="Could not write the log .*jobs.jsonl"):
        job.opened.set()
        assert queue.wait("k", WAIT).state == "done"
    assert queue.log is None and queue.store.get("k") == "x"


def test_a_visitor_has_at_most_the_deployments_jobs_at_once_and_joining_one_is_free():
    from ghosted.service.jobs import JobRefused

    queue = JobQueue(workers=1, max_owner_jobs=2)
    gates = [Gate(i) for i in range(3)]
    queue.submit("a", "fit", gates[0], "alice")
    queue.submit("b", "fit", gates[1], "alice")
    with pytest.raises(JobRefused, match="already have 2 jobs queued or running"):
        queue.submit("c", "fit", gates[2], "alice")
    assert queue.owner_jobs("alice") == ["a", "b"]
    queue.submit("c", "fit", gates[2], "bob")  # another visitor is not held back
    queue.submit("c", "fit", gates[2], "alice")  # joining bob's job takes no new place
    queue.cancel("b", "alice")  # a superseded request gives its place back
    queue.cancel("c", "alice")
    queue.submit("d", "fit", Gate("d"), "alice")
    for gate in gates:
        gate.opened.set()
    assert queue.wait("a", WAIT).state == "done"


def test_an_ended_job_keeps_its_message_but_not_its_traceback_or_its_work():
    import gc
    import weakref

    class Tensorish:
        pass

    held = Tensorish()
    alive = weakref.ref(held)

    def work(progress, big=held):
        local = big  # noqa: F841 - a frame that would keep it alive through a traceback
        raise RuntimeError("out of luck")

    queue = JobQueue(workers=1)
    queue.submit("k", "fit", work, "alice")
    del held, work
    ended = queue.wait("k", WAIT)
    gc.collect()
    assert ended.state == "failed" and str(ended.error) == "out of luck"
    assert ended.error.__traceback__ is None and alive() is None


def test_a_store_that_cannot_write_keeps_the_worker_and_says_so_once(tmp_path):
    import json

    from ghosted.service.store import Codec

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")  # as a read-only results folder: every write fails
    store = ResultStore(folder=blocked, codecs={"fit": Codec(lambda v: {"v": v}, lambda d: d["v"])})
    queue = JobQueue(store, workers=1)
    with pytest.warns(RuntimeWarning, match="kept in memory only from now on") as warned:
        for i in range(3):
            queue.submit(f"fit-{i}", "fit", lambda progress, i=i: i, "alice")
            assert queue.wait(f"fit-{i}", WAIT).state == "done"
    assert len([w for w in warned if "memory only" in str(w.message)]) == 1
    assert store.get("fit-2") == 2 and store.write_failure and json.dumps(store.write_failure)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the death is the point
def test_a_worker_that_dies_is_replaced_and_its_job_ends_as_failed(monkeypatch):
    queue = JobQueue(workers=1)
    original = queue._run

    def dying(job):
        if job.key == "doomed":
            raise SystemExit("the worker's thread stops")  # escapes the job's guard: the worker dies
        original(job)

    monkeypatch.setattr(queue, "_run", dying)
    queue.submit("doomed", "fit", lambda progress: 1, "alice")
    assert queue.wait("doomed", WAIT).state == "failed"
    queue.submit("next", "fit", lambda progress: 2, "alice")
    assert queue.wait("next", WAIT).state == "done" and queue.store.get("next") == 2


def test_a_visitors_jobs_together_stay_within_the_visitors_memory_budget():
    from ghosted.service.jobs import JobRefused

    queue = JobQueue(workers=1, max_owner_gb=6.0)
    gates = [Gate(i) for i in range(3)]
    queue.submit("a", "evaluate", gates[0], "alice", gb=4.0)
    with pytest.raises(JobRefused, match=r"about 4.0 GB and this one 2.5 GB more, over the 6 GB"):
        queue.submit("b", "evaluate", gates[1], "alice", gb=2.5)
    queue.submit("b", "evaluate", gates[1], "bob", gb=2.5)  # the budget is each visitor's own
    queue.submit("c", "fit", gates[2], "alice", gb=1.5)
    for gate in gates:
        gate.opened.set()
    assert [queue.wait(k, WAIT).state for k in "abc"] == ["done"] * 3
    queue.submit("d", "evaluate", lambda progress: "d", "alice", gb=5.0)  # the ended ones no longer count
    assert queue.wait("d", WAIT).state == "done"

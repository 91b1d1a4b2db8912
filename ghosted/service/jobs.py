"""One queue for the heavy work of every session: a set number of workers, no fight over the cores.

On a small shared server (a 2-vCPU demo, a classroom machine) eight influence passes started at once in
one process each get a quarter of a core and all finish late. Here every heavy job (an influence report,
a calibration and fit, an evaluation) goes through one ``JobQueue``:

  * a set number of worker threads (by default one per core, ``default_workers``), each job running with
    ``threads_per_job`` torch threads (by default one, ``default_threads``), so the jobs that run get whole
    cores and never wait on each other's threads;
  * a job is named by its request key (``ghosted.service.store.request_key``): a request identical
    to one already queued or running joins it instead of starting again (in-flight de-duplication), and
    one whose result is in the ``ResultStore`` is answered at once;
  * every waiting owner (a browser session) sees its place in the queue and an estimate of the wait,
    from the measured durations of past jobs of the same kind; an owner can cancel, and an owner that
    is gone (``alive(owner)`` false) gives its place up: a job no one waits for any more is dropped
    (queued) or stopped at its next progress call (running);
  * a job reports progress through the library's protocol (``ghosted.core.progress``); the queue keeps
    the last call for display and raises ``JobCancelled`` there when the job is cancelled.

The caller never blocks on someone else's job: ``submit`` returns at once, ``status`` is a snapshot to
poll (the app polls it from a fragment), ``wait`` is for scripts and tests.

Example:
    >>> queue = JobQueue(store, workers=1)
    >>> queue.submit(key, "influence", lambda progress: influence(model, windows, progress=progress), "me")
    >>> queue.status(key, "me").position      # 0 = running now, 1 = next, ...
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ghosted.core import eventlog
from ghosted.service.store import ResultStore

_LOG = logging.getLogger(__name__)
HISTORY = 20  # durations kept per kind of job for the wait estimate
ENDED_KEPT = 256  # failed or cancelled jobs remembered, so their owners can read why
ALIVE_CHECK_S = 2.0  # how often a running job asks whether anyone still waits for it


def _bare(error: BaseException | None) -> BaseException | None:
    """``error`` without its traceback and the exceptions chained to it: its type and message only."""
    if error is not None:
        error.__traceback__ = error.__context__ = error.__cause__ = None
    return error


class JobRefused(ValueError):
    """A job the queue does not take from this owner now; the message says why and what to do."""


class JobCancelled(Exception):
    """Raised inside a job's progress call when every owner cancelled it or left."""


def default_threads() -> int:
    """Torch threads per job: ``$GHOSTED_JOB_THREADS``, else 1. One thread per job and one job per core: on a
    shared or oversubscribed CPU a team of threads waits at every barrier for its slowest member, which on a
    loaded 2-core machine made a calibration pass several times slower with two threads than with one."""
    env = os.environ.get("GHOSTED_JOB_THREADS", "").strip()
    if env and (not env.isdigit() or int(env) < 1):
        raise ValueError(f"GHOSTED_JOB_THREADS must be a whole number of at least 1, got {env!r}.")
    return int(env) if env else 1


def default_log() -> str | None:
    """Where every ended job is logged, one JSON line each (``$GHOSTED_JOB_LOG``), or None: an operator's
    record of what a class asked for and how long it took (``bench/load.py`` reads it)."""
    return eventlog.log_path("GHOSTED_JOB_LOG")


def default_workers(cores: int | None = None, threads_per_job: int = 1) -> int:
    """Workers the cores allow: one per ``threads_per_job`` cores (``$GHOSTED_JOB_WORKERS`` overrides)."""
    env = os.environ.get("GHOSTED_JOB_WORKERS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"GHOSTED_JOB_WORKERS must be a whole number of at least 1, got {env!r}.")
        return int(env)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, threads_per_job))


@dataclass(frozen=True)
class JobStatus:
    """What one owner sees of a job: where it is, how long it may take, what it is doing, how it ended."""

    key: str
    kind: str
    state: str  # "queued", "running", "done", "failed" or "cancelled"
    position: int = 0  # jobs ahead in the queue (0 when running or finished)
    wait_s: float | None = None  # estimated seconds until it is done; None before any job of its kind ended
    stage: str = ""  # the last progress stage
    done: int = 0  # steps of ``stage`` done
    total: int = 0  # steps of ``stage`` in all (0: a message, or nothing reported yet)
    elapsed_s: float = 0.0  # seconds it has been running
    shared_with: int = 0  # other owners waiting for the same job
    result: object = None  # the result, once done (read-only: it is shared)
    error: BaseException | None = None  # why it failed

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")


@dataclass
class _Job:
    key: str
    kind: str
    work: Callable | None  # work(progress) -> result; None once the job ended (nothing of it kept alive)
    owners: set = field(default_factory=set)
    state: str = "queued"
    progress: tuple = ("", 0, 0)  # the last (stage, done, total)
    started: float | None = None
    error: BaseException | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    alive_checked: float = 0.0
    timed: bool = True  # its duration feeds the wait estimates (not a server's warm-up job)
    gb: float = 0.0  # estimated peak memory (ghosted.service.cost), counted against its owners' bound


class JobQueue:
    """Heavy jobs of every session through a fixed pool of worker threads, results into ``store``."""

    def __init__(self, store: ResultStore | None = None, workers: int | None = None, threads_per_job: int | None = None,
                 alive: Callable[[str], bool] | None = None, clock: Callable[[], float] = time.monotonic,
                 log: str | None = None, max_owner_jobs: int | None = None, max_owner_gb: float | None = None):
        self.max_owner_jobs = max_owner_jobs  # jobs one owner may have queued or running; None: any number
        self.max_owner_gb = max_owner_gb  # estimated memory of those jobs together; None: no bound
        self.store = store if store is not None else ResultStore()
        self.threads_per_job = max(1, threads_per_job or default_threads())  # torch threads each job runs with
        self.workers = workers or default_workers(threads_per_job=self.threads_per_job)
        self.alive = alive  # owner -> still there? None: every owner stays until it cancels or leaves
        self._clock = clock
        self.log = log or default_log()  # a file that gets one JSON line per ended job; None: no log
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}  # queued and running
        self._waiting: deque[str] = deque()  # queued keys, first in first out
        self._ended: OrderedDict[str, _Job] = OrderedDict()  # failed or cancelled, newest last
        self._durations: dict[str, deque] = {}  # kind -> seconds of its last jobs
        self._untimed: dict[str, deque] = {}  # kind -> seconds of its last untimed jobs (the warm-up's)
        self._threads: list[threading.Thread] = []

    # --- what a session calls -----------------------------------------------------------------------

    def submit(self, key: str, kind: str, work: Callable, owner: str, timed: bool = True, gb: float = 0.0
               ) -> JobStatus:
        """Queue ``work(progress)`` under ``key`` for ``owner``; joins an identical job, or answers from
        the store. Returns at once. ``timed=False``: its duration is left out of the wait estimates (a
        server's warm-up, which runs while the server starts and would make every estimate too long). ``gb``:
        the job's estimated memory (``ghosted.service.cost``), counted against its owner's ``max_owner_gb``."""
        if (result := self.store.get(key)) is not None:
            return JobStatus(key, kind, "done", result=result)
        with self._cond:
            job = self._jobs.get(key)
            if job is None:
                self._check_owner_jobs(owner, gb)
                self._ended.pop(key, None)
                job = self._jobs[key] = _Job(key, kind, work, timed=timed, gb=gb)
                self._waiting.append(key)
                self._start_workers()
                self._cond.notify()
            job.cancelled.clear()  # someone waits for it again (a job already stopping still ends cancelled)
            job.owners.add(owner)
            return self._status(job, owner)

    def owner_jobs(self, owner: str) -> list[str]:
        """The keys of the queued and running jobs ``owner`` waits for."""
        with self._cond:
            return [key for key, job in self._jobs.items() if owner in job.owners]

    def _check_owner_jobs(self, owner: str, gb: float) -> None:
        """Refuse a new job of an owner that already waits for ``max_owner_jobs``, or whose jobs' estimated
        memory would pass ``max_owner_gb`` with it (joining an existing job is free)."""
        mine = [job for job in self._jobs.values() if owner in job.owners]
        if self.max_owner_jobs is not None and len(mine) >= self.max_owner_jobs:
            raise JobRefused(f"You already have {len(mine)} jobs queued or running, the most one visitor may "
                             f"have here: cancel one or wait for it to end.")
        held = sum(job.gb for job in mine)
        if self.max_owner_gb is not None and held + gb > self.max_owner_gb:
            raise JobRefused(f"Your jobs queued or running need about {held:,.1f} GB and this one {gb:,.1f} GB more, "
                             f"over the {self.max_owner_gb:g} GB one visitor may use here: wait for one to end.")

    def status(self, key: str, owner: str | None = None) -> JobStatus | None:
        """A snapshot of ``key``'s job (None when the queue and the store know nothing of it)."""
        with self._cond:
            job = self._jobs.get(key) or self._ended.get(key)
            if job is not None:
                return self._status(job, owner)
        result = self.store.get(key)
        return None if result is None else JobStatus(key, key.split("-")[0], "done", result=result)

    def cancel(self, key: str, owner: str) -> None:
        """``owner`` stops waiting for ``key``; the job is dropped when no one else waits for it."""
        with self._cond:
            job = self._jobs.get(key)
            if job is not None:
                job.owners.discard(owner)
                if not job.owners:
                    self._drop(job)

    def leave(self, owner: str) -> None:
        """``owner`` is gone (a closed browser tab): it gives up its place in every job."""
        with self._cond:
            for job in list(self._jobs.values()):
                job.owners.discard(owner)
                if not job.owners:
                    self._drop(job)

    def wait(self, key: str, timeout: float | None = None) -> JobStatus | None:
        """Block until ``key``'s job ends (scripts and tests; a page polls ``status`` instead)."""
        with self._cond:
            job = self._jobs.get(key)
        if job is not None:
            job.ended.wait(timeout)
        return self.status(key)

    def expected_s(self, kind: str) -> float | None:
        """The median duration of the last jobs of ``kind`` (the warm-up's until a timed one ended), None
        before the first one ended."""
        with self._cond:
            return self._expected().get(kind)

    # --- inside ------------------------------------------------------------------------------------

    def _status(self, job: _Job, owner: str | None) -> JobStatus:
        position = list(self._waiting).index(job.key) + 1 if job.state == "queued" else 0
        elapsed = self._clock() - job.started if job.started is not None else 0.0
        stage, done, total = job.progress
        others = len(job.owners - {owner}) if owner is not None else len(job.owners)
        return JobStatus(job.key, job.kind, job.state, position, self._wait_estimate(job), stage, done, total,
                         elapsed, others, None, job.error)

    def _wait_estimate(self, job: _Job) -> float | None:
        """Seconds until ``job`` is done: what the running jobs have left and the queued ones ahead
        need, spread over the workers, plus its own expected duration."""
        if job.state not in ("queued", "running"):
            return 0.0
        now, ahead = self._clock(), 0.0
        expected = self._expected()
        if job.kind not in expected:
            return None
        if job.state == "running":
            return max(expected[job.kind] - (now - job.started), 0.0)
        for other in self._jobs.values():
            if other.state == "running":
                ahead += max(expected.get(other.kind, 0.0) - (now - other.started), 0.0)
        for key in self._waiting:
            if key == job.key:
                break
            ahead += expected.get(self._jobs[key].kind, 0.0)
        return ahead / self.workers + expected[job.kind]

    def _expected(self) -> dict[str, float]:
        """Kind -> the median of its last timed jobs; a kind only the warm-up ran falls back to the warm-up's
        durations (too long, as the server was starting, but a first estimate beats none)."""
        return {kind: statistics.median(self._durations.get(kind) or past)
                for kind, past in {**self._untimed, **self._durations}.items() if past}

    def _drop(self, job: _Job) -> None:
        """No one waits for ``job``: off the queue, or told to stop at its next progress call."""
        job.cancelled.set()
        if job.state == "queued":
            self._waiting.remove(job.key)
            self._end(job, "cancelled", JobCancelled("no one waits for this job any more"))

    def _end(self, job: _Job, state: str, error: BaseException | None = None) -> None:
        """End ``job``: it keeps its state and a message, never its work or a traceback (whose frames would
        keep its model and tensors alive for as long as the job is remembered)."""
        job.state, job.error, job.work = state, _bare(error), None
        self._jobs.pop(job.key, None)
        if state != "done":
            self._ended[job.key] = job
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
        job.ended.set()
        self._cond.notify_all()
        self._write_log(job)

    def _write_log(self, job: _Job) -> None:
        """One line for an ended job: key, kind, state, seconds it ran (None: it never started)."""
        if not self.log:
            return
        ran = None if job.started is None else round(self._clock() - job.started, 3)
        record = {"key": job.key, "kind": job.kind, "state": job.state, "seconds": ran, "owners": len(job.owners),
                  "ended": round(time.time(), 3)}
        if not eventlog.append(self.log, record):
            self.log = None  # warned once; the jobs go on

    def _start_workers(self) -> None:
        while len(self._threads) < self.workers:
            thread = threading.Thread(target=self._worker, name=f"ghosted-job-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _worker(self) -> None:
        """Run jobs until the process ends; a worker that dies anyway is replaced and its job ends as failed."""
        import torch

        torch.set_num_threads(self.threads_per_job)  # this thread's share of the cores
        job = None
        try:
            while True:
                job = self._next_job()
                self._run(job)
                job = None
        finally:  # only reached when the worker itself fails (a bug, or a signal raised in this thread)
            with self._cond:
                if job is not None and not job.ended.is_set():
                    self._end(job, "failed", RuntimeError("the worker running this job stopped; try again"))
                self._threads = [t for t in self._threads if t.is_alive() and t is not threading.current_thread()]
                self._start_workers()

    def _run(self, job: _Job) -> None:
        """Run one job; every way out ends it (done, cancelled or failed), the store's own failures included."""
        try:
            result = job.work(self._progress_of(job))
            seconds = self._clock() - job.started
            self.store.put(job.key, result, job.kind)  # a store that cannot write keeps it in memory
        except JobCancelled as err:
            with self._cond:
                self._end(job, "cancelled", err)
            return
        except BaseException as err:  # noqa: BLE001 - the owner reads its message; the operator its traceback
            trace = "".join(traceback.format_exception(type(err), err, err.__traceback__))  # text: no frames kept
            _LOG.error("job %s (%s) failed:\n%s", job.key, job.kind, trace)
            with self._cond:
                self._end(job, "failed", err)
            return
        with self._cond:
            kept = self._durations if job.timed else self._untimed
            kept.setdefault(job.kind, deque(maxlen=HISTORY)).append(seconds)
            self._end(job, "done")

    def _next_job(self) -> _Job:
        """The first queued job someone still waits for (the others are dropped on the way)."""
        with self._cond:
            while True:
                while not self._waiting:
                    self._cond.wait()
                job = self._jobs[self._waiting.popleft()]
                self._forget_gone(job)
                if not job.owners:
                    self._end(job, "cancelled", JobCancelled("everyone who asked for this job left"))
                    continue
                job.state, job.started = "running", self._clock()
                return job

    def _forget_gone(self, job: _Job) -> None:
        if self.alive is not None:
            job.owners = {owner for owner in job.owners if self._is_alive(owner)}

    def _is_alive(self, owner: str) -> bool:
        """``alive(owner)``; an owner whose liveness cannot be read counts as there (its job is not dropped
        for the checker's failure, and the worker asking goes on)."""
        try:
            return bool(self.alive(owner))
        except Exception as err:  # noqa: BLE001 - logged for the operator
            _LOG.warning("could not tell whether %s is still there (%s: %s)", owner, type(err).__name__, err)
            return True

    def _progress_of(self, job: _Job) -> Callable[[str, int, int], None]:
        def progress(stage: str, done: int, total: int) -> None:
            job.progress = (stage, done, total)
            now = self._clock()
            if self.alive is not None and now - job.alive_checked > ALIVE_CHECK_S:
                with self._cond:
                    job.alive_checked = now
                    self._forget_gone(job)
                    if not job.owners:
                        job.cancelled.set()
            if job.cancelled.is_set():
                raise JobCancelled("the job was cancelled")

        return progress

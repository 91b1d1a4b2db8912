"""The app's jobs keep finished work however the server ends: a job that finished before SIGTERM or SIGHUP
(a Space restart, ``docker stop``) is on disk and answered by the next server without computing it again;
the job that was running is not stored half-done. Tested as real processes receiving real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SERVER = textwrap.dedent("""
    import json, sys, threading
    from ghosted.core.signals import exit_code, signals_as_interrupts
    from ghosted.service.jobs import JobQueue
    from ghosted.service.store import Codec, ResultStore

    codec = Codec(encode=lambda value: {"value": value}, decode=lambda data: int(data["value"]))
    store = ResultStore(folder=sys.argv[1], codecs={"sum": codec})
    queue = JobQueue(store=store, workers=1, threads_per_job=1)
    with signals_as_interrupts():
        try:
            queue.submit("sum-finished", "sum", lambda progress: sum(range(10)), owner="a")
            queue.wait("sum-finished")
            never = threading.Event()
            def endless(progress):
                while not never.wait(0.05):
                    progress("summing", 1, 2)
            queue.submit("sum-running", "sum", endless, owner="b")
            print("ready", flush=True)
            never.wait()
        except KeyboardInterrupt as err:
            print(json.dumps({"stored": sorted(p.name for p in store.folder.iterdir())}), flush=True)
            sys.exit(exit_code(err))
""")

RESTART = textwrap.dedent("""
    import json, sys
    from ghosted.service.store import Codec, ResultStore

    codec = Codec(encode=lambda value: {"value": value}, decode=lambda data: int(data["value"]))
    store = ResultStore(folder=sys.argv[1], codecs={"sum": codec})
    print(json.dumps({"finished": store.get("sum-finished"), "running": store.get("sum-running")}))
""")


@pytest.mark.slow  # two real processes per signal; the store's own tests keep results in the fast tier
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_finished_job_survives_the_server_being_stopped(tmp_path, signum):
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()
        server.send_signal(signum)
        out, err = server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 128 + signum, err
    assert len(json.loads(out)["stored"]) == 1  # the finished job, written when it finished; nothing half-done

    again = subprocess.run([sys.executable, "-c", RESTART, str(tmp_path)], cwd=ROOT, text=True,
                           capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"finished": 45, "running": None}

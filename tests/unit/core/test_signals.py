"""SIGTERM and SIGHUP end ``run``, ``export`` and ``grid`` like Ctrl-C: real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ghosted.core.signals import Stopped, describe_stop, exit_code, signals_as_interrupts
from tests.tiny import tiny_model_folder

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--calib-seqs", "4", "--seq-len", "32", "--heldout-seqs", "2", "--batch-size", "2", "--device", "cpu",
         "--dtype", "float32"]

# The child runs the real command line on a real model folder; one function of the pipeline is
# replaced by a pause (after ``calls`` real calls) that says when it is reached, so the signal lands
# at a known stage. Everything else, the signal included, is what a user's process gets.
CHILD = """
import pathlib, sys, time, importlib
module, name, calls, ready = sys.argv[1], sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4])
target = importlib.import_module(module)
real, seen = getattr(target, name), []

def pause(*args, **kwargs):
    seen.append(1)
    if len(seen) > calls:
        ready.write_text("paused")
        time.sleep(600)
    return real(*args, **kwargs)

setattr(target, name, pause)
from ghosted.cli import main
sys.exit(main(sys.argv[5:]))
"""


def stopped_process(tmp_path: Path, pause_at: tuple[str, str, int], argv: list[str], signum: int):
    """Run ``python -m ghosted argv`` until it reaches ``pause_at``, send ``signum``; the finished process."""
    ready = tmp_path / "ready"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "GHOSTED_STATS_CACHE": str(tmp_path / "stats")}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *map(str, pause_at), str(ready), *argv], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), proc.communicate(timeout=60)[1][-3000:] if proc.poll() is not None else "no pause"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_signal_inside_the_block_raises_stopped_with_its_exit_code():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as caught, signals_as_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once; never reached
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.signum == signal.SIGTERM
    assert exit_code(caught.value) == 143 and describe_stop(caught.value) == "stopped by SIGTERM"
    assert exit_code(KeyboardInterrupt()) == 130 and describe_stop(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_a_repeated_signal_does_not_interrupt_the_saving_of_finished_work():
    saved = []
    with pytest.raises(Stopped), signals_as_interrupts():
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        finally:  # what a command does on the way out: write the partial report
            os.kill(os.getpid(), signal.SIGHUP)  # docker stop and supervisors repeat the signal
            saved.append("report")
    assert saved == ["report"]


@pytest.mark.slow  # a real process start (the fast tier has the handler's own tests above)
def test_sigterm_in_run_writes_the_partial_report_and_exits_143(tmp_path):
    model, out = tiny_model_folder(tmp_path / "model"), tmp_path / "report.json"
    argv = ["run", "--model", model, "--drop", "2-3", "--methods", "dense,none,ghost", "--eval-tokens", "64",
            "--eval-seq-len", "32", *SMALL, "--out", out]
    code, stdout, err = stopped_process(tmp_path, ("ghosted.experiments.session", "perplexities", 0), argv,
                                        signal.SIGTERM)
    assert code == 143, err[-3000:]
    assert "Traceback" not in err and "stopped by SIGTERM" in err
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["stopped"]["by"] == "stopped by SIGTERM"
    assert report["stopped"]["stage"] == "evaluation"
    assert [e["method"] for e in report["results"]] == ["dense", "none", "ghost"]
    assert report["results"][2]["heldout_boundary_error"] >= 0  # the finished fit is kept
    assert "INCOMPLETE" in stdout


@pytest.mark.slow  # a second process start; the fast tier has the run's
def test_sighup_during_export_leaves_the_previous_folder_and_exits_129(tmp_path):
    model, out = tiny_model_folder(tmp_path / "model"), tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text("{}")  # a model saved earlier
    (out / "model.safetensors").write_bytes(b"earlier weights")
    before = snapshot(out)
    argv = ["export", "--model", model, "--drop", "2-3", "--method", "ghost", *SMALL, "--out", out, "--overwrite"]
    code, _, err = stopped_process(tmp_path, ("ghosted.operators.checkpoint", "save_file", 0), argv,
                                   signal.SIGHUP)
    assert code == 129, err[-3000:]
    assert "Traceback" not in err and "stopped by SIGHUP: no model saved" in err
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".exported")) == []  # no staged folder


@pytest.mark.slow  # a third process start
def test_sigterm_in_grid_keeps_the_finished_cell_and_exits_143(tmp_path):
    model, out = tiny_model_folder(tmp_path / "model"), tmp_path / "grid"
    argv = ["grid", "--model", model, "--selections", "streamline", "--n", "2,3", "--methods", "none,ghost",
            "--evals", "bundled:wiki", "--eval-tokens", "64", "--eval-seq-len", "32", *SMALL, "--out-dir", out]
    code, _, err = stopped_process(tmp_path, ("ghosted.grid.run", "evaluate_setting", 1), argv,
                                   signal.SIGTERM)
    assert code == 143, err[-3000:]
    assert "Traceback" not in err and "stopped by SIGTERM" in err and "--resume" in err
    cells = [json.loads(line) for line in (out / "grid.jsonl").read_text().splitlines()]
    assert [c["kind"] for c in cells].count("cell") == 1
    assert json.loads((out / "grid.json").read_text())["meta"]["complete"] is False

"""The one progress protocol: tqdm bars that are always closed, library calls that report every stage
to its end, silence by default, and no tqdm or show_tqdm anywhere else in the library."""

import argparse
import ast
import io
import types
from pathlib import Path

import pytest
import torch

from ghosted.core.progress import TqdmProgress, counted, for_stage, lines, message, silent
from tests.tiny import random_ids, tiny_model

LIBRARY = Path(__file__).resolve().parents[3] / "ghosted"
PROTOCOL_MODULE = LIBRARY / "core" / "progress.py"


def windows(n=6, t=16, seed=0):
    ids = random_ids(n, t, seed)
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})


class Recorder:
    """A ``Progress`` that keeps every call."""

    def __init__(self):
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.calls.append((stage, done, total))

    def stages(self) -> list[list[tuple[str, int, int]]]:
        """The calls cut into stages: a new label, or the same label starting again from a lower done."""
        runs: list[list[tuple[str, int, int]]] = []
        for call in self.calls:
            last = runs[-1][-1] if runs else None
            if last is None or call[0] != last[0] or call[1] < last[1]:
                runs.append([])
            runs[-1].append(call)
        return runs


def assert_every_stage_completes(recorder: Recorder) -> None:
    """Each stage keeps one positive total, never goes back, and ends with done == total."""
    assert recorder.calls, "nothing was reported"
    for run in recorder.stages():
        stage, totals = run[0][0], {total for _, _, total in run}
        assert len(totals) == 1 and min(totals) > 0, (stage, run)
        dones = [done for _, done, _ in run]
        assert dones == sorted(dones) and 0 <= dones[0], (stage, run)
        assert dones[-1] == run[0][2], f"stage {stage!r} stopped at {dones[-1]} of {run[0][2]}"


# --- TqdmProgress -------------------------------------------------------------------------------


def test_bars_are_closed_when_the_block_ends():
    out = io.StringIO()
    with TqdmProgress(file=out) as progress:
        progress("calibration", 0, 4)
        progress("calibration", 2, 4)
        bar = progress.bar
        assert not bar.disable and bar.n == 2 and bar.total == 4  # open, where the work is
    assert bar.disable  # tqdm marks a closed bar disabled
    assert progress.opened == [bar]
    assert "calibration" in out.getvalue()


def test_bars_are_closed_when_the_work_raises():
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="boom"):
        with TqdmProgress(file=out) as progress:
            progress("calibration", 1, 4)
            raise RuntimeError("boom")
    assert progress.opened and all(bar.disable for bar in progress.opened)


def test_a_new_stage_closes_the_previous_bar_and_a_finished_stage_closes_its_own():
    with TqdmProgress(file=io.StringIO()) as progress:
        progress("first", 1, 3)
        first = progress.bar
        progress("second", 1, 2)
        assert first.disable and not progress.bar.disable
        second = progress.bar
        progress("second", 2, 2)  # reached its total
        assert second.disable and progress.bar is None
        progress("second", 1, 2)  # the same label again: a new bar
        assert progress.bar is not second and not progress.bar.disable
        progress("third", 5, 5)
    assert len(progress.opened) == 4 and all(bar.disable for bar in progress.opened)


def test_a_stage_that_starts_again_gets_a_new_bar():
    with TqdmProgress(file=io.StringIO()) as progress:
        progress("perplexity", 2, 3)
        before = progress.bar
        progress("perplexity", 1, 3)
        assert before.disable and progress.bar.n == 1


def test_a_message_is_one_line_and_no_bar():
    out = io.StringIO()
    with TqdmProgress(file=out) as progress:
        message(progress, "shortgpt n=7: layers 20-26")
        lines(progress)("dense on bundled:wiki")
    assert out.getvalue().splitlines() == ["shortgpt n=7: layers 20-26", "dense on bundled:wiki"]
    assert progress.opened == []


def test_disabled_progress_writes_nothing():
    out = io.StringIO()
    with TqdmProgress(file=out, disable=True) as progress:
        progress("calibration", 1, 2)
        message(progress, "a line")
    assert out.getvalue() == "" and progress.opened == []


# --- helpers --------------------------------------------------------------------------------------


def test_helpers_do_nothing_without_a_progress():
    for_stage(None, "x")(1, 2)
    message(None, "x")
    lines(None)("x")
    silent("x", 1, 2)
    assert list(counted([1, 2], None, "x")) == [1, 2]


def test_counted_reports_each_item_once_it_is_done_and_an_empty_loop_reports_nothing():
    recorder, seen = Recorder(), []
    for item in counted(["a", "b"], recorder, "loop"):
        seen.append((item, list(recorder.calls)))
    assert seen == [("a", [("loop", 0, 2)]), ("b", [("loop", 0, 2), ("loop", 1, 2)])]
    assert recorder.calls[-1] == ("loop", 2, 2)
    empty = Recorder()
    assert list(counted([], empty, "nothing")) == [] and empty.calls == []  # never a message (total 0)


# --- library calls --------------------------------------------------------------------------------


def test_perplexity_reports_one_step_per_batch_and_is_silent_by_default(capfd):
    from ghosted.evaluation.perplexity import perplexity

    model, recorder = tiny_model("llama"), Recorder()
    silent_result = perplexity(model, windows(5), batch_size=2)
    assert capfd.readouterr().err == ""  # no progress given: nothing drawn
    reported = perplexity(model, windows(5), batch_size=2, progress=recorder, label="dense")
    assert recorder.calls == [("dense", 0, 3), ("dense", 1, 3), ("dense", 2, 3), ("dense", 3, 3)]
    assert reported.nll == silent_result.nll


def test_recover_reports_every_stage_to_its_end():
    from ghosted.calibration.collect import CalibrationConfig
    from ghosted.recovery.fitting import RecoveryConfig, recover

    recorder = Recorder()
    config = RecoveryConfig(calibration=CalibrationConfig(batch_size=4))
    recover(tiny_model("llama"), "2-3", ["none", "ghost", "ghost-auto"], windows(6), windows(3, seed=1), config,
            progress=recorder, cache=False)
    assert_every_stage_completes(recorder)
    stages = {stage: total for stage, _, total in recorder.calls}
    assert stages == {"calibration": 2, "held-out statistics": 1, "ghost-auto: choosing per gap": 1,
                      "fitted none": 1, "fitted ghost": 1, "fitted ghost-auto": 1}


def test_sequential_fits_report_each_gap():
    from ghosted.recovery.fitting import RecoveryConfig, recover

    recorder = Recorder()
    recover(tiny_model("llama"), "1,4", ["ghost"], windows(4), windows(2, seed=1),
            RecoveryConfig(ghost_mode="sequential"), progress=recorder, cache=False)
    assert_every_stage_completes(recorder)
    labels = [run[0][0] for run in recorder.stages()]
    assert labels[:2] == ["calibration", "held-out statistics"]
    assert labels[2:] == ["sequential fit of gap [1, 2)", "held-out statistics of gap [1, 2)",
                          "sequential fit of gap [4, 5)", "held-out statistics of gap [4, 5)",
                          "fitted ghost"]  # a step after each method: where a cancelled fit stops


def test_influence_reports_the_pass_and_the_per_layer_criteria():
    from ghosted.selection.criteria import InfluenceConfig, influence

    recorder = Recorder()
    influence(tiny_model("llama"), windows(4), InfluenceConfig(metrics=["block_influence", "ppl_single", "sleb"],
                                                               n_values=[1], sleb_steps=2, batch_size=2),
              progress=recorder)
    assert_every_stage_completes(recorder)
    assert {stage: total for stage, _, total in recorder.calls} == {"calibration pass": 2, "ppl_single": 6, "sleb": 2}


def test_the_cli_passes_quiet_to_its_progress(monkeypatch):
    from ghosted.cli import main
    from ghosted.cli import run as run_cli
    from ghosted.cli.common import progress_from_args

    seen = {}

    def handle(args) -> int:
        seen["quiet"] = args.quiet
        return 0

    monkeypatch.setattr(run_cli, "handle", handle)
    assert main(["--quiet", "run", "--drop", "3"]) == 0 and seen["quiet"] is True
    assert progress_from_args(argparse.Namespace(quiet=True)).disable
    assert not progress_from_args(argparse.Namespace()).disable


# --- the library draws nothing itself --------------------------------------------------------------


def library_modules():
    return sorted(LIBRARY.rglob("*.py"))


def test_only_the_protocol_module_imports_tqdm():
    importers = []
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "tqdm" or name.startswith("tqdm.") for name in names):
                importers.append(path.relative_to(LIBRARY.parent).as_posix())
    assert sorted(set(importers)) == ["ghosted/core/progress.py"]


def test_no_library_function_takes_show_tqdm_and_no_module_defines_its_own_progress():
    found = []
    for path in library_modules():
        name = path.relative_to(LIBRARY.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                params = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
                found += [f"{name}: {node.name}(show_tqdm)" for p in params if p == "show_tqdm"]
            elif isinstance(node, ast.Assign) and path != PROTOCOL_MODULE:
                found += [f"{name}: Progress = ..." for t in node.targets
                          if isinstance(t, ast.Name) and t.id.endswith("Progress")]
            elif isinstance(node, ast.ClassDef) and path != PROTOCOL_MODULE and node.name.endswith("Progress"):
                found.append(f"{name}: class {node.name}")
    assert found == []

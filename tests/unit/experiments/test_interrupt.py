"""Finished work is kept: Ctrl-C in ``run`` reports what finished, ``grid`` journals and resumes cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import transformers as tf

from ghosted.grid import run as grid_module
from ghosted.experiments import run as pipeline
from ghosted.experiments import session as engine
from ghosted.calibration import cache as stats_cache
from ghosted.cli import main
from ghosted.grid.run import run_grid
from ghosted.experiments.run import run_experiment
from ghosted.experiments.spec import ExperimentSpec
from tests.tiny import tiny_model
from tests.tiny import small_config, tiny_loaded
from tests.tiny import loaded

ROOT = Path(__file__).resolve().parents[3]
RUN = dict(drop="2-3", methods=["dense", "none", "ghost", "replaceme-ls"], calib_seqs=4, seq_len=32, heldout_seqs=2,
           eval_tokens=64, eval_seq_len=32, batch_size=2, device="cpu", dtype="float32")
RUN_ARGS = ["run", "--drop", "2-3", "--methods", "dense,none,ghost", "--calib-seqs", "4", "--seq-len", "32",
            "--heldout-seqs", "2", "--eval-tokens", "64", "--eval-seq-len", "32", "--batch-size", "2",
            "--device", "cpu", "--dtype", "float32"]


def interrupt(*_, **__):
    raise KeyboardInterrupt


def test_ctrl_c_during_evaluation_keeps_every_fitted_method(monkeypatch):
    monkeypatch.setattr(engine, "perplexities", interrupt)
    with pytest.raises(KeyboardInterrupt) as caught:
        run_experiment(ExperimentSpec().with_options(**RUN), loaded=tiny_loaded(6))
    report = caught.value.partial_report
    assert report["complete"] is False
    assert report["stopped"]["stage"] == "evaluation" and report["stopped"]["by"] == "interrupted (Ctrl-C)"
    assert "none evaluated" in report["stopped"]["finished"]
    assert [e["method"] for e in report["results"]] == ["dense", "none", "ghost", "replaceme-ls"]
    assert report["results"][0]["ppl"] is None and "statistics" not in report["results"][0]
    for entry in report["results"][1:]:
        assert entry["ppl"] is None and entry["evaluated"] is False and entry["statistics"] == "computed"
        assert 0 <= entry["heldout_boundary_error"] and entry["calib_seconds"] >= 0
    assert report["protocol"]["evaluation"]["n_windows"] == 2 and report["dropped"] == [2, 3]
    json.dumps(report)  # JSON-ready
    assert "not run" in pipeline.format_table(report) and "INCOMPLETE" in pipeline.format_table(report)


def test_ctrl_c_during_calibration_keeps_the_finished_pass(monkeypatch, tmp_path):
    """The calibration pass finished and was saved; the held-out pass was cut: the rerun reuses the first."""
    folder = tmp_path / "m"
    tiny_model("llama").save_pretrained(folder)
    model = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    real, calls = stats_cache.collect_stats, []

    def second_pass_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(stats_cache, "collect_stats", second_pass_interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        run_experiment(ExperimentSpec().with_options(**RUN), loaded=loaded(model))
    report = caught.value.partial_report
    assert report["complete"] is False and report["stopped"]["stage"] == "calibration and fitting"
    assert report["results"] == []
    assert "calibration statistics finished so far are cached" in report["stopped"]["finished"]
    monkeypatch.setattr(stats_cache, "collect_stats", real)
    again, run = run_experiment(ExperimentSpec().with_options(**RUN), loaded=loaded(model))
    assert run.statistics == {"calibration": "reused", "held-out": "computed"} and again["complete"] is True


def test_an_error_after_some_work_also_carries_the_partial_report(monkeypatch):
    def broken(*_, **__):
        raise ValueError("evaluation text too short")
    monkeypatch.setattr(engine, "perplexities", broken)
    with pytest.raises(ValueError, match="too short") as caught:
        run_experiment(ExperimentSpec().with_options(**RUN), loaded=tiny_loaded(6))
    assert caught.value.partial_report["stopped"]["by"] == "ValueError: evaluation text too short"


def test_cli_ctrl_c_writes_partial_json_prints_the_table_and_exits_130(monkeypatch, tmp_path, capsys):
    out = tmp_path / "report.json"
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", lambda *_: tiny_loaded(6))
    monkeypatch.setattr(engine, "perplexities", interrupt)
    assert main([*RUN_ARGS, "--out", str(out)]) == 130
    captured = capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["complete"] is False and [e["method"] for e in report["results"]] == ["dense", "none", "ghost"]
    assert "ghost" in captured.out and "not run" in captured.out
    assert "interrupted" in captured.err and "Traceback" not in captured.err


def test_cli_error_after_some_work_writes_partial_json_and_exits_2(monkeypatch, tmp_path, capsys):
    def broken(*_, **__):
        raise RuntimeError("out of memory")
    out = tmp_path / "report.json"
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", lambda *_: tiny_loaded(6))
    monkeypatch.setattr(engine, "perplexities", broken)
    assert main([*RUN_ARGS, "--out", str(out)]) == 2
    assert json.loads(out.read_text())["stopped"]["by"] == "RuntimeError: out of memory"
    assert "error: out of memory" in capsys.readouterr().err


def test_a_normal_run_is_complete(tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", lambda *_: tiny_loaded(6))
    assert main([*RUN_ARGS, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["complete"] is True and "stopped" not in report and all(e["ppl"] > 1 for e in report["results"])


CTRL_C_SCRIPT = """
import sys
from ghosted.experiments import run as pipeline
from ghosted.experiments import session as engine
from ghosted.cli import main
from tests.tiny import tiny_loaded

def interrupt(*args, **kwargs):
    raise KeyboardInterrupt

engine.load_spec_model = lambda *_: tiny_loaded(6)
engine.perplexities = interrupt
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # the bundled model in a new process
def test_ctrl_c_in_a_real_process_exits_130_without_a_traceback(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_SCRIPT, *RUN_ARGS, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "interrupted" in proc.stderr
    assert json.loads(out.read_text())["complete"] is False


# --- grid -------------------------------------------------------------------------------------------

GRID = dict(selections=["streamline", "shortgpt"], n_values=[2, 3], methods=["dense", "none", "ghost"],
            evals=["bundled:wiki"])


@pytest.fixture
def counted(monkeypatch):
    """Counts the cells the grid computes (one ``evaluate_setting`` per layer set)."""
    calls = []
    real = grid_module.evaluate_setting

    def counting(model, layers, *args, **kwargs):
        calls.append(tuple(layers))
        return real(model, layers, *args, **kwargs)
    monkeypatch.setattr(grid_module, "evaluate_setting", counting)
    return calls


def test_grid_resume_skips_every_finished_cell(counted, tmp_path):
    lm, cfg = tiny_loaded(), small_config(**GRID)
    first = run_grid(cfg, loaded=lm, out_dir=tmp_path)
    cells = len(counted)
    records = (tmp_path / "grid.jsonl").read_text().splitlines()
    assert cells >= 2 and len(records) == cells + 4 + 1  # + 4 selections, 1 dense text
    resumed = run_grid(cfg, loaded=lm, out_dir=tmp_path, resume=True)
    assert len(counted) == cells  # nothing computed again
    assert sorted(resumed.meta["resumed"]) == sorted(first.meta["settings"])
    pd.testing.assert_frame_equal(first.frame, resumed.frame)
    with pytest.raises(ValueError, match="--resume"):  # the journal is never dropped silently
        run_grid(cfg, loaded=lm, out_dir=tmp_path)
    run_grid(cfg, loaded=lm, out_dir=tmp_path, overwrite=True)  # a new grid, asked for
    assert len(counted) == 2 * cells


def test_grid_resume_recomputes_when_a_setting_changed(counted, tmp_path):
    lm = tiny_loaded()
    run_grid(small_config(**GRID), loaded=lm, out_dir=tmp_path)
    cells = len(counted)
    run_grid(small_config(**GRID, seed=3), loaded=lm, out_dir=tmp_path, resume=True)
    assert len(counted) > cells  # other calibration windows: no old cell matches
    more = small_config(**{**GRID, "methods": ["dense", "none", "ghost", "linearpatch-diag"]})
    before = len(counted)
    run_grid(more, loaded=lm, out_dir=tmp_path, resume=True)
    assert len(counted) - before == cells  # another method list is another cell key


def test_ctrl_c_in_the_grid_keeps_finished_cells_and_resume_finishes_the_rest(monkeypatch, tmp_path):
    lm, cfg = tiny_loaded(), small_config(**GRID)
    full = run_grid(cfg, loaded=lm)
    real, calls = grid_module.evaluate_setting, []

    def second_cell_interrupted(model, layers, *args, **kwargs):
        calls.append(tuple(layers))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, layers, *args, **kwargs)
    monkeypatch.setattr(grid_module, "evaluate_setting", second_cell_interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        run_grid(cfg, loaded=lm, out_dir=tmp_path)
    partial = caught.value.partial_result
    assert partial.meta["complete"] is False and set(partial.frame.layers) == {partial.frame.layers.iloc[0]}
    on_disk = pd.read_csv(tmp_path / "grid.csv")
    assert len(on_disk) == len(partial.frame) > 0
    assert json.loads((tmp_path / "grid.json").read_text())["meta"]["complete"] is False
    monkeypatch.setattr(grid_module, "evaluate_setting", real)
    resumed = run_grid(cfg, loaded=lm, out_dir=tmp_path, resume=True)
    assert len(resumed.meta["resumed"]) == 1 and resumed.meta["complete"] is True
    pd.testing.assert_frame_equal(full.frame.drop(columns=["eval_seconds", "calib_seconds", "solve_seconds"]),
                                  resumed.frame.drop(columns=["eval_seconds", "calib_seconds", "solve_seconds"]))


def test_grid_cli_ctrl_c_exits_130_and_says_how_to_resume(monkeypatch, tmp_path, capsys):
    from ghosted.cli import grid as grid_cli

    monkeypatch.setattr(grid_cli, "load_from_args", lambda *_: tiny_loaded())
    monkeypatch.setattr(grid_module, "evaluate_setting", interrupt)
    code = main(["grid", "--selections", "streamline", "--n", "2", "--methods", "none,ghost", "--evals",
                 "bundled:wiki", "--calib-seqs", "6", "--seq-len", "32", "--heldout-seqs", "2", "--eval-tokens", "96",
                 "--eval-seq-len", "32", "--batch-size", "2", "--device", "cpu", "--dtype", "float32",
                 "--out-dir", str(tmp_path)])
    assert code == 130
    err = capsys.readouterr().err
    assert "--resume" in err and "Traceback" not in err
    assert "selection" in (tmp_path / "grid.jsonl").read_text()  # the influence pass's choice is kept


def test_a_journal_line_cut_short_by_a_crash_is_done_again(counted, tmp_path):
    lm, cfg = tiny_loaded(), small_config(**GRID)
    run_grid(cfg, loaded=lm, out_dir=tmp_path)
    cells = len(counted)
    journal = tmp_path / "grid.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]) + "\n")  # last cell half-written
    resumed = run_grid(cfg, loaded=lm, out_dir=tmp_path, resume=True)
    assert len(counted) == cells + 1 and len(resumed.meta["resumed"]) == cells - 1

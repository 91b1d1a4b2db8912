"""The reproduction grid on a tiny model: layers chosen, methods fitted, perplexities, files."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from ghosted.grid import run as grid_module
from ghosted.experiments import session as session_module
from ghosted.evaluation.perplexity import perplexity
from ghosted.grid.run import applicable, run_grid, to_markdown
from ghosted.data.windows import capped_evaluation_windows
from ghosted.models.pruning import format_layers, prune
from ghosted.recovery.fitting import BRANCH_METHODS, METHODS
from tests.tiny import CharTokenizer, small_config, tiny_loaded  # noqa: F401 (CharTokenizer: other modules)
from tests.tolerance import FLOAT64_REL


@pytest.fixture(scope="module")
def tiny_grid():
    lm = tiny_loaded()
    return lm, run_grid(small_config(), loaded=lm)


def test_every_setting_method_and_text_has_a_row(tiny_grid):
    _, result = tiny_grid
    frame = result.frame
    assert set(frame.selection) == {"streamline", "shortgpt"} and set(frame.n) == {2, 3}
    assert set(frame["eval"]) == {"bundled:wiki", "bundled:news"}
    for (_, _, layers), group in frame.groupby(["selection", "n", "layers"]):
        expected = {"dense", *METHODS}
        if "0" in layers.replace("-", ",").split(","):
            expected -= set(BRANCH_METHODS)
        assert set(group.method) == expected
        assert len(group) == 2 * len(expected)  # once per text
    assert frame.ppl.map(math.isfinite).all()
    auto = frame[frame.method == "ghost-auto"]
    assert auto.chosen.str.fullmatch(r"(\d+-\d+: (paper|robust|none)(, )?)+").all()  # what auto chose, per gap


def test_layers_are_the_criteria_choices(tiny_grid):
    from ghosted.selection.criteria import InfluenceConfig, influence
    from ghosted.data.windows import split_calibration
    from ghosted.selection.rules import select
    from ghosted.data.windows import calibration_windows

    lm, result = tiny_grid
    cfg = small_config()
    fit, held = split_calibration(calibration_windows(lm.tokenizer, cfg.base.calibration.source, 8, 32, 0), 2)
    report = influence(lm.model, fit, InfluenceConfig(metrics=["seqcos_streamline", "seqcos_shortgpt"],
                                                      n_values=[2, 3], batch_size=2), heldout=held)
    for (selection, n, layers), _ in result.frame.groupby(["selection", "n", "layers"]):
        chosen, _ = select(report, grid_module.ALIASES[selection], n)
        assert layers == format_layers(chosen)
        assert result.meta["selections"][f"{selection} {n}"]["layers"] == layers


def test_perplexities_match_separate_evaluation(tiny_grid):
    lm, result = tiny_grid
    cfg = small_config()
    for source in cfg.evals:
        windows = capped_evaluation_windows(lm.tokenizer, source, cfg.base.evaluation.eval_tokens,
                                            cfg.base.evaluation.eval_seq_len, cfg.base.calibration.source)
        rows = result.frame[result.frame["eval"] == source]
        dense = perplexity(lm.model, windows, batch_size=2).ppl
        # the grid's shared evaluation runs the same float32 ops as evaluating alone (same machine, same
        # thread count): only float64 sums may differ
        assert rows[rows.method == "dense"].ppl.tolist() == pytest.approx([dense] * 4, rel=FLOAT64_REL)
        for layers, group in rows[rows.method == "none"].groupby("layers"):
            pruned = perplexity(prune(lm.model, layers), windows, batch_size=2).ppl
            assert group.ppl.tolist() == pytest.approx([pruned] * len(group), rel=FLOAT64_REL)


def test_same_layers_are_fitted_once(monkeypatch):
    calls = []
    real = session_module.recover  # every fit of the grid goes through its session

    def counting(model, layers, *args, **kwargs):
        calls.append(tuple(layers))
        return real(model, layers, *args, **kwargs)
    monkeypatch.setattr(session_module, "recover", counting)
    cfg = small_config(selections=["streamline", "seqcos_streamline"], n_values=[2], methods=["none", "ghost"],
                       evals=["bundled:wiki"])
    result = run_grid(cfg, loaded=tiny_loaded())
    assert len(calls) == 1  # the alias and its criterion pick the same block
    assert len(result.frame) == 4  # 2 selections x 2 methods


def test_files_and_markdown(tiny_grid, tmp_path):
    _, result = tiny_grid
    paths = result.save(tmp_path)
    assert [p.name for p in paths] == ["grid.csv", "grid.md", "grid.json"]
    assert len(pd.read_csv(paths[0])) == len(result.frame)
    assert json.loads(paths[2].read_text())["meta"]["seconds"] > 0
    md = paths[1].read_text()
    assert md.count("**Perplexity on") == 2
    assert "| selection | n | layers | dense | none | ghost |" in md
    # per text: a perplexity table and a fidelity table (2 titles each), 4 rows each, 1 best per perplexity row
    assert md.count("| streamline |") == 8 and md.count("**") == 2 * 2 + 2 * 2 + 2 * 8
    assert md.count("**Fidelity to the dense model on") == 2
    rows = result.frame[result.frame.method != "dense"]
    assert rows.kl.notna().all() and (rows.kl > 0).all() and rows.top1.between(0, 1).all()
    assert (rows.ppl_low <= rows.ppl).all() and (rows.ppl <= rows.ppl_high).all()
    assert "d_none_significant" in rows and "d_ghost" in rows


def test_markdown_marks_the_best_recovery_and_missing_cells():
    frame = pd.DataFrame([
        {"selection": "s", "n": 1, "layers": "0", "eval": "t", "method": m, "ppl": p}
        for m, p in [("dense", 5.0), ("none", 50.0), ("ghost", 9.0), ("linearpatch-diag", 12.0)]])
    frame = pd.concat([frame, frame.assign(layers="2", ppl=frame.ppl + 1)]).reset_index(drop=True)
    frame = frame[~((frame.layers == "0") & (frame.method == "linearpatch-diag"))]
    md = to_markdown(frame, {})
    assert "| s | 1 | 0 | 5.00 | 50.00 | **9.00** | n/a |" in md
    assert "| s | 1 | 2 | 6.00 | 51.00 | **10.00** | 13.00 |" in md


def test_applicable_drops_replaceme_at_layer_zero():
    methods, notes = applicable(list(METHODS), [0, 1, 5])
    assert not set(methods) & set(BRANCH_METHODS) and "ghost" in methods
    assert notes and "layer 0" in notes[0]
    assert applicable(list(METHODS), [3, 4]) == (list(METHODS), [])


def test_eval_tokens_are_capped_at_the_text(tiny_grid):
    lm, _ = tiny_grid
    windows = capped_evaluation_windows(lm.tokenizer, "bundled:news", 10**9, 512)
    available = windows.protocol["available_tokens"]
    assert windows.input_ids.shape == (available // 512, 512)


def test_cli_builds_the_config(monkeypatch, tmp_path, capsys):
    from ghosted.cli import grid as grid_cli
    from ghosted.cli import main

    seen = {}

    def fake_run(cfg, loaded=None, progress=None, **_):
        seen["cfg"] = cfg
        return grid_module.GridResult(pd.DataFrame([{"selection": "shortgpt", "n": 7, "layers": "1", "eval": "x",
                                                      "method": "dense", "ppl": 3.0}]), {"seconds": 1.0})
    monkeypatch.setattr(grid_cli, "load_from_args", lambda *_: None)
    monkeypatch.setattr(grid_module, "run_grid", fake_run)
    code = main(["grid", "--selections", "shortgpt", "--n", "7", "--methods", "dense,ghost",
                 "--eval-tokens", "1024", "--calib-seqs", "8", "--out-dir", str(tmp_path)])
    assert code == 0
    cfg = seen["cfg"]
    base = cfg.base
    assert (cfg.selections, cfg.n_values, base.methods, base.evaluation.eval_tokens, base.calibration.calib_seqs) == (
        ["shortgpt"], [7], ["dense", "ghost"], 1024, 8)
    assert (tmp_path / "grid.md").exists() and "3.00" in capsys.readouterr().out

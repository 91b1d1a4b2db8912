"""grid --seeds: every cell refitted on K calibration draws, its mean and spread per method; K = 1 unchanged."""

from __future__ import annotations

import statistics

import pandas as pd
import pytest

from ghosted.grid import run as grid_module
from ghosted.grid.run import evaluate_setting, run_grid
from ghosted.experiments.session import Session
from ghosted.experiments.validate import MAX_SEEDS
from tests.tiny import small_config, tiny_loaded

GRID = dict(selections=["streamline"], n_values=[2], methods=["dense", "none", "ghost"], evals=["bundled:wiki"])


@pytest.fixture(scope="module")
def grids():
    lm = tiny_loaded()
    return lm, run_grid(small_config(**GRID), loaded=lm), run_grid(small_config(**GRID, seeds=3), loaded=lm)


def test_one_draw_is_the_grid_as_before(grids):
    _, one, _ = grids
    assert "ppl_mean" not in one.frame and one.meta["seeds"] == [0]
    assert "calibration draws" not in one.markdown()


def test_the_first_draw_is_unchanged_and_the_spread_is_over_every_draw(grids):
    lm, one, three = grids
    columns = ["selection", "n", "layers", "eval", "method", "ppl", "kl"]
    pd.testing.assert_frame_equal(one.frame[columns], three.frame[columns])  # the first draw: the same numbers
    assert three.meta["seeds"] == [0, 1, 2]
    layers = [int(x) for x in three.meta["selections"]["streamline 2"]["layers"].split("-")]
    layers = list(range(layers[0], layers[-1] + 1))
    cfg = small_config(**GRID)
    ghost = [one.frame.set_index("method").ppl["ghost"]]
    for seed in (1, 2):  # each other draw: the session on that seed, fitted on the first draw's layers
        session = Session(cfg.base.with_options(seed=seed), lm)
        rows, _, _ = evaluate_setting(session, layers, ["none", "ghost"], cfg.evals)
        ghost.append({r["method"]: r["ppl"] for r in rows}["ghost"])
    row = three.frame.set_index("method")
    assert row.ppl_mean["ghost"] == pytest.approx(statistics.fmean(ghost))
    assert row.ppl_std["ghost"] == pytest.approx(statistics.stdev(ghost)) and row.ppl_std["ghost"] > 0
    assert (row.ppl_min["ghost"], row.ppl_max["ghost"]) == (pytest.approx(min(ghost)), pytest.approx(max(ghost)))
    for fixed in ("dense", "none"):  # not fitted: the same on every draw
        assert row.ppl_std[fixed] == 0 and row.ppl_mean[fixed] == pytest.approx(row.ppl[fixed])
    assert (three.frame.seeds == 3).all()
    md = three.markdown()
    assert "over 3 calibration draws** (seeds 0, 1, 2" in md
    assert f"{row.ppl_mean['ghost']:.2f} ± {row.ppl_std['ghost']:.2f}" in md


def test_resume_with_more_draws_fits_only_the_new_draws(monkeypatch, tmp_path):
    calls = []
    real = grid_module.evaluate_setting

    def counting(session, layers, *args, **kwargs):
        calls.append(session.spec.calibration.seed)
        return real(session, layers, *args, **kwargs)
    monkeypatch.setattr(grid_module, "evaluate_setting", counting)
    lm = tiny_loaded()
    run_grid(small_config(**GRID), loaded=lm, out_dir=tmp_path)
    assert calls == [0]
    result = run_grid(small_config(**GRID, seeds=2), loaded=lm, out_dir=tmp_path, resume=True)
    assert calls == [0, 1] and result.meta["resumed"] == [result.frame.layers[0]]
    assert "seed" in (tmp_path / "grid.md").read_text()


@pytest.mark.parametrize("seeds, error", [(0, ValueError), (MAX_SEEDS + 1, ValueError), (1.5, TypeError),
                                          (True, TypeError)])
def test_bad_counts_are_refused_before_loading(seeds, error):
    with pytest.raises(error, match="--seeds"):
        run_grid(small_config(**GRID, seeds=seeds), loaded=None)


def test_the_last_seed_must_be_one_torch_accepts():
    with pytest.raises(ValueError, match="below 2\\*\\*32"):
        run_grid(small_config(**GRID, seed=2**32 - 1, seeds=2), loaded=None)


def test_cli_passes_seeds_and_refuses_zero(monkeypatch, tmp_path, capsys):
    from ghosted.cli import main

    code = main(["grid", "--seeds", "0", "--out-dir", str(tmp_path / "g"), "--dry-run"])
    assert code == 2 and "--seeds" in capsys.readouterr().err
    code = main(["grid", "--model", "bundled", "--seeds", "3", "--n", "2", "--out-dir", str(tmp_path / "g"),
                 "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "calibration draws: 3 (seeds 0..2)" in out

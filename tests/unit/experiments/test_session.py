"""The session owns running an experiment: one loader, windows drawn once, typed fits and tables."""

from __future__ import annotations

import pytest

from ghosted.experiments import session as engine
from ghosted.experiments.run import run_experiment
from ghosted.experiments.session import EvaluationTable, FittedRun, Session
from ghosted.experiments.spec import ExperimentSpec
from ghosted.recovery.methods import BASELINE, RECOVERY, REFERENCE
from tests.tiny import tiny_loaded

SMALL = dict(drop="2-3", methods=["dense", "none", "ghost"], calib_seqs=4, seq_len=32, heldout_seqs=2,
             eval_tokens=64, eval_seq_len=32, batch_size=2, device="cpu", dtype="float32", cache=False)


def small_spec(**overrides) -> ExperimentSpec:
    return ExperimentSpec().with_options(**{**SMALL, **overrides})


def test_windows_are_drawn_once_and_held_out_as_the_spec_says():
    session = Session(small_spec(), tiny_loaded(6))
    windows = session.calibration()
    assert session.calibration() is windows  # drawn once, shared by every fit
    assert windows.fit.input_ids.shape[0] == 4 and windows.heldout.input_ids.shape[0] == 2
    assert session.evaluation() is session.evaluation()
    assert Session(small_spec(heldout_seqs=0), tiny_loaded(6)).calibration().heldout is None


def test_a_fit_carries_the_spec_of_exactly_what_was_fitted():
    session = Session(small_spec(), tiny_loaded(6))
    fitted = session.fit()
    assert isinstance(fitted, FittedRun) and fitted.layers == [2, 3]
    assert list(fitted.models) == ["none", "ghost"]  # the reference is never fitted
    assert fitted.spec.layers.drop == "2-3" and fitted.spec.methods == ["dense", "none", "ghost"]
    other = session.fit("1", ["ghost"])
    assert other.spec.layers.drop == "1" and other.spec.methods == ["ghost"]
    assert ExperimentSpec.from_dict(other.spec.to_dict()) == other.spec  # what every save writes


def test_the_table_has_one_vocabulary_and_roles_from_the_registry():
    session = Session(small_spec(), tiny_loaded(6))
    table = session.evaluate(session.fit())
    assert isinstance(table, EvaluationTable)
    rows = {r.method: r for r in table.rows}
    assert (rows["dense"].role, rows["none"].role, rows["ghost"].role) == (REFERENCE, BASELINE, RECOVERY)
    assert (rows["dense"].label, rows["none"].label, rows["ghost"].label) == ("dense", "pruned", "ghost")
    assert all(r.ppl > 1 and r.tokens > 0 for r in table.rows)
    frame = table.frame()
    assert {"method", "label", "role", "ppl", "nll", "tokens"} <= set(frame.columns)
    assert "heldout_boundary_error" in rows["ghost"].fit and rows["dense"].fit == {}


def test_the_run_report_is_the_sessions_table():
    spec = small_spec()
    report, _ = run_experiment(spec, loaded=tiny_loaded(6))
    session = Session(spec, tiny_loaded(6))
    table = session.evaluate(session.fit())
    assert [(e["method"], e["ppl"]) for e in report["results"]] == [(r.method, r.ppl) for r in table.rows]


def test_the_model_is_loaded_with_every_model_field(monkeypatch):
    seen = {}

    def load_any(source, **options):
        seen.update(source=source, **options)
        return tiny_loaded(6)
    monkeypatch.setattr("ghosted.operators.checkpoint.load_any", load_any)
    spec = small_spec(model="some/model", device_map="auto", trust_remote_code=True, dtype="bfloat16")
    Session(spec)
    assert seen == {"source": "some/model", "device": "cpu", "dtype": "bfloat16", "device_map": "auto",
                    "trust_remote_code": True, "offload_folder": None}


def test_no_layers_no_fit():
    with pytest.raises(ValueError, match="layers to drop"):
        Session(small_spec(drop=""), tiny_loaded(6)).fit()


def test_one_model_is_scored_by_the_plain_pass(monkeypatch):
    def shared(*_, **__):
        raise AssertionError("one model has nothing to share")
    monkeypatch.setattr(engine, "perplexities", shared)
    table = Session(small_spec(), tiny_loaded(6)).evaluate()
    assert [r.method for r in table.rows] == ["dense"] and table.rows[0].ppl > 1


def test_every_save_of_a_session_fit_writes_its_spec(tmp_path):
    import ghosted
    from ghosted.experiments.spec_files import load_spec
    import torch

    from ghosted.data.windows import TokenWindows
    from tests.tiny import random_ids, tiny_model

    run = ghosted.fit(tiny_loaded(6), "2-3", methods=["ghost"], calib_seqs=4, seq_len=32, heldout_seqs=2)
    ghosted.save(run.results["ghost"].model, tmp_path / "drawn", recipe=run)
    spec = load_spec(tmp_path / "drawn")
    assert spec.layers.drop == "2-3" and spec.methods == ["ghost"] and spec.calibration.calib_seqs == 4
    ids = random_ids(4, 16)  # (4, 16)
    by_hand = ghosted.fit(tiny_model("llama"), "2-3", TokenWindows(ids, torch.ones_like(ids), {}), ["ghost"])
    # no spec draws windows given by hand
    assert by_hand.spec is None
    ghosted.save(by_hand.results["ghost"].model, tmp_path / "by-hand", recipe=by_hand)
    with pytest.raises(ValueError, match="no experiment spec"):
        load_spec(tmp_path / "by-hand")


def test_nothing_in_the_library_filters_methods_by_name():
    """Roles and labels come from the registry: no comparison with the strings "dense" or "none"."""
    import re
    from pathlib import Path

    pattern = re.compile(r"""(==|!=|\bin\b)\s*\(?\s*["'](dense|none|pruned)["']|["'](dense|none)["']\s*(==|!=)""")
    root = Path(__file__).resolve().parents[3] / "ghosted"
    candidates = root / "recovery" / "auto.py"  # its "none" is a candidate of a gap (no operator), not a method
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p != candidates
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_a_fit_on_calibrated_windows_saves_a_spec_that_draws_them_again(tmp_path):
    import ghosted
    from ghosted.experiments.session import Session
    from ghosted.experiments.spec_files import load_spec

    lm = tiny_loaded(6)
    calib = ghosted.calibrate(lm, "bundled:news", calib_seqs=3, seq_len=24, seed=5)
    run = ghosted.fit(lm, "2-3", calib, methods=["ghost"])
    ghosted.save(run.results["ghost"].model, tmp_path / "fitted", recipe=run)
    spec = load_spec(tmp_path / "fitted")
    assert (spec.model.source, spec.layers.drop, spec.methods) == ("tiny", "2-3", ["ghost"])
    cal = spec.calibration
    assert (cal.calib_seqs, cal.seq_len, cal.heldout_seqs, cal.seed) == (3, 24, 0, 5)
    again = Session(spec, lm).calibration()
    assert again.heldout is None and again.fit.input_ids.equal(calib.input_ids)  # the very windows it was fitted on
    rerun = Session(spec, lm).fit()
    assert rerun.recovery.results["ghost"].fits.keys() == run.results["ghost"].fits.keys()


def test_a_recipe_without_a_spec_says_what_it_lacks(tmp_path):
    import json

    import ghosted
    from ghosted.experiments.spec_files import load_spec
    from ghosted.experiments.spec_files import NO_SPEC

    lm = tiny_loaded(6)
    fit, held = ghosted.calibrate(lm, calib_seqs=3, seq_len=24), ghosted.calibrate(lm, calib_seqs=2, seq_len=24, seed=9)
    run = ghosted.fit(lm, "2-3", fit, methods=["ghost"], heldout=held)  # two draws: no spec makes them
    ghosted.save(run.results["ghost"].model, tmp_path / "two-draws", recipe=run)
    with pytest.raises(ValueError, match="no spec draws again"):
        load_spec(tmp_path / "two-draws")
    ghosted.save(run.results["ghost"].model, tmp_path / "no-run")
    with pytest.raises(ValueError, match="without the run that made it"):
        load_spec(tmp_path / "no-run")
    recipe = tmp_path / "no-run" / "ghosted_recipe.json"
    for unknown in (["windows"], "something else", 7):  # a file's own words are never repeated
        recipe.write_text(json.dumps({**json.loads(recipe.read_text()), "no_spec": unknown}))
        with pytest.raises(ValueError, match=NO_SPEC["older"]):
            load_spec(recipe)

"""The experiment spec: its JSON round trip, its command-line flags, and reruns from a recipe."""

import argparse
import json
import shlex

import pytest

from ghosted.cli import build_parser, main
from ghosted.experiments.spec import ExperimentSpec, _flat_name, _leaves
from ghosted.experiments.spec_files import load_spec
from ghosted.experiments.spec_flags import add_spec_args, command, spec_from_args

SMALL = ["--calib-seqs", "4", "--seq-len", "64", "--heldout-seqs", "2", "--eval-tokens", "256",
         "--eval-seq-len", "128", "--drop", "20-21"]
NOT_SPEC = {"help", "recipe", "out", "overwrite", "dry_run", "offload_folder",
            "seeds"}  # run flags, not settings (seeds: how many times the spec runs, each with its own seed)


def parser_of(command_name: str) -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices[command_name]


def changed_spec() -> ExperimentSpec:
    """A spec with a value other than the default in every section."""
    return ExperimentSpec().with_options(
        model="some/model", device="cpu", dtype="float32", trust_remote_code=True, calib="bundled:wiki",
        calib_seqs=7, seq_len=48, heldout_seqs=3, seed=5, batch_size=2, cache=False, eval="bundled:news",
        eval_tokens=999, eval_seq_len=33, tasks=["bundled-lastword"], task_limit=20, num_fewshot=1,
        drop="3,5-6", methods=["dense", "ghost"], ghost_mode="sequential", granularity="layer", eps=0.25,
        solver="pinv", rank=12, fold=False)


def test_json_round_trip_gives_the_same_spec():
    spec = changed_spec()
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["spec_version"] == 1
    assert data["calibration"]["calib_seqs"] == 7 and data["recovery"]["eps"] == 0.25
    assert data["layers"]["drop"] == "3,5-6"
    with pytest.warns(UserWarning, match="trust_remote_code.*never taken from a file"):
        back = ExperimentSpec.from_dict(data)
    assert back == spec.with_options(trust_remote_code=False)  # only the command line, the API or the app turn it on
    assert ExperimentSpec.from_dict({"spec_version": 1}) == ExperimentSpec()  # a missing field: its default


def test_defaults_are_the_run_defaults():
    spec = ExperimentSpec()
    cal, ev = spec.calibration, spec.evaluation
    assert (cal.calib_seqs, cal.seq_len, cal.heldout_seqs, cal.seed) == (32, 256, 8, 0)
    assert (ev.source, ev.eval_tokens, ev.eval_seq_len) == ("bundled:wiki", 16384, 512)
    assert spec.methods == ["dense", "none", "ghost-auto"] and spec.recovery.eps == 1e-6
    assert spec.calibration.cache is True and spec.recovery.fold is True and spec.layers.drop == ""


@pytest.mark.parametrize("data, key", [
    ({"spec_version": 1, "calibrations": {}}, "calibrations"),
    ({"spec_version": 1, "calibration": {"calib_seqs": 4, "windows": 8}}, "windows"),
    ({"spec_version": 1, "recovery": {"epsilon": 1.0}}, "epsilon"),
])
def test_unknown_keys_are_refused_by_name(data, key):
    with pytest.raises(ValueError, match=f"Unknown key.*{key}"):
        ExperimentSpec.from_dict(data)


def test_another_spec_version_is_refused():
    with pytest.raises(ValueError, match="spec_version 2"):
        ExperimentSpec.from_dict({"spec_version": 2})


def test_every_run_flag_maps_to_a_field_and_back():
    actions = {a.dest: a for a in parser_of("run")._actions}
    fields = {_flat_name(f): f for _, f in _leaves(ExperimentSpec)}
    dests = {f.metadata["flag"].lstrip("-").replace("-", "_") for f in fields.values()}
    assert set(actions) - NOT_SPEC == dests  # every run flag is a field, every field a run flag
    for f in fields.values():
        assert f.metadata["flag"] in actions[f.metadata["flag"].lstrip("-").replace("-", "_")].option_strings


@pytest.mark.parametrize("name", ["run", "export", "grid"])
def test_flag_defaults_equal_the_spec_defaults(name):
    required = ["--drop", "1", "--out", "x"] if name == "export" else []
    args = parser_of(name).parse_args(required)
    spec = spec_from_args(args, ignore=("n", "methods") if name == "grid" else ())
    want = ExperimentSpec().with_options(drop="1") if name == "export" else ExperimentSpec()
    if name == "grid":
        from ghosted.grid.run import grid_base

        want = grid_base().with_options(methods=spec.methods)
    assert spec == want


def test_given_flags_reach_their_fields():
    args = parser_of("run").parse_args(["--calib-seqs", "7", "--no-cache", "--tasks", "bundled-lastword,x",
                                        "--eps", "0.5", "--rank", "3", "--trust-remote-code", "--no-fold",
                                        "--methods", "none, ghost", "--protocol", "bundled"])
    spec = spec_from_args(args)
    assert spec.calibration.calib_seqs == 7 and spec.calibration.cache is False
    assert spec.evaluation.tasks == ["bundled-lastword", "x"] and spec.evaluation.protocol == "bundled"
    assert (spec.recovery.eps, spec.recovery.rank, spec.recovery.fold) == (0.5, 3, False)
    assert spec.model.trust_remote_code is True and spec.methods == ["none", "ghost"]


def test_the_command_of_a_spec_parses_back_to_it():
    spec = changed_spec()
    words = shlex.split(command(spec).replace("\\\n", " "))
    assert words[:4] == ["python", "-m", "ghosted", "run"]
    assert spec_from_args(parser_of("run").parse_args(words[4:])) == spec


def test_flags_given_over_a_recipe_override_only_themselves():
    recipe = changed_spec()
    args = parser_of("run").parse_args(["--eval-tokens", "128", "--seed", "0"])
    spec = spec_from_args(args, base=recipe)
    assert spec == recipe.with_options(eval_tokens=128, seed=0)  # --seed 0 is the default, and still given


def test_a_parser_without_recording_can_still_be_read():
    p = argparse.ArgumentParser()
    add_spec_args(p, ["calib_seqs"], defaults={"calib_seqs": 9})
    assert spec_from_args(p.parse_args([])).calibration.calib_seqs == 9


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, bundled):
    """``run --out a.json`` on the bundled model with small settings."""
    out = tmp_path_factory.mktemp("spec") / "a.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ghosted.experiments.session.load_spec_model", _bundled_loader(bundled))
        assert main(["run", *SMALL, "--methods", "dense,ghost", "--out", str(out)]) == 0
    return out, json.loads(out.read_text())


def _bundled_loader(bundled):
    def load(spec, offload_folder=None):
        assert spec.model.source == bundled.source  # the recipe's model is what would be loaded
        return bundled
    return load


def _ppl(report: dict) -> dict:
    return {e["method"]: e["ppl"] for e in report["results"]}


def test_a_results_json_reruns_to_identical_perplexities(first_run, tmp_path, monkeypatch, bundled):
    a_path, a = first_run
    assert ExperimentSpec.from_dict(a["spec"]) == spec_from_args(parser_of("run").parse_args(
        [*SMALL, "--methods", "dense,ghost"]))
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", _bundled_loader(bundled))
    b_path = tmp_path / "b.json"
    assert main(["run", "--recipe", str(a_path), "--no-cache", "--out", str(b_path)]) == 0
    b = json.loads(b_path.read_text())
    assert _ppl(b) == _ppl(a) and all(v > 1 for v in _ppl(a).values())  # exact equality, on CPU
    assert {e["statistics"] for e in b["results"] if "statistics" in e} == {"computed"}  # not read from a cache
    assert b["spec"] == ExperimentSpec.from_dict(a["spec"]).with_options(cache=False).to_dict()


def test_an_exported_recipe_reruns_to_identical_perplexities(first_run, tmp_path, monkeypatch, bundled):
    _, a = first_run
    monkeypatch.setattr("ghosted.cli.export.load_from_args", lambda *_: bundled)
    folder = tmp_path / "model"
    assert main(["export", *SMALL[:6], "--drop", "20-21", "--method", "ghost", "--out", str(folder)]) == 0
    saved = json.loads((folder / "ghosted_recipe.json").read_text())
    assert saved["spec"]["methods"] == ["ghost"] and saved["spec"]["layers"]["drop"] == "20-21"
    assert saved["spec"]["calibration"] == a["spec"]["calibration"]
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", _bundled_loader(bundled))
    c_path = tmp_path / "c.json"
    assert main(["run", "--recipe", str(folder / "ghosted_recipe.json"), "--eval-tokens", "256",
                 "--eval-seq-len", "128", "--out", str(c_path)]) == 0
    assert _ppl(json.loads(c_path.read_text())) == {"ghost": _ppl(a)["ghost"]}
    assert load_spec(folder) == load_spec(folder / "ghosted_recipe.json")  # a saved folder names its recipe


def test_a_recipe_without_a_spec_is_refused_clearly(tmp_path, capsys):
    old = tmp_path / "ghosted_recipe.json"
    old.write_text(json.dumps({"format": "ghosted-recipe", "format_version": 2, "method": "ghost"}))
    assert main(["run", "--recipe", str(old), "--dry-run"]) == 2
    assert "holds no experiment spec" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="No recipe"):
        load_spec(tmp_path / "missing.json")


def test_the_api_runs_a_spec_as_the_command_line_does():
    import ghosted
    from ghosted.experiments.run import run_experiment
    from tests.tiny import tiny_loaded

    options = dict(drop="2-3", methods=["dense", "ghost"], calib_seqs=4, seq_len=32, heldout_seqs=2, eval_tokens=64,
                   eval_seq_len=32, batch_size=2, device="cpu", dtype="float32", cache=False)
    spec = ExperimentSpec().with_options(**options)
    by_api, _ = ghosted.run(model=tiny_loaded(6), **options)
    by_spec, _ = run_experiment(spec, loaded=tiny_loaded(6))
    assert _ppl(by_api) == _ppl(by_spec) and by_api["spec"] == spec.to_dict()


def test_a_file_of_an_earlier_version_reads_under_the_current_names():
    old = {"spec_version": 1, "calibration": {"count": 4, "length": 64, "heldout": 2},
           "evaluation": {"tokens": 2048, "window": 128}}
    spec = ExperimentSpec.from_dict(old)
    assert spec.options()["calib_seqs"] == 4 and spec.calibration.seq_len == 64 and spec.calibration.heldout_seqs == 2
    assert (spec.evaluation.eval_tokens, spec.evaluation.eval_seq_len) == (2048, 128)
    assert "count" not in spec.to_dict()["calibration"] and spec.to_dict()["calibration"]["calib_seqs"] == 4
    with pytest.raises(ValueError, match="two names"):
        ExperimentSpec.from_dict({"spec_version": 1, "calibration": {"count": 4, "calib_seqs": 5}})


def test_each_setting_has_one_name_from_flag_to_field():
    from dataclasses import fields

    from ghosted.experiments.spec import _leaves

    for path, f in _leaves(ExperimentSpec):  # a field's name is its flat name, or its section's source
        flat = f.metadata.get("option") or f.metadata["flag"].lstrip("-").replace("-", "_")
        assert f.name == flat or (f.name == "source" and flat in ("model", "calib", "eval")), (path, flat)
    assert [f.name for f in fields(ExperimentSpec().calibration)][:4] == ["source", "calib_seqs", "seq_len",
                                                                         "heldout_seqs"]

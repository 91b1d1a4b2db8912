"""The precompute script's lists: the default plan matches the pages' defaults, and a teacher's file is read as
untrusted input (one clear message naming the entry, exit 2 from the script)."""

from __future__ import annotations

import json

import pytest

from ghosted.service import precompute, workbench as wb
from ghosted.service.deploy import CLASSROOM, DEMO, LOCAL


def test_the_default_plan_is_every_preset_of_the_bundled_model_at_the_page_defaults():
    plan = precompute.default_plan()
    assert [e.preset for e in plan] == list(wb.PRESETS)
    assert all(e.model == wb.BUNDLED_MODEL and e.methods == wb.FitRequest().methods for e in plan)
    assert all(set(e.eval_tokens) == {wb.EvalRequest().eval_tokens, 1024} for e in plan)


def test_a_teachers_toml_list(tmp_path):
    path = tmp_path / "class.toml"
    path.write_text('[[experiment]]\nmodel = "HuggingFaceTB/SmolLM2-360M-Instruct"\nlayers = "20-25"\n'
                    'methods = ["ghost-auto", "ghost"]\neval_tokens = [1024]\n\n'
                    '[[experiment]]\npreset = "ShortGPT n"\nn = 4\n')
    first, second = precompute.read_plan(path, CLASSROOM)
    assert first.layers == "20-25" and first.preset is None and first.methods == ("ghost-auto", "ghost")
    assert second.model == wb.BUNDLED_MODEL and second.preset == "ShortGPT n" and second.n == 4


@pytest.mark.parametrize("entries, message", [
    ([{"model": "some/big-model"}], "not offered"),
    ([{"layers": "3-5", "trust_remote_code": True}], "unknown setting"),
    ([{"methods": ["ghost", "rm -rf"]}], "unknown method"),
    ([{"methods": "ghost"}], "methods must be a list"),
    ([{"eval_tokens": [100_000]}], "evaluation tokens"),
    ([{"eval_tokens": [True]}], "eval_tokens"),
    ([{"preset": "everything"}], "unknown preset"),
    ([{"preset": "ShortGPT n", "layers": "3"}], "not both"),
    ([{"n": 0}], "at least 1"),
    (["just a string"], "expected a table"),
    ([], "non-empty list"),
    ({"experiment": 3}, "non-empty list"),
    ([{}] * 65, "at most 64"),
])
def test_a_bad_list_is_refused_naming_what_is_wrong(tmp_path, entries, message):
    path = tmp_path / "class.json"
    path.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=message):
        precompute.read_plan(path, DEMO)


def test_unreadable_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a readable"):
        precompute.read_plan(tmp_path / "missing.json", LOCAL)
    broken = tmp_path / "broken.toml"
    broken.write_text("[[experiment]\n")
    with pytest.raises(ValueError, match="not a readable"):
        precompute.read_plan(broken, LOCAL)


def test_the_script_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GHOSTED_DEMO", "1")
    path = tmp_path / "class.json"
    path.write_text(json.dumps([{"model": "/etc/passwd"}]))
    assert precompute.main(["--list", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("precompute: experiment 1:") and "\n" not in err


class _Report:
    """Stands in for a stored influence result: what ``apply_preset`` reads is stubbed below."""

    report = object()


def test_the_server_warms_the_fits_whose_layers_are_known_without_a_forward_pass(tmp_path, monkeypatch):
    key = wb.model_key(wb.DEFAULT_MODEL)
    plan = [precompute.Experiment(layers="20-21", methods=("ghost",)),
            precompute.Experiment(preset="ShortGPT n", n=3),
            precompute.Experiment(model="someone/else", layers="1-2")]  # another model: not this server's
    store = wb.shared_store(folder=tmp_path)
    warm = precompute.warm_requests(plan, store, key, n_layers=30)
    assert warm == [wb.FitRequest(model=key, layers=(20, 21), methods=("ghost",))]  # no report yet: no preset

    monkeypatch.setattr(wb, "apply_preset", lambda report, preset, n: (list(range(10, 10 + n)), "stub"))
    store.put(wb.InfluenceRequest(model=key).key(), _Report(), "report-in-memory")
    warm = precompute.warm_requests(plan, store, key, n_layers=30)
    assert [w.layers for w in warm] == [(20, 21), (10, 11, 12)]
    assert precompute.warm_requests(plan, store, "another|model", n_layers=30) == []


def test_the_server_plan_is_the_list_it_was_precomputed_with(tmp_path, monkeypatch):
    listed = tmp_path / "class.toml"
    listed.write_text('[[experiment]]\nlayers = "3-4"\nmethods = ["ghost"]\n')
    monkeypatch.setenv("GHOSTED_PRECOMPUTE_LIST", str(listed))
    assert [e.layers for e in precompute.server_plan(LOCAL)] == ["3-4"]
    monkeypatch.delenv("GHOSTED_PRECOMPUTE_LIST")
    assert precompute.server_plan(LOCAL) == precompute.default_plan()

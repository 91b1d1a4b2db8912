"""The app's backend: typed requests whose keys name every choice, computed on a tiny model, and their
results written to and read back from the shared store's disk copy (checked as untrusted input)."""

from __future__ import annotations

import json

import pytest

from ghosted.data.sources import TextSource
from ghosted.service import workbench as wb
from ghosted.service.deploy import DEMO, LOCAL
from ghosted.service.store import PREFIX
from tests.tiny import tiny_loaded

SMALL_FIT = dict(layers=(2, 3), calib_seqs=4, seq_len=24, heldout_seqs=2, methods=("ghost",), batch_size=2)


def test_keys_change_with_every_choice_and_only_with_them():
    base = wb.FitRequest(**SMALL_FIT)
    assert base.key() == wb.FitRequest(**SMALL_FIT).key()
    for change in ({"layers": (2, 4)}, {"seed": 1}, {"methods": ("ghost", "replaceme-ls")}, {"text": "bundled:wiki"},
                   {"model": "other|auto|auto|None|False"}, {"ghost_mode": "sequential"}):
        assert wb.FitRequest(**{**SMALL_FIT, **change}).key() != base.key(), change
    assert wb.EvalRequest(fit=base).key() != wb.EvalRequest(fit=wb.FitRequest(**{**SMALL_FIT, "seed": 1})).key()
    assert wb.EvalRequest(fit=base, eval_tokens=1024).key() != wb.EvalRequest(fit=base).key()


def test_an_upload_is_named_by_its_content():
    one, same, other = (TextSource.from_string("notes.txt", t) for t in ("alpha beta", "alpha beta", "alpha gamma"))
    keys = [wb.InfluenceRequest(text=t).key() for t in (one, same, other)]
    assert keys[0] == keys[1] != keys[2]


def test_requests_refuse_what_the_deployment_forbids():
    with pytest.raises(ValueError, match="at least one layer"):
        wb.FitRequest().check(LOCAL, 30)
    with pytest.raises(ValueError, match="keep at least one"):
        wb.FitRequest(layers=tuple(range(6))).check(LOCAL, 6)
    with pytest.raises(ValueError, match="calibration tokens"):
        wb.FitRequest(layers=(3,), calib_seqs=512).check(DEMO, 30)
    with pytest.raises(ValueError, match="evaluation tokens"):
        wb.EvalRequest(eval_tokens=100_000).check(DEMO)
    with pytest.raises(ValueError, match="does not compute"):
        wb.InfluenceRequest(metrics=("ppl_single",)).check(DEMO)
    with pytest.raises(ValueError, match="at least one criterion"):
        wb.InfluenceRequest(metrics=()).check(LOCAL)
    with pytest.raises(ValueError, match="new tokens"):
        wb.GenerationRequest(prompts=("Hi",), new_tokens=1000).check(DEMO)


def test_the_flow_on_a_tiny_model_and_its_results_from_disk(tmp_path):
    lm = tiny_loaded(layers=6)
    influence = wb.InfluenceRequest(model="tiny", calib_seqs=4, seq_len=24, rec_n=(2,),
                                    metrics=("streamline_cosine", "block_influence"))
    measured = influence.compute(lm)
    layers, reason = wb.apply_preset(measured.report, "Streamline block of n", 2)
    assert len(layers) == 2 and layers[1] == layers[0] + 1 and reason
    fit = wb.FitRequest(model="tiny", **{**SMALL_FIT, "layers": tuple(layers)})
    fitted = fit.compute(lm)
    assert fitted.methods == ["none", "ghost"] and fitted.layers == layers and fitted.evaluation is None
    assert set(fitted.frames) >= {"errors", "spectra", "asymmetry"}
    evaluation = wb.EvalRequest(fit=fit, eval_tokens=96, eval_seq_len=24).compute(lm, fitted)
    assert evaluation.table.labels == ["dense", "pruned", "ghost"]
    assert fitted.with_results(evaluation=evaluation).evaluation is evaluation and fitted.evaluation is None

    store = wb.shared_store(folder=tmp_path)
    store.put(influence.key(), measured, kind="influence")
    store.put("evaluate-1", evaluation, kind="evaluate")
    store.put(fit.key(), fitted, kind="fit")  # no plain-JSON form: memory only
    fresh = wb.shared_store(folder=tmp_path)
    again = fresh.get(influence.key())
    assert again.protocol == measured.protocol and again.report.num_layers == 6
    assert again.report.layer_values("block_influence").tolist() == pytest.approx(
        measured.report.layer_values("block_influence").tolist())
    assert wb.apply_preset(again.report, "Streamline block of n", 2)[0] == layers
    assert fresh.get("evaluate-1").table.frame().ppl.tolist() == pytest.approx(evaluation.table.frame().ppl.tolist())
    assert fresh.get(fit.key()) is None


@pytest.mark.parametrize("kind, result", [
    ("evaluate", {"table": [{"method": "dense", "label": "dense", "ppl": "oops", "nll": 1.0}], "protocol": {}}),
    ("evaluate", {"table": [{"method": "dense", "label": "dense", "nll": 1.0}], "protocol": {}}),
    ("evaluate", {"table": [{"method": {"nested": 1}, "label": "x", "ppl": 1.0, "nll": 1.0}], "protocol": {}}),
    ("influence", {"model": "m", "protocol": {}, "num_layers": -3, "meta": {}, "blocks": [], "layers": []}),
    ("influence", {"model": "m", "protocol": {}, "num_layers": 4, "meta": {}, "blocks": "x", "layers": []}),
    ("generate", {"prompts": ["a", "b"], "outputs": {"dense": ["only one"]}}),
    ("generate", {"prompts": ["a"], "outputs": {"dense": ["x"]}, "departures": {"pruned": ["3"]}}),
])
def test_a_tampered_result_file_is_refused(tmp_path, kind, result):
    key = f"{kind}-abc"
    (tmp_path / f"{PREFIX}{key}.json").write_text(json.dumps({"format": 1, "key": key, "kind": kind,
                                                               "result": result}))
    with pytest.warns(RuntimeWarning, match="unreadable stored result"):
        assert wb.shared_store(folder=tmp_path).get(key) is None


def test_generations_depart_from_dense_where_their_tokens_first_differ(tmp_path, monkeypatch):
    from ghosted.evaluation import generation

    lm = tiny_loaded(layers=6)
    fit = wb.FitRequest(model="tiny", **SMALL_FIT)
    fitted = fit.compute(lm)
    models = wb.variants(lm, fitted)
    said = {id(models["dense"]): ["abcdef", "xyz"], id(models["pruned"]): ["abXdef", "xyz"],
            id(models["ghost"]): ["abcdef", "xy"]}  # the character tokenizer: one token per character
    monkeypatch.setattr(generation, "generate", lambda model, tokenizer, prompts, **config: said[id(model)])
    shown = wb.GenerationRequest(fit=fit, prompts=("a", "b"), new_tokens=6).compute(lm, fitted)
    assert list(shown.outputs) == ["dense", "pruned", "ghost"]
    assert shown.departures == {"pruned": [2, None], "ghost": [None, 2]}  # a shorter text departs where it ends
    store = wb.shared_store(folder=tmp_path)
    store.put("generate-1", shown, kind="generate")
    again = wb.shared_store(folder=tmp_path).get("generate-1")
    assert again.departures == shown.departures and again.outputs == shown.outputs


def test_the_shared_model_is_named_canonically_and_restricted_deployments_fix_its_dtype_and_device(tmp_path,
                                                                                                  monkeypatch):
    from ghosted.service.deploy import CLASSROOM, DEMO, LOCAL

    chosen = {**wb.DEFAULT_MODEL, "source": "bundled", "dtype": "bfloat16", "device": "cpu"}
    for cfg in (DEMO, CLASSROOM):
        assert wb.canonical_model(chosen, cfg) == wb.DEFAULT_MODEL  # every visitor's choice: one cache entry
        assert wb.model_key(wb.canonical_model({**chosen, "source": "default"}, cfg)) == wb.BUNDLED_KEY
    assert wb.canonical_model(chosen, LOCAL) == {**chosen, "source": wb.BUNDLED_MODEL}  # a workstation chooses
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert wb.canonical_source("./model/") == wb.canonical_source(str(folder)) == str(folder.resolve())
    assert wb.canonical_source(" HuggingFaceTB/SmolLM2-135M-Instruct ") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_local_model_is_keyed_by_its_content_so_a_rewritten_checkpoint_gets_new_results(tmp_path):
    from ghosted.models.loading import LoadedModel
    from tests.tiny import tiny_model

    folder = tmp_path / "ckpt"
    tiny_model("llama", layers=4, seed=0).save_pretrained(folder)
    spec = {**wb.DEFAULT_MODEL, "source": str(folder)}

    def key_now():
        import transformers as tf

        model = tf.AutoModelForCausalLM.from_pretrained(folder)
        return wb.model_key(spec, wb.local_identity(LoadedModel(model, None, str(folder), "folder", "cpu",
                                                                "float32", 0.0)))

    before = key_now()
    assert key_now() == before  # the same files: the same key, so its stored results are found again
    tiny_model("llama", layers=4, seed=1).save_pretrained(folder)  # other weights under the same path
    assert key_now() != before
    assert wb.InfluenceRequest(model=key_now()).key() != wb.InfluenceRequest(model=before).key()
    bundled = LoadedModel(None, None, wb.BUNDLED_MODEL, "bundled", "cpu", "float32", 0.0)
    assert wb.local_identity(bundled) is None and wb.model_key(wb.DEFAULT_MODEL) == wb.BUNDLED_KEY

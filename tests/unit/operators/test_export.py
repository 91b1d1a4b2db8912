"""Saving a recovered model and loading it back: same logits, clean plain checkpoints, a recipe."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from ghosted.cli import main
from ghosted.models.loading import OPERATORS_FILE, RECIPE_FILE, read_recipe
from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.operators.sites import operators_of
from ghosted.recovery.fitting import METHODS, RecoveryConfig, recover
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model

IDS = random_ids(2, 20, seed=5)


def windows(n: int = 8, length: int = 24, seed: int = 1) -> TokenWindows:
    ids = random_ids(n, length, seed=seed)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids", "n_windows": n, "seq_len": length})


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # (B, T, V)


def plain_load(folder):
    """transformers alone, no ghosted code: (model, loading info)."""
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    return model.eval(), info


def assert_clean_load(info: dict) -> None:
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


@pytest.mark.parametrize("family, drop, methods", [
    ("llama", "2-3", ["ghost", "linearpatch-rotate"]),
    ("llama", "0,1,4", ["ghost"]),  # two operators before layer 0 (in order) and one after layer 1
    ("gemma3", "1,3", ["ghost", "replaceme-ls"]),  # sliding/full layer types; hooked ReplaceMe
])
def test_roundtrip_gives_identical_logits(tmp_path, family, drop, methods):
    model = tiny_model(family)
    run = recover(model, drop, methods, windows(), config=RecoveryConfig(granularity="layer"))
    for method in methods:
        recovered = run.results[method].model
        folder = save_recovered(recovered, tmp_path / method, recipe=run)
        loaded = load_recovered(folder, device="cpu")
        # bitwise: export promises the same weights, so the same float32 ops give the same bits
        # (same machine, same thread count)
        assert torch.equal(logits(loaded.model), logits(recovered))
        assert len(operators_of(loaded.model)) == len(operators_of(recovered)) > 0
        assert (folder / OPERATORS_FILE).exists()
        plain, info = plain_load(folder)  # the kept weights alone load cleanly
        assert_clean_load(info)
        assert not torch.allclose(logits(plain), logits(recovered))  # ... but are not the recovery


def test_operator_order_and_sites_are_kept(tmp_path):
    model = tiny_model("llama")
    run = recover(model, "0,1,4", ["ghost"], windows(), config=RecoveryConfig(granularity="layer"))
    folder = save_recovered(run.results["ghost"].model, tmp_path / "g", recipe=run)
    sites = [(o["layer"], o["position"], o["order"], tuple(o["boundary"])) for o in read_recipe(folder)["operators"]]
    assert sites == [(0, "before", 0, (0, 1)), (0, "before", 1, (1, 2)), (1, "after", 0, (4, 5))]
    loaded = load_recovered(folder, device="cpu").model
    chain = [op.boundary for op in loaded.model.layers[0].ghosted_pre]
    assert chain == [(0, 1), (1, 2)]
    with safe_open(str(folder / OPERATORS_FILE), framework="pt") as handle:
        assert sorted(handle.keys()) == ["op0.weight", "op1.weight", "op2.weight"]
        assert json.loads(handle.metadata()["ghosted_operators"])[2]["original_layer"] == 3


def test_weights_file_has_no_operator_keys_and_config_is_updated(tmp_path):
    model = tiny_model("gemma3")
    run = recover(model, "1,3", ["ghost"], windows())
    folder = save_recovered(run.results["ghost"].model, tmp_path / "g", recipe=run)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
    assert keys and not any("ghosted" in k for k in keys)
    assert not any(k.startswith("model.layers.4.") for k in keys)  # 6 - 2 layers, renumbered 0..3
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 4
    original = model.config.layer_types
    assert config["layer_types"] == [original[i] for i in (0, 2, 4, 5)]


def test_folded_replaceme_is_a_plain_checkpoint(tmp_path):
    model = tiny_model("llama")
    run = recover(model, "2-3", ["replaceme-ls"], windows())
    recovered = run.results["replaceme-ls"].model
    assert operators_of(recovered) == []  # folded into down_proj
    folder = save_recovered(recovered, tmp_path / "rm", recipe=run)
    assert not (folder / OPERATORS_FILE).exists()
    recipe = read_recipe(folder)
    assert recipe["checkpoint"] == "plain" and "AutoModelForCausalLM" in recipe["load_with"]
    plain, info = plain_load(folder)
    assert_clean_load(info)
    assert torch.equal(logits(plain), logits(recovered))  # same weights, same bits (same machine, same thread count)
    assert torch.equal(logits(load_recovered(folder, device="cpu").model), logits(recovered))
    pruned = recover(model, "2-3", ["none"], windows()).results["none"].model
    assert not torch.allclose(logits(plain), logits(pruned))  # the fold is in the saved weights


def test_resaving_a_plain_model_removes_stale_operators(tmp_path):
    model = tiny_model("llama")
    run = recover(model, "2-3", ["ghost", "none"], windows())
    folder = save_recovered(run.results["ghost"].model, tmp_path / "m", recipe=run)
    assert (folder / OPERATORS_FILE).exists()
    save_recovered(run.results["none"].model, folder, recipe=run, overwrite=True)
    assert not (folder / OPERATORS_FILE).exists()
    # same weights, same bits (same machine, same thread count)
    assert torch.equal(logits(load_recovered(folder, device="cpu").model), logits(run.results["none"].model))


def test_recipe_records_how_the_model_was_made(tmp_path):
    model = tiny_model("llama")
    calib = windows()
    run = recover(model, "3-4", ["ghost"], calib, config=RecoveryConfig(eps=1e-4))
    folder = save_recovered(run.results["ghost"].model, tmp_path / "g", recipe=run)
    recipe = json.loads((folder / RECIPE_FILE).read_text())
    assert recipe["dropped_layers"] == [3, 4] and recipe["dropped_spec"] == "3-4"
    assert recipe["kept_layers"] == [0, 1, 2, 5] and recipe["base_model"]["layers"] == 6
    assert recipe["method"] == "ghost" and recipe["settings"]["eps"] == 1e-4
    assert recipe["calibration"]["source"] == "random ids" and recipe["calibration"]["n_windows"] == 8
    assert set(recipe["versions"]) >= {"ghosted", "transformers", "torch"}
    assert recipe["checkpoint"] == "needs-ghosted"
    loaded = load_recovered(folder, device="cpu")
    assert loaded.extra["recipe"]["dropped_spec"] == "3-4"
    assert loaded.extra["operators"] == 1
    assert loaded.extra["recipe"]["kept_layers"] == [0, 1, 2, 5]  # original index of each layer


def test_recipe_without_a_run_is_inferred_and_extra_fields_override(tmp_path):
    model = tiny_model("llama")
    run = recover(model, "4-5", ["ghost"], windows())  # drops the last two layers
    folder = save_recovered(run.results["ghost"].model, tmp_path / "g", recipe={"note": "hello"})
    recipe = read_recipe(folder)
    assert recipe["dropped_layers"] == [4, 5]  # the operator's gap end says the base had 6 layers
    assert recipe["method"] == "ghost" and recipe["note"] == "hello"


def test_saving_never_changes_the_model(tmp_path):
    model = tiny_model("llama")
    before = logits(model)
    run = recover(model, "2-3", ["ghost"], windows())
    recovered = run.results["ghost"].model
    keys = list(recovered.state_dict())
    out = logits(recovered)
    save_recovered(recovered, tmp_path / "g", recipe=run)
    assert list(recovered.state_dict()) == keys and any("ghosted_post" in k for k in keys)
    # untouched (same machine, same thread count)
    assert torch.equal(logits(recovered), out) and torch.equal(logits(model), before)


def test_unknown_operator_type_is_refused(tmp_path):
    model = tiny_model("llama")
    recovered = recover(model, "2-3", ["ghost"], windows()).results["ghost"].model
    chain = recovered.model.layers[1].ghosted_post
    chain[0].__class__ = type("HomeMadeOperator", (torch.nn.Module,), {"forward": chain[0].forward})
    with pytest.raises(ValueError, match="HomeMadeOperator"):
        save_recovered(recovered, tmp_path / "x")


@pytest.mark.skipif("ghost-robust" not in METHODS, reason="robust methods not in this build")
def test_robust_operator_roundtrip(tmp_path):
    model = tiny_model("llama")
    calib = windows()
    run = recover(model, "2-3", ["ghost-robust"], calib, windows(4, seed=2),
                  RecoveryConfig(sink_map="affine"))
    recovered = run.results["ghost-robust"].model
    folder = save_recovered(recovered, tmp_path / "r", recipe=run)
    loaded = load_recovered(folder, device="cpu").model
    assert torch.equal(logits(loaded), logits(recovered))  # same weights, same bits (same machine, same thread count)
    assert read_recipe(folder)["operators"][0]["kind"] == "robust"


def test_load_recovered_refuses_a_folder_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_recovered(tmp_path)


@pytest.mark.slow
def test_bundled_model_with_seven_layers_dropped(bundled, tmp_path):
    from ghosted.evaluation.generation import generate
    from ghosted.data.windows import calibration_windows, evaluation_windows

    calib = calibration_windows(bundled.tokenizer, "bundled:news", 8, 128)  # 1024 tokens
    run = recover(bundled.model, "20-26", ["ghost"], calib)
    recovered = run.results["ghost"].model
    folder = save_recovered(recovered, tmp_path / "smollm2-ghost", bundled, recipe=run)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", OPERATORS_FILE, RECIPE_FILE, "tokenizer.json"} <= names
    loaded = load_recovered(folder)
    ids = evaluation_windows(bundled.tokenizer, "bundled:wiki", 256, 128).input_ids  # (2, 128)
    # same weights, same bits (same machine, same thread count)
    assert torch.equal(logits(loaded.model, ids), logits(recovered, ids))
    assert loaded.model.config.num_hidden_layers == 23
    prompt = "The capital of France is"
    assert generate(loaded.model, loaded.tokenizer, prompt, max_new_tokens=8) == \
        generate(recovered, bundled.tokenizer, prompt, max_new_tokens=8)
    recipe = loaded.extra["recipe"]
    assert recipe["base_model"]["source"] == bundled.source and recipe["base_model"]["layers"] == 30
    assert recipe["calibration"]["n_windows"] == 8 and recipe["calibration"]["seq_len"] == 128


@pytest.fixture
def tiny_folder(bundled, tmp_path):
    """A tiny random Llama saved with the bundled tokenizer, so the CLI can calibrate on text."""
    from tests.tiny import tiny_config

    config = tiny_config("llama")
    config.vocab_size = len(bundled.tokenizer)
    model = AutoModelForCausalLM.from_config(config).eval()
    folder = tmp_path / "tiny-with-tokenizer"
    model.save_pretrained(folder)
    bundled.tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("method, checkpoint", [("replaceme-ls", "plain"), ("ghost", "needs-ghosted")])
def test_cli_export(tiny_folder, tmp_path, capsys, method, checkpoint):
    out = tmp_path / "cli"
    code = main(["export", "--model", str(tiny_folder), "--drop", "2-3", "--method", method,
                 "--calib-seqs", "4", "--seq-len", "64", "--heldout-seqs", "2", "--device", "cpu",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "model.safetensors" in printed and ("from_pretrained" in printed) == (checkpoint == "plain")
    recipe = read_recipe(out)
    assert recipe["method"] == method and recipe["dropped_spec"] == "2-3"
    assert recipe["checkpoint"] == checkpoint and recipe["calibration"]["n_windows"] == 4
    assert recipe["base_model"]["source"] == str(tiny_folder)
    plain, info = plain_load(out)
    assert_clean_load(info)
    assert plain.config.num_hidden_layers == 4
    assert load_recovered(out, device="cpu").tokenizer is not None


def test_cli_export_reports_bad_layers(tiny_folder, tmp_path, capsys):
    code = main(["export", "--model", str(tiny_folder), "--drop", "4-9", "--out", str(tmp_path / "x")])
    assert code == 2 and "do not exist" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

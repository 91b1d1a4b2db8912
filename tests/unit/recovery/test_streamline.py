"""LLM-Streamline's trained replacements on tiny models: training, held-out error, seeds, export."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from ghosted.calibration.collect import Gap
from ghosted.models.loading import OPERATORS_FILE, read_recipe
from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.operators.modules import FFNOperator
from ghosted.operators.sites import operators_of
from ghosted.recovery.fitting import METHODS, RecoveryConfig, recover
from ghosted.recovery.streamline import StreamlineConfig, _lr_factor, capture_pairs
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model

IDS = random_ids(2, 14, seed=5)


def windows(n=8, t=24, seed=0) -> TokenWindows:
    ids = random_ids(n, t, seed)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids", "n_windows": n, "seq_len": t})


def checksum(model) -> float:
    return float(sum(p.double().sum() for p in model.parameters()))


def run_streamline(model, method, seed=0, **options):
    cfg = RecoveryConfig(streamline=StreamlineConfig(epochs=6, seed=seed, **options))
    return recover(model, "2-3", [method], windows(), windows(4, seed=9), cfg)


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("method", ["streamline-ffn", "streamline-layer"])
def test_training_lowers_the_loss_and_the_heldout_boundary_error(method):
    model = tiny_model("llama")
    before = checksum(model)
    seen = []
    cfg = RecoveryConfig(streamline=StreamlineConfig(epochs=6))
    run = recover(model, "2-3", [method], windows(), windows(4, seed=9), cfg,
                  progress=lambda stage, done, total: seen.append((stage, done, total)))
    row = run.choices().iloc[0]
    assert row.final_loss < row.initial_loss
    assert row.heldout_relative_error < 1.0  # better than no recovery on windows never trained on
    assert checksum(model) == before  # the base model is untouched
    training = [s for s in seen if s[0].startswith("training")]
    assert training and training[-1][1] == training[-1][2]  # progress reaches its total


def test_the_layer_replacement_starts_from_the_first_removed_layer_and_its_error_is_measured_independently():
    model = tiny_model("llama")
    run = run_streamline(model, "streamline-layer")
    row = run.choices().iloc[0]
    assert row.source_layer == 2
    built = run.results["streamline-layer"].model
    assert built.config.num_hidden_layers == 5 and built.ghosted_layers == [0, 1, 2, 4, 5]
    trained = built.model.layers[2]
    assert trained.self_attn.q_proj.weight is not model.model.layers[2].self_attn.q_proj.weight
    held = windows(4, seed=9)
    pairs = capture_pairs(model, held, Gap(2, 4), 10**6, 0)
    with torch.no_grad():
        hidden = built(held.input_ids, output_hidden_states=True).hidden_states[3]  # entering position 3
    error = float(((hidden - pairs.y) ** 2).sum() / ((pairs.x - pairs.y) ** 2).sum())
    assert error == pytest.approx(row.heldout_relative_error, rel=1e-3)


@pytest.mark.parametrize("method", ["streamline-ffn", "streamline-layer"])
def test_same_seed_same_weights_other_seed_other_weights(method):
    model = tiny_model("llama")
    a = logits(run_streamline(model, method, seed=1).results[method].model)
    b = logits(run_streamline(model, method, seed=1).results[method].model)
    assert torch.equal(a, b)
    if method == "streamline-ffn":  # the layer copy starts from the same weights whatever the seed
        c = logits(run_streamline(model, method, seed=2).results[method].model)
        assert not torch.equal(a, c)


@pytest.mark.parametrize("method", ["streamline-ffn", "streamline-layer"])
def test_generation_with_kv_cache_and_save_load(tmp_path, method):
    model = tiny_model("llama")
    run = run_streamline(model, method)
    built = run.results[method].model
    ids = random_ids(1, 6, seed=7)
    mask = torch.ones_like(ids)
    cached = built.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=True)
    plain = built.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
    folder = save_recovered(built, tmp_path / method, recipe=run)
    if method == "streamline-ffn":
        ops = [op for _, _, op in operators_of(built)]
        assert len(ops) == 1 and isinstance(ops[0], FFNOperator)
        assert read_recipe(folder)["operators"][0]["kind"] == "ffn"
        assert torch.equal(logits(load_recovered(folder, device="cpu").model), logits(built))
    else:  # a plain checkpoint with the trained layer in it
        assert not (folder / OPERATORS_FILE).exists()
        plain_model = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert torch.equal(logits(plain_model), logits(built))


def test_schedule_warms_up_then_decays_to_min_lr():
    cfg = StreamlineConfig(lr=1e-3, min_lr=1e-4, warmup=0.1)
    factors = [_lr_factor(step, 100, cfg) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and max(factors) == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1, abs=0.01) and factors[50] > factors[90]
    assert {"streamline-ffn", "streamline-layer", "prunecomp", "ghost-lowrank"} <= set(METHODS)


@pytest.mark.parametrize("drop", ["0-1", "1,3-4"])
def test_every_new_method_runs_on_layer_zero_and_non_contiguous_drops(drop):
    model = tiny_model("llama", layers=6)
    before = checksum(model)
    methods = ["ghost-lowrank", "ghost-lowrank-robust", "prunecomp", "streamline-ffn", "streamline-layer"]
    cfg = RecoveryConfig(rank=4, streamline=StreamlineConfig(epochs=1))
    run = recover(model, drop, methods, windows(), windows(2, seed=1), cfg)
    for name in methods:
        assert torch.isfinite(logits(run.results[name].model)).all(), name
    assert checksum(model) == before and not operators_of(model)
    gaps = 2 if drop == "1,3-4" else 1  # trained and Prune&Comp: one per contiguous block
    assert len(run.choices().query("method == 'streamline-ffn'")) == gaps
    assert len(run.choices().query("method == 'prunecomp'")) == gaps


def test_captured_pairs_are_the_boundary_streams_and_capped():
    model = tiny_model("llama")
    w = windows(8, 24)
    pairs = capture_pairs(model, w, Gap(2, 4), max_tokens=3 * 24, seed=4)
    assert pairs.x.shape == (3, 24, 32) and pairs.y.shape == (3, 24, 32)  # 3 windows fit the cap
    again = capture_pairs(model, w, Gap(2, 4), max_tokens=3 * 24, seed=4)
    assert torch.equal(pairs.ids, again.ids)  # the same seeded subset
    rows = [int((w.input_ids == row).all(1).nonzero()[0]) for row in pairs.ids]
    with torch.no_grad():
        hidden = model(w.input_ids[rows], output_hidden_states=True).hidden_states
    torch.testing.assert_close(pairs.x, hidden[2])
    torch.testing.assert_close(pairs.y, hidden[4])

"""Prune&Comp: its scale against its definition, the fused plain checkpoint, the iterative loop."""

import numpy as np
import pytest
import torch
import transformers as tf
from transformers import AutoModelForCausalLM

from ghosted.operators.assembly import GapFit, assemble
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.models.capture import tap
from ghosted.models.loading import OPERATORS_FILE, read_recipe
from ghosted.operators.checkpoint import save_recovered
from ghosted.operators.sites import operators_of
from ghosted.recovery.prunecomp import compensate, magnitude_scale, writers_of
from ghosted.recovery.fitting import recover
from ghosted.selection.rules import select
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_config, tiny_model


def windows(n=6, t=24, seed=0) -> TokenWindows:
    ids = random_ids(n, t, seed)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids", "n_windows": n, "seq_len": t})


def checksum(model) -> float:
    return float(sum(p.double().sum() for p in model.parameters()))


def scale_by_definition(model, w: TokenWindows, start: int, end: int) -> float:
    """Prune&Comp's scale from HF's own hidden states, in numpy: per window the channel ratio of
    mean |h_end| to mean |h_start| over tokens, averaged over windows, then over channels."""
    with torch.no_grad():
        hidden = model(w.input_ids, output_hidden_states=True).hidden_states
    x, y = hidden[start].double().numpy(), hidden[end].double().numpy()  # (N, T, d)
    ratios = np.abs(y).mean(axis=1) / np.abs(x).mean(axis=1)  # (N, d)
    return float(ratios.mean(axis=0).mean())


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_scale_equals_its_definition_and_is_fused_exactly(family):
    model = tiny_model(family, layers=6)
    w = windows()
    stats = collect_stats(model, w, [Gap(2, 4)], CalibrationConfig(replaceme=False))[Gap(2, 4)]
    scale = magnitude_scale(stats)
    assert scale == pytest.approx(scale_by_definition(model, w, 2, 4), rel=1e-9)
    before = checksum(model)
    fused = compensate(model, [2, 3], scale)
    assert checksum(model) == before  # the base model's weights are untouched
    assert not operators_of(fused) and fused.config.num_hidden_layers == 4
    with tap(model, boundaries=[2]) as t:
        x = t.run(w.input_ids).resid[2]  # dense stream entering layer 2
    with tap(fused, boundaries=[2]) as t:
        got = t.run(w.input_ids).resid[2]  # what layer 4 (now position 2) receives
    torch.testing.assert_close(got, scale * x, rtol=1e-4, atol=1e-5)


def test_recover_prunecomp_is_a_plain_checkpoint_even_with_tied_embeddings(tmp_path):
    config = tiny_config("llama")
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    before = checksum(model)
    run = recover(model, "2-3", ["prunecomp"], windows())
    fused = run.results["prunecomp"].model
    assert checksum(model) == before and model.lm_head.weight is model.model.embed_tokens.weight
    assert fused.lm_head.weight is fused.model.embed_tokens.weight  # still tied, to the scaled copy
    assert fused.model.embed_tokens.weight is not model.model.embed_tokens.weight
    scale = run.choices().scale.iloc[0]
    torch.testing.assert_close(fused.model.embed_tokens.weight, scale * model.model.embed_tokens.weight)
    torch.testing.assert_close(fused.model.norm.weight, model.model.norm.weight / scale)  # logits unchanged
    plain_pruned = recover(model, "2-3", ["none"], windows()).results["none"].model
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain_pruned.parameters())
    assert fused.model.layers[2].self_attn.o_proj.weight is model.model.layers[4].self_attn.o_proj.weight
    assert not operators_of(fused)
    folder = save_recovered(fused, tmp_path / "pc", recipe=run)
    assert not (folder / OPERATORS_FILE).exists() and read_recipe(folder)["checkpoint"] == "plain"
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()  # transformers alone
    ids = random_ids(2, 12, seed=3)
    operator = assemble(model, [2, 3], {Gap(2, 4): GapFit(stream=scale * torch.eye(32, dtype=torch.float64))},
                        "scale")  # the same scale as an explicit stream operator at the cut
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, fused(ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused(ids).logits, operator(ids).logits, rtol=1e-4, atol=1e-4)


def test_two_gaps_are_compensated_one_after_the_other():
    model = tiny_model("llama", layers=8)
    run = recover(model, "1-2,5", ["prunecomp"], windows())
    scales = run.choices().scale.tolist()
    assert len(scales) == 2 and all(s > 0 for s in scales)
    assert run.results["prunecomp"].model.config.num_hidden_layers == 5


def test_post_norm_families_scale_their_branch_norms_and_olmo2_is_refused():
    gemma = tiny_model("gemma3", layers=6)
    w = windows()
    stats = collect_stats(gemma, w, [Gap(2, 3)], CalibrationConfig(replaceme=False))[Gap(2, 3)]
    fused = compensate(gemma, [2], magnitude_scale(stats))
    with tap(gemma, boundaries=[2]) as t:
        x = t.run(w.input_ids).resid[2]
    with tap(fused, boundaries=[2]) as t:
        got = t.run(w.input_ids).resid[2]
    torch.testing.assert_close(got, magnitude_scale(stats) * x, rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="pre-norm"):
        writers_of(tiny_model("olmo2"))


def test_iterative_selection_removes_one_layer_at_a_time():
    model = tiny_model("llama", layers=6)
    before = checksum(model)
    layers, reason = select(model, "prunecomp:block_influence", 2, windows())
    assert len(layers) == 2 and len(set(layers)) == 2 and all(0 <= i < 6 for i in layers)
    assert "Prune&Comp" in reason and reason.count("scale") >= 2
    assert checksum(model) == before

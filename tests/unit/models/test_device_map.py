"""Models split by accelerate across devices, with offloaded layers, give the same numbers.

On this CPU-only machine the split is CPU plus disk: offloaded layers keep their weights on "meta"
and accelerate's hooks load them at each call, which is exactly what ghosted's views (shallow
clones re-attaching ``_hf_hook``) must survive. Two ways to get such a model are covered:
``from_pretrained(device_map=..., offload_folder=...)`` and ``accelerate.dispatch_model`` on a
model already in memory.
"""

from __future__ import annotations

import pytest
import torch
from accelerate import dispatch_model
from transformers import AutoModelForCausalLM

from ghosted.models.capture import input_device
from ghosted.evaluation.perplexity import perplexity
from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.recovery.fitting import RecoveryConfig, recover
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model
from tests.tolerance import TINY_MODEL_TOL, assert_close_on_scale

DROP = "3-4"  # the ghost operator sits after layer 2, which is offloaded in both maps
DEVICE_MAP = {"model.embed_tokens": "disk", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "cpu", "model.layers.2": "disk", "model.layers.3": "disk",
              "model.layers.4": "cpu", "model.layers.5": "disk", "model.norm": "cpu", "lm_head": "disk"}


def windows(n: int = 8, length: int = 24, seed: int = 1) -> TokenWindows:
    ids = random_ids(n, length, seed=seed)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids"})


@pytest.fixture
def dense():
    return tiny_model("llama")


@pytest.fixture(params=["from_pretrained", "dispatch_model"])
def sharded(request, dense, tmp_path):
    """The same weights as ``dense``, split over CPU and disk by accelerate."""
    if request.param == "from_pretrained":
        dense.save_pretrained(tmp_path / "dense")
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "dense", device_map=DEVICE_MAP,
                                                     offload_folder=str(tmp_path / "offload"))
    else:
        model = dispatch_model(tiny_model("llama"), device_map=DEVICE_MAP, main_device="cpu",
                               offload_dir=str(tmp_path / "offload"))
    model.eval()
    model.requires_grad_(False)
    assert model.model.layers[2].mlp.down_proj.weight.device.type == "meta"  # really offloaded
    return model


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # (B, T, V)


def greedy(model, ids, steps: int = 6) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(input_ids=ids, max_new_tokens=steps, do_sample=False, pad_token_id=0)


def test_offloaded_embedding_still_takes_tokens_on_cpu(sharded):
    assert sharded.model.embed_tokens.weight.device.type == "meta"
    assert input_device(sharded) == torch.device("cpu")


def test_calibrate_ghost_perplexity_generate_match_the_unsharded_model(dense, sharded):
    calib, ids = windows(), random_ids(2, 12, seed=3)
    assert torch.allclose(logits(sharded, ids), logits(dense, ids), atol=1e-5)
    ref = recover(dense, DROP, ["none", "ghost"], calib)
    got = recover(sharded, DROP, ["none", "ghost"], calib)
    gap = next(iter(ref.results["ghost"].stats))
    ref_stats, got_stats = ref.results["ghost"].stats[gap], got.results["ghost"].stats[gap]
    # float64 sums of float32 hidden states; the solve amplifies their round-off by at most cond(XᵀX)
    assert_close_on_scale(got_stats.xtx, ref_stats.xtx, TINY_MODEL_TOL)
    assert_close_on_scale(got_stats.xtd, ref_stats.xtd, TINY_MODEL_TOL)
    solve_tol = TINY_MODEL_TOL * float(torch.linalg.cond(ref_stats.xtx))
    assert_close_on_scale(got.results["ghost"].operators[gap], ref.results["ghost"].operators[gap], solve_tol)
    for method in ("none", "ghost"):
        ppl_ref = perplexity(ref.results[method].model, calib).ppl
        ppl_got = perplexity(got.results[method].model, calib).ppl
        assert ppl_got == pytest.approx(ppl_ref, rel=1e-5)
        # greedy tokens: the logits above agree to round-off, far below the top-two logit gap of these seeds
        assert torch.equal(greedy(got.results[method].model, ids), greedy(ref.results[method].model, ids))
    ppl_none = perplexity(got.results["none"].model, calib).ppl
    assert ppl_none != pytest.approx(perplexity(got.results["ghost"].model, calib).ppl)


def test_statistics_live_on_the_execution_device_not_meta(sharded):
    run = recover(sharded, DROP, ["ghost"], windows())
    for stats in run.results["ghost"].stats.values():
        assert stats.xtx.device == torch.device("cpu") and stats.xtx.dtype == torch.float64
    for op in run.results["ghost"].model.model.layers[2].ghosted_post:
        assert op.weight.device == torch.device("cpu")


def test_the_sharded_model_is_not_changed(sharded):
    ids = random_ids(2, 12, seed=4)
    before = logits(sharded, ids)
    hooks = {name: module._hf_hook for name, module in sharded.named_modules() if hasattr(module, "_hf_hook")}
    run = recover(sharded, DROP, ["ghost", "replaceme-ls"], windows(),
                  config=RecoveryConfig(fold=False))
    greedy(run.results["ghost"].model, ids)
    assert torch.equal(logits(sharded, ids), before)  # untouched: same bits (same machine, same thread count)
    assert len(sharded.model.layers) == 6 and not hasattr(sharded.model.layers[2], "ghosted_post")
    assert sharded.model.layers[2].mlp.down_proj.weight.device.type == "meta"  # still offloaded
    now = {name: module._hf_hook for name, module in sharded.named_modules() if hasattr(module, "_hf_hook")}
    assert now == hooks


def test_replaceme_on_an_offloaded_layer(dense, sharded):
    calib, ids = windows(), random_ids(2, 12, seed=3)
    with pytest.raises(ValueError, match="offloaded"):  # folding into "meta" would be silently lost
        recover(sharded, DROP, ["replaceme-ls"], calib)
    hooked = RecoveryConfig(fold=False)
    ref = recover(dense, DROP, ["replaceme-ls"], calib, config=hooked)
    got = recover(sharded, DROP, ["replaceme-ls"], calib, config=hooked)
    assert torch.allclose(logits(got.results["replaceme-ls"].model, ids),
                          logits(ref.results["replaceme-ls"].model, ids), atol=1e-5)


def test_save_a_sharded_recovered_model_and_load_it_whole(dense, sharded, tmp_path):
    calib, ids = windows(), random_ids(2, 12, seed=3)
    got = recover(sharded, DROP, ["ghost"], calib)
    ref = recover(dense, DROP, ["ghost"], calib)
    with pytest.warns(UserWarning, match="offloaded"):  # transformers reloads offloaded weights
        folder = save_recovered(got.results["ghost"].model, tmp_path / "saved", recipe=got)
    loaded = load_recovered(folder, device="cpu").model
    assert all(p.device.type == "cpu" for p in loaded.parameters())
    assert torch.allclose(logits(loaded, ids), logits(ref.results["ghost"].model, ids), atol=1e-5)


def test_load_recovered_with_a_device_map(dense, tmp_path):
    calib, ids = windows(), random_ids(2, 12, seed=3)
    run = recover(dense, DROP, ["ghost"], calib)
    folder = save_recovered(run.results["ghost"].model, tmp_path / "saved", recipe=run)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "cpu", "model.layers.2": "disk", "model.layers.3": "disk",
                  "model.norm": "cpu", "lm_head": "cpu"}
    loaded = load_recovered(folder, device_map=device_map, offload_folder=str(tmp_path / "off")).model
    assert loaded.model.layers[2].mlp.down_proj.weight.device.type == "meta"
    assert torch.allclose(logits(loaded, ids), logits(run.results["ghost"].model, ids), atol=1e-5)
    assert torch.equal(greedy(loaded, ids), greedy(run.results["ghost"].model, ids))  # tokens, as above

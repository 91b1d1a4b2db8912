"""The bundled model on a CUDA GPU in bfloat16, and a tiny model split over GPU, CPU and disk.

Marked ``gpu`` and skipped without CUDA: run with ``pytest tests/gpu -m gpu`` on a GPU machine.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DROP = "20-26"


@pytest.fixture(scope="module")
def gpu_model():
    from ghosted.models.loading import load_model

    return load_model(device="cuda", dtype="bfloat16")


@pytest.fixture(scope="module")
def gpu_run(gpu_model):
    from ghosted.recovery.fitting import recover
    from ghosted.data.windows import calibration_windows

    calib = calibration_windows(gpu_model.tokenizer, "bundled:news", 32, 256)
    return recover(gpu_model.model, DROP, ["none", "ghost", "replaceme-ls"], calib)


def test_model_is_on_cuda_in_bf16(gpu_model):
    param = next(gpu_model.model.parameters())
    assert param.device.type == "cuda" and param.dtype == torch.bfloat16


def test_statistics_are_float64_on_the_gpu(gpu_run):
    for stats in gpu_run.results["ghost"].stats.values():
        assert stats.xtx.device.type == "cuda" and stats.xtx.dtype == torch.float64


def test_ghost_recovers_perplexity_on_cuda(gpu_model, gpu_run):
    from ghosted.evaluation.perplexity import perplexity
    from ghosted.data.windows import evaluation_windows

    windows = evaluation_windows(gpu_model.tokenizer, "bundled:wiki", 8192, 512)
    dense = perplexity(gpu_model.model, windows)
    pruned = perplexity(gpu_run.results["none"].model, windows)
    ghost = perplexity(gpu_run.results["ghost"].model, windows)
    assert dense.protocol["device"].startswith("cuda") and dense.protocol["dtype"] == "bfloat16"
    assert all(math.isfinite(r.ppl) for r in (dense, pruned, ghost))
    assert dense.ppl < ghost.ppl < pruned.ppl


def test_generation_on_cuda(gpu_model, gpu_run):
    from ghosted.evaluation.generation import generate

    for method in ("none", "ghost", "replaceme-ls"):
        text = generate(gpu_run.results[method].model, gpu_model.tokenizer, "The capital of France is",
                        max_new_tokens=12)
        assert len(text) == 1 and text[0].strip()


def test_save_and_load_on_cuda(gpu_model, gpu_run, tmp_path):
    from ghosted.operators.checkpoint import load_recovered, save_recovered
    from ghosted.data.windows import evaluation_windows

    model = gpu_run.results["ghost"].model
    folder = save_recovered(model, tmp_path / "ghost", gpu_model, recipe=gpu_run)
    loaded = load_recovered(folder, device="cuda", dtype="bfloat16")
    ids = evaluation_windows(gpu_model.tokenizer, "bundled:wiki", 512, 256).input_ids.cuda()  # (2, 256)
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, model(input_ids=ids).logits)
    assert loaded.extra["recipe"]["dtype"] == "bfloat16"


def test_tiny_model_split_over_gpu_cpu_and_disk(tmp_path):
    from transformers import AutoModelForCausalLM

    from ghosted.evaluation.perplexity import perplexity
    from ghosted.recovery.fitting import recover
    from ghosted.data.windows import TokenWindows
    from tests.tiny import random_ids, tiny_model

    dense = tiny_model("llama")
    dense.save_pretrained(tmp_path / "dense")
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 0,
                  "model.layers.2": "cpu", "model.layers.3": "disk", "model.layers.4": 0,
                  "model.layers.5": "cpu", "model.norm": 0, "lm_head": 0}
    sharded = AutoModelForCausalLM.from_pretrained(tmp_path / "dense", device_map=device_map,
                                                   offload_folder=str(tmp_path / "off"), use_kernels=False).eval()
    ids = random_ids(8, 24, seed=1)
    calib = TokenWindows(ids, torch.ones_like(ids), {"source": "random ids"})
    ref = recover(dense.cuda(), "2-3", ["ghost"], calib)
    got = recover(sharded, "2-3", ["ghost"], calib)
    stats = next(iter(got.results["ghost"].stats.values()))
    assert stats.xtx.device.type == "cuda"  # the device where layer 1 (before the gap) runs
    assert perplexity(got.results["ghost"].model, calib).ppl == pytest.approx(
        perplexity(ref.results["ghost"].model, calib).ppl, rel=1e-4)

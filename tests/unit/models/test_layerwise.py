"""Layer-by-layer execution from the checkpoint equals the whole model, for every family of tests/tiny.py.

Each tiny model is saved with ``save_pretrained`` (safetensors) and read back by ``LazyModel``: the logits,
the calibration statistics of every gap (MLP sums and the ReplaceMe reservoir included), the ghost operator
fitted from them and the perplexities, KL and top-1 agreement of dense and pruned views are compared with
the whole model in memory.
"""

from __future__ import annotations

import math
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats, collect_stats_layerwise
from ghosted.data.windows import TokenWindows
from ghosted.evaluation.layerwise import chunk_positions, layerwise_perplexities
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.models.architecture import layers_of
from ghosted.models.layer_pass import LayerPass
from ghosted.models.lazy import CheckpointError, LazyModel
from ghosted.models.pruning import prune
from ghosted.recovery.solvers import ghost_operator
from tests.properties import bounded_memory, examples
from tests.tiny import FAMILIES, VOCAB, random_ids, tiny_model
from tests.tolerance import FLOAT64_REL, TINY_MODEL_TOL

GAPS = [Gap(1, 3), Gap(4, 6)]  # one inside the stack, one ending at the last layer's output


def _windows(n: int = 5, length: int = 12, seed: int = 0) -> TokenWindows:
    ids = random_ids(n, length, seed=seed)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding on one window: masks reach every layer as in the whole model
    return TokenWindows(ids, mask, {"source": "random", "n_windows": n, "seq_len": length})


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    """(family, whole model, folder holding it as safetensors)."""
    model = tiny_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, folder


@torch.no_grad()
def test_logits_are_the_whole_models_bit_for_bit(saved):
    _, model, folder = saved
    lazy = LazyModel(folder)
    windows = _windows()
    batch = (windows.input_ids[:3], windows.attention_mask[:3])
    views = {"dense": lazy.model, "pruned": prune(lazy.model, "2-3")}
    runner = LayerPass(lazy)
    finals = runner.run([batch], views)
    with runner.tail() as tail:
        got = {name: tail.logits(tail.normed(stream[0], *batch)) for name, stream in finals.items()}
    # same process, same ops on the same tensors: the very same bits
    assert torch.equal(got["dense"], model(input_ids=batch[0], attention_mask=batch[1], use_cache=False).logits)
    pruned = prune(model, "2-3")(input_ids=batch[0], attention_mask=batch[1], use_cache=False).logits
    assert torch.equal(got["pruned"], pruned)
    assert all(p.is_meta for p in layers_of(lazy.model).parameters())  # every layer freed after use


def test_calibration_statistics_and_ghost_fit_are_bitwise_equal(saved):
    _, model, folder = saved
    cfg = CalibrationConfig(batch_size=2, reservoir_tokens=7)
    want = collect_stats(model, _windows(), GAPS, cfg)
    got = collect_stats_layerwise(LazyModel(folder), _windows(), GAPS, cfg)
    assert set(got) == set(want)
    for gap in GAPS:
        for field in ("xtx", "xtd", "dtd", "x_sum", "y_sum", "mtm", "mtd", "lp_ratio_sum"):
            assert torch.equal(getattr(got[gap], field), getattr(want[gap], field)), (gap, field)
        assert got[gap].n_tokens == want[gap].n_tokens
        assert torch.equal(got[gap].replaceme_samples.m, want[gap].replaceme_samples.m)
        assert torch.equal(ghost_operator(got[gap]), ghost_operator(want[gap]))


def test_perplexity_kl_and_top1_equal_the_whole_models(saved):
    _, model, folder = saved
    lazy = LazyModel(folder)
    drop = "2-3"
    windows = _windows()
    want = perplexities({"dense": model, "none": prune(model, drop)}, windows, batch_size=2)
    budget = 2 * 4 * VOCAB * 4 * 3  # three positions per chunk: several chunks per window
    assert chunk_positions(2, VOCAB, budget) == 3
    got = layerwise_perplexities(lazy, {"dense": lazy.model, "none": prune(lazy.model, drop)}, windows,
                                 batch_size=2, budget=budget)
    for name in want:
        assert got[name].scored_tokens == want[name].scored_tokens
        assert math.isclose(got[name].ppl, want[name].ppl, rel_tol=TINY_MODEL_TOL)
        for key in ("kl", "top1"):
            assert math.isclose(got[name].summary[key], want[name].summary[key], rel_tol=TINY_MODEL_TOL,
                                abs_tol=TINY_MODEL_TOL)
        assert got[name].protocol["device"] == "cpu"


def test_float64_statistics_are_bitwise_and_perplexity_agrees_to_round_off(tmp_path):
    model = tiny_model("llama").double()
    model.save_pretrained(tmp_path)
    lazy = LazyModel(tmp_path, dtype=torch.float64)
    cfg = CalibrationConfig(batch_size=2, reservoir_tokens=0)
    want, got = collect_stats(model, _windows(), GAPS, cfg), collect_stats_layerwise(lazy, _windows(), GAPS, cfg)
    assert all(torch.equal(got[g].xtd, want[g].xtd) and torch.equal(got[g].xtx, want[g].xtx) for g in GAPS)
    dense = perplexities({"dense": model}, _windows(), batch_size=2)["dense"]
    layerwise = layerwise_perplexities(lazy, {"dense": lazy.model}, _windows(), batch_size=2)["dense"]
    assert math.isclose(layerwise.ppl, dense.ppl, rel_tol=FLOAT64_REL)
    assert layerwise.protocol["dtype"] == "float64"


@pytest.fixture
def sharded(tmp_path):
    """A tiny Llama saved in three shards with an index."""
    tiny_model("llama").save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) >= 3
    return tmp_path


def test_sharded_checkpoint_reads_per_layer(sharded):
    lazy = LazyModel(sharded)
    assert lazy.layer_bytes(layers_of(lazy.model)[0]) > 0
    got = collect_stats_layerwise(lazy, _windows(), GAPS[:1], CalibrationConfig(batch_size=2))
    assert got[GAPS[0]].n_tokens == int(_windows().attention_mask.sum())


def _index(folder):
    import json

    return json.loads((folder / "model.safetensors.index.json").read_text())


def test_index_naming_a_missing_shard_is_one_line_naming_it(sharded):
    shard = sorted(set(_index(sharded)["weight_map"].values()))[-1]
    (sharded / shard).unlink()
    with pytest.raises(CheckpointError, match=f"in {shard}, which is not in"):
        LazyModel(sharded)


def test_truncated_shard_names_file_and_tensor(sharded):
    shard = sharded / sorted(set(_index(sharded)["weight_map"].values()))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=rf"{shard.name}.*tensor '.*' ends at byte"):
        LazyModel(sharded)


def test_missing_tensor_or_wrong_shape_is_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_model("llama").save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model.layers.3.mlp.up_proj.weight' .* is in no shard"):
        LazyModel(tmp_path)
    tensors["model.layers.3.mlp.up_proj.weight"] = torch.zeros(64, 31)
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model.layers.3.mlp.up_proj.weight' in .*model.safetensors has "
                                              r"shape \[64, 31\], but the config asks for \[64, 32\]"):
        LazyModel(tmp_path)


def test_folder_without_safetensors_says_what_to_do(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="holds no .safetensors weights"):
        LazyModel(tmp_path)


def test_windows_in_groups_give_the_same_numbers(tmp_path):
    """A stream budget below one batch: every batch is its own group, reading the layers again."""
    model = tiny_model("qwen2")
    model.save_pretrained(tmp_path)
    lazy = LazyModel(tmp_path)
    cfg = CalibrationConfig(batch_size=2, reservoir_tokens=5)
    want = collect_stats(model, _windows(), GAPS, cfg)
    read_before = lazy.bytes_read
    got = collect_stats_layerwise(lazy, _windows(), GAPS, cfg, budget=1)
    one_pass = sum(lazy.layer_bytes(layer) for layer in layers_of(lazy.model))
    assert lazy.bytes_read - read_before > 2 * one_pass  # three groups of windows, each read the layers
    for gap in GAPS:
        assert torch.equal(got[gap].xtd, want[gap].xtd) and torch.equal(got[gap].mtm, want[gap].mtm)
        assert torch.equal(got[gap].replaceme_samples.target, want[gap].replaceme_samples.target)
    views = {"dense": lazy.model, "none": prune(lazy.model, "2-3")}
    grouped = layerwise_perplexities(lazy, views, _windows(), batch_size=2, stream_budget=1)
    whole = layerwise_perplexities(lazy, views, _windows(), batch_size=2)
    for name in views:
        assert math.isclose(grouped[name].ppl, whole[name].ppl, rel_tol=FLOAT64_REL)
        assert grouped[name].summary["kl"] == pytest.approx(whole[name].summary["kl"], rel=FLOAT64_REL, abs=1e-12)


def test_memory_plan_reads_the_headers_only(sharded):
    from ghosted.models import memory_plan

    per_layer, outer, total = memory_plan.layer_sizes(sharded, 6)
    lazy = LazyModel(sharded)
    assert per_layer == [lazy.layer_bytes(layer) for layer in layers_of(lazy.model)]
    assert outer == VOCAB * 32 * 4 and total == lazy.checkpoint.nbytes
    plans = memory_plan.plan(sharded, 6, 32, [("perplexity x2", 8, 16, 2)], batch=2, dtype=torch.float32,
                             budget=2 * memory_plan.batch_stream_bytes(2, 16, 32, torch.float32, 2), logits_bytes=0)
    assert plans[0].groups == 2 and plans[0].bytes_read == 2 * total
    assert "8 windows in 2 group(s)" in plans[0].line(100.0)


def test_bundled_model_layerwise_equals_whole(bundled):
    """The bundled GGUF is read through its converted safetensors folder (converted once, whole)."""
    from ghosted.data.windows import calibration_windows

    lazy = LazyModel(bundled.extra["location"])
    windows = calibration_windows(bundled.tokenizer, "bundled:news", 4, 64, 0)
    gap = Gap(20, 27)
    cfg = CalibrationConfig(batch_size=2, replaceme=False, reservoir_tokens=0)
    want = collect_stats(bundled.model, windows, [gap], cfg)[gap]
    got = collect_stats_layerwise(lazy, windows, [gap], cfg)[gap]
    assert torch.equal(got.xtx, want.xtx) and torch.equal(got.xtd, want.xtd)  # same process, same ops: same bits
    dense = perplexities({"dense": bundled.model, "none": prune(bundled.model, "20-26")}, windows, batch_size=2)
    layerwise = layerwise_perplexities(lazy, {"dense": lazy.model, "none": prune(lazy.model, "20-26")}, windows,
                                       batch_size=2)
    for name in dense:
        assert math.isclose(layerwise[name].ppl, dense[name].ppl, rel_tol=1e-4)


def _mutated_copy(source, tmp, data):
    """A copy of the sharded checkpoint ``source`` with one shard's bytes or the index changed by ``data``."""
    import json
    import shutil

    folder = Path(tmp) / "ckpt"
    shutil.copytree(source, folder)
    shards = sorted(folder.glob("*.safetensors"))
    what = data.draw(st.sampled_from(["truncate", "bytes", "index"]))
    if what == "index":
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        name = data.draw(st.sampled_from(sorted(index["weight_map"])))
        index["weight_map"][name] = data.draw(st.one_of(
            st.sampled_from(["../outside.safetensors", "/etc/hostname", "", ".", "missing.safetensors",
                             shards[0].name]), st.text(max_size=12), st.integers(), st.none()))
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return folder
    shard = data.draw(st.sampled_from(shards))
    raw = bytearray(shard.read_bytes())
    if what == "truncate":
        shard.write_bytes(bytes(raw[:data.draw(st.integers(0, len(raw) - 1))]))
    else:  # a run of bytes anywhere in the header (its JSON) or the first bytes of data
        (n,) = struct.unpack("<Q", bytes(raw[:8]))
        start = data.draw(st.integers(0, min(len(raw) - 1, 8 + n + 16)))
        patch = data.draw(st.binary(min_size=1, max_size=8))
        raw[start:start + len(patch)] = patch
        shard.write_bytes(bytes(raw))
    return folder


@examples("layerwise_checkpoint_mutated")
@given(st.data())
def test_a_damaged_checkpoint_is_read_or_refused_with_one_line(sharded_once, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _mutated_copy(sharded_once, tmp, data)
        with bounded_memory():
            try:
                lazy = LazyModel(folder)
            except CheckpointError as err:
                assert "\n" not in str(err) and str(err)
                return
        windows = _windows(n=2)
        got = collect_stats_layerwise(lazy, windows, GAPS[:1], CalibrationConfig(batch_size=2))
        assert got[GAPS[0]].n_tokens == int(windows.attention_mask.sum())  # what was accepted is read whole


@pytest.fixture(scope="module")
def sharded_once(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    tiny_model("llama").save_pretrained(folder, max_shard_size="20KB")
    return folder

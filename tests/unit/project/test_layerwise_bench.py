"""bench/layerwise.py writes a real checkpoint shard by shard, and docs/SCALE.md's plan renders from its figures."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bench import layerwise as bench
from ghosted.models import memory_plan
from ghosted.models.lazy import LazyModel


def test_the_random_checkpoint_is_read_layer_by_layer_and_its_sizes_are_the_formulas(tmp_path):
    args = SimpleNamespace(layers=2, hidden=128, ffn=256, vocab=512, windows=2, seq_len=8, batch_size=2)
    nbytes = bench.write_random_llama(tmp_path, args.layers, args.hidden, args.ffn, args.vocab)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == nbytes == LazyModel(tmp_path).checkpoint.nbytes
    per_layer, outer, _ = memory_plan.layer_sizes(tmp_path, args.layers)
    kv = max(1, args.hidden // 64 // 2) * 64
    layer = 4 * (2 * args.hidden ** 2 + 2 * args.hidden * kv + 3 * args.hidden * args.ffn)
    assert per_layer == [layer + 2 * 4 * args.hidden] * args.layers  # weights + the two norms
    assert outer == 4 * args.vocab * args.hidden
    assert bench.predicted_peak(args) > layer + outer


def test_the_scale_plan_renders_from_the_results_file():
    numbers = json.loads(bench.NUMBERS.read_text(encoding="utf-8"))
    text = bench.scale_block(numbers)
    assert "| Llama-3.1-70B |" in text and "| Llama-3.1-8B |" in text
    assert f"{numbers['layers']}-layer" in text

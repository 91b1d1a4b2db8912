"""Integration on the bundled SmolLM2 model: loading, perplexity, generation, pruning (a few k tokens)."""

import math

import pytest
import torch

from ghosted.models.architecture import describe, num_layers
from ghosted.evaluation.perplexity import perplexity
from ghosted.evaluation.generation import generate
from ghosted.models.pruning import prune
from ghosted.recovery.fitting import recover
from ghosted.data.windows import calibration_windows, evaluation_windows


@pytest.fixture(scope="module")
def eval_windows(bundled):
    return evaluation_windows(bundled.tokenizer, "bundled:wiki", n_tokens=1024, seq_len=256)


def test_bundled_model_facts(bundled):
    facts = describe(bundled.model)
    assert facts["family"] == "llama" and facts["layers"] == 30 and facts["hidden_size"] == 576
    assert bundled.kind == "bundled" and bundled.device == "cpu" and bundled.dtype == "float32"


@pytest.mark.slow  # forward passes of the bundled model
def test_perplexity_matches_direct_labels_computation(bundled, eval_windows):
    res = perplexity(bundled.model, eval_windows, batch_size=2)
    total, count = 0.0, 0
    with torch.no_grad():
        for row in eval_windows.input_ids:
            ids = row[None]
            loss = bundled.model(input_ids=ids, labels=ids).loss  # mean over the T-1 shifted tokens
            total += float(loss) * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    assert res.scored_tokens == count == 4 * 255
    assert math.isclose(res.ppl, math.exp(total / count), rel_tol=1e-4)
    assert 5 < res.ppl < 100
    for key in ("source", "part", "n_windows", "seq_len", "bos", "dtype", "device", "scored_tokens"):
        assert key in res.protocol


def test_pruning_keeps_the_shared_model_intact(bundled, eval_windows):
    ids = eval_windows.input_ids[:1, :64]
    with torch.no_grad():
        before = bundled.model(ids).logits
        pruned = prune(bundled.model, "20-26")
        assert num_layers(pruned) == 23 and num_layers(bundled.model) == 30
        pruned(ids)
        # untouched: same bits (same machine, same thread count)
        torch.testing.assert_close(bundled.model(ids).logits, before, rtol=0, atol=0)


@pytest.mark.slow  # forward passes of the bundled model
def test_greedy_generation_is_deterministic_and_uses_chat_template(bundled):
    prompts = ["Albert Einstein was a German-born physicist who", "The capital of France is"]
    a = generate(bundled.model, bundled.tokenizer, prompts, max_new_tokens=12)
    b = generate(bundled.model, bundled.tokenizer, prompts, max_new_tokens=12)
    assert a == b and all(len(t.strip()) > 0 for t in a)  # greedy determinism (same machine, same thread count)
    chat = generate(bundled.model, bundled.tokenizer, ["What is the capital of France?"], max_new_tokens=12,
                    chat=True)
    assert "Paris" in chat[0]


@pytest.mark.slow  # forward passes of the bundled model
def test_generation_leaves_the_shared_tokenizer_and_config_alone(bundled):
    from ghosted.evaluation.generation import GenerationConfig

    side = bundled.tokenizer.padding_side
    config = GenerationConfig()
    prompts = ["The capital of France is", "Albert Einstein was a German-born physicist who"]
    batched = generate(bundled.model, bundled.tokenizer, prompts, config, max_new_tokens=6)
    assert bundled.tokenizer.padding_side == side and config.max_new_tokens == GenerationConfig.max_new_tokens
    # left padding really happened: the short prompt continues as it does alone
    assert batched[0] == generate(bundled.model, bundled.tokenizer, prompts[0], max_new_tokens=6)[0]


@pytest.mark.slow  # forward passes of the bundled model
def test_recovered_bundled_model_generates_with_kv_cache(bundled):
    calib = calibration_windows(bundled.tokenizer, "bundled:news", n_seqs=4, seq_len=64)
    held = calibration_windows(bundled.tokenizer, "bundled:news", n_seqs=2, seq_len=64, seed=1)
    run = recover(bundled.model, "20-26", ["ghost", "ghost-robust"], calib, held)
    for method in ("ghost", "ghost-robust"):
        model = run.results[method].model
        with_cache = generate(model, bundled.tokenizer, ["The history of the city"], max_new_tokens=10)
        without = generate(model, bundled.tokenizer, ["The history of the city"], max_new_tokens=10,
                           use_cache=False)
        assert with_cache == without


@pytest.mark.slow  # forward passes of the bundled model
def test_sink_is_found_at_position_zero(bundled):
    calib = calibration_windows(bundled.tokenizer, "bundled:news", n_seqs=4, seq_len=64)
    held = calibration_windows(bundled.tokenizer, "bundled:news", n_seqs=2, seq_len=64, seed=1)
    run = recover(bundled.model, "9-19", ["ghost-robust"], calib, held)
    row = run.sinks.iloc[0]
    assert row.sink_tokens == 4 and row.positions == "0 (×4)"
    assert row.delta_share > 0.5  # the sink born inside [9, 20) carries most of ‖Δ‖²
    assert row.sink_rms_norm_y > 20 * row.other_rms_norm_y
    positions = run.position_shares()
    assert positions.delta_share.idxmax() == 0 and positions.delta_share.iloc[0] == pytest.approx(row.delta_share)
    spectra = run.sink_spectra()
    top = spectra[spectra["index"] == 0].set_index("tokens").singular_value
    assert top["without sinks"] < 0.5 * top["all tokens"]  # the largest direction of Δ is the sink's

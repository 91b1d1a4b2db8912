"""Shared-prefix evaluation gives exactly the numbers of evaluating each variant on its own."""

from __future__ import annotations

import math

import pytest
import torch

from ghosted.models.architecture import embedding_of, layers_of
from ghosted.evaluation.perplexity import perplexity
from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import BRANCH_METHODS, METHODS, RecoveryConfig, recover
from ghosted.evaluation.shared_prefix import SuffixView, perplexities, shared_prefix_length
from ghosted.recovery.streamline import StreamlineConfig
from ghosted.data.windows import TokenWindows
from tests.tiny import FAMILIES, random_ids, tiny_model
from tests.tolerance import FLOAT64_REL


def windows(n: int, length: int, seed: int) -> TokenWindows:
    ids = random_ids(n, length, seed)  # (n, length)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random", "seq_len": length})


def variants(model, drop: str, calib, heldout) -> dict:
    """dense plus every recovery method that applies to ``drop`` (ReplaceMe needs a layer before it)."""
    starts_at_zero = drop.split(",")[0].split("-")[0] == "0"
    refused = registry.refusals(METHODS, model)  # layer-ls: Llama-like MLPs only
    methods = [m for m in METHODS if not (starts_at_zero and m in BRANCH_METHODS) and m not in refused]
    # one training epoch: the trained replacements only need to exist here, not to converge
    quick = RecoveryConfig(streamline=StreamlineConfig(epochs=1))
    run = recover(model, drop, methods, calib, heldout, quick)
    return {"dense": model, **{name: r.model for name, r in run.results.items()}}


def assert_same_as_alone(models: dict, evaluation, batch_size: int = 2) -> None:
    shared = perplexities(models, evaluation, batch_size=batch_size)
    assert list(shared) == list(models)
    for name, model in models.items():
        alone = perplexity(model, evaluation, batch_size=batch_size)
        assert shared[name].scored_tokens == alone.scored_tokens, name
        # the shared prefix runs the very same float32 ops as the model alone (same machine, same thread
        # count): only the float64 sum of the token losses may differ, hence a float64 tolerance
        assert math.isclose(shared[name].nll, alone.nll, rel_tol=FLOAT64_REL), (
            name, shared[name].nll, alone.nll)
        assert shared[name].protocol == alone.protocol, name


# (drop, expected split): contiguous, a single layer, non-contiguous, and blocks starting at layer 0
DROPS = [("2-3", 1), ("4", 3), ("2,4", 1), ("1,3", 0), ("0-1", 0), ("0,3", 0)]


CASES = [("llama", *d) for d in DROPS] + [  # sliding-window layer types, post-norm MLP branch, Conv1D
    (family, *d) for family in ("qwen2", "gemma3", "gpt2") for d in (("2,4", 1), ("0-1", 0))]


@pytest.mark.parametrize("family,drop,split", CASES)
def test_tiny_every_method_matches_separate_evaluation(family, drop, split):
    models = variants(tiny_model(family, layers=6), drop, windows(6, 16, 0), windows(2, 16, 5))
    # Prune&Comp fuses its scale into new weights upstream of the cut (embeddings, every output
    # projection), so it shares no prefix with the others; every other method keeps them
    kept_upstream = [m for name, m in models.items() if name != "prunecomp"]
    assert shared_prefix_length(kept_upstream) == split
    assert shared_prefix_length(list(models.values())) <= split
    assert_same_as_alone(models, windows(5, 16, 1))


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_other_families_match(family):
    # OPT's fc2 sees flattened (B*T, d) rows, which ReplaceMe's statistics do not take yet
    methods = ["none", "ghost", "linearpatch-rotate"] + ([] if family == "opt" else ["replaceme-ls"])
    model = tiny_model(family, layers=6)
    run = recover(model, "3-4", methods, windows(6, 16, 0))
    models = {"dense": model, **{name: r.model for name, r in run.results.items()}}
    assert shared_prefix_length(list(models.values())) == 2
    assert_same_as_alone(models, windows(3, 16, 1))


def test_padding_masks_and_uneven_last_batch():
    model = tiny_model("llama", layers=6)
    run = recover(model, "3-4", ["none", "ghost", "replaceme-ls"], windows(6, 16, 0))
    models = {"dense": model, **{name: r.model for name, r in run.results.items()}}
    ev = windows(5, 16, 2)
    ev.attention_mask[1, 11:] = 0  # right padding is not scored
    assert_same_as_alone(models, ev, batch_size=3)


def test_split_point_by_layer_identity():
    model = tiny_model("llama", layers=6)
    run = recover(model, "3-4", ["none", "ghost", "replaceme-ls"], windows(6, 16, 0))
    res = run.results
    assert shared_prefix_length([model, res["none"].model]) == 3  # plain pruning keeps layers 0-2
    assert shared_prefix_length([model, res["ghost"].model]) == 2  # layer 2 carries the operator
    assert shared_prefix_length([model, res["replaceme-ls"].model]) == 2  # layer 2's down_proj is folded
    assert shared_prefix_length([model]) == 0
    assert shared_prefix_length([model, tiny_model("llama", layers=6, seed=1)]) == 0  # other weights


def test_suffix_view_runs_its_own_pre_hook_after_the_injection():
    """A drop at layer 0 puts ghost's operator in a pre-hook of layer 0: it must act on the cached stream."""
    model = tiny_model("llama", layers=6)
    run = recover(model, "0-1", ["none", "ghost"], windows(6, 16, 0))
    ghost, pruned = run.results["ghost"].model, run.results["none"].model
    ids = random_ids(2, 16, 3)
    embedded = embedding_of(model)(ids)  # (B, T, d): the stream entering layer 0 of every variant
    with torch.no_grad():
        expected = ghost(input_ids=ids, use_cache=False).logits
        unpatched = pruned(input_ids=ids, use_cache=False).logits
    got = SuffixView(ghost, 0).logits(embedded, ids, None)
    # cached stream = same ops, same bits (same machine, same thread count)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.allclose(got, unpatched)  # the operator really ran


def test_suffix_view_uses_the_cached_stream():
    model = tiny_model("llama", layers=6)
    ids = random_ids(2, 16, 3)
    view = SuffixView(model, 2)
    zeros = torch.zeros(2, 16, 32)
    with torch.no_grad():
        dense = model(input_ids=ids, use_cache=False).logits
    assert not torch.allclose(view.logits(zeros, ids, None), dense)
    with pytest.raises(RuntimeError, match="outside feeding"):
        with torch.no_grad():
            view.view(input_ids=ids, use_cache=False)


def test_models_are_not_mutated():
    model = tiny_model("llama", layers=6)
    run = recover(model, "3-4", ["none", "ghost"], windows(6, 16, 0))
    models = {"dense": model, **{name: r.model for name, r in run.results.items()}}
    before = [(len(layer._forward_pre_hooks), len(layer._forward_hooks)) for m in models.values()
              for layer in layers_of(m)]
    ev = windows(3, 16, 1)
    first = perplexities(models, ev)
    after = [(len(layer._forward_pre_hooks), len(layer._forward_hooks)) for m in models.values()
             for layer in layers_of(m)]
    assert before == after
    again = perplexities(models, ev)
    # determinism (same machine, same thread count)
    assert {k: v.nll for k, v in first.items()} == {k: v.nll for k, v in again.items()}


def test_share_false_and_progress():
    model = tiny_model("llama", layers=6)
    run = recover(model, "3-4", ["none", "ghost"], windows(6, 16, 0))
    models = {"dense": model, **{name: r.model for name, r in run.results.items()}}
    ev = windows(5, 16, 1)
    calls = []
    shared = perplexities(models, ev, batch_size=2, progress=lambda stage, d, t: calls.append((stage, d, t)))
    assert [(d, t) for _, d, t in calls] == [(0, 3), (1, 3), (2, 3), (3, 3)]  # per batch, all models at once
    k = shared_prefix_length(list(models.values()))
    assert k > 0 and {stage for stage, _, _ in calls} == {f"perplexity x3 (shared {k} layers)"}
    plain = perplexities(models, ev, batch_size=2, share=False)
    # same float32 ops with and without sharing (same machine, same thread count): float64 tolerance
    assert {k: v.nll for k, v in shared.items()} == pytest.approx({k: v.nll for k, v in plain.items()}, rel=FLOAT64_REL)


@pytest.mark.slow
@pytest.mark.parametrize("drop", ["20-23", "5,9", "0-1"])
def test_bundled_matches_separate_evaluation(bundled, drop):
    from ghosted.data.windows import split_calibration
    from ghosted.data.windows import calibration_windows, evaluation_windows

    fit, held = split_calibration(calibration_windows(bundled.tokenizer, "bundled:news", 5, 48, 0), 1)
    methods = ["none", "ghost", "linearpatch-rotate"] + ([] if drop.startswith("0") else ["replaceme-ls"])
    run = recover(bundled.model, drop, methods, fit, held)
    models = {"dense": bundled.model, **{name: r.model for name, r in run.results.items()}}
    expected_split = {"20-23": 19, "5,9": 4, "0-1": 0}[drop]
    assert shared_prefix_length(list(models.values())) == expected_split
    assert_same_as_alone(models, evaluation_windows(bundled.tokenizer, "bundled:wiki", 96, 48))


def test_fidelity_to_the_dense_model_matches_whole_models():
    """KL and top-1 agreement from the shared pass equal those of each whole model's own logits."""
    from ghosted.evaluation.perplexity import model_logits
    from ghosted.evaluation.scores import Reference, score_logits

    model = tiny_model("llama", layers=6)
    run = recover(model, "3-4", ["none", "ghost"], windows(6, 16, 0))
    models = {"none": run.results["none"].model, "dense": model, "ghost": run.results["ghost"].model}
    evaluation = windows(5, 16, 1)
    shared = perplexities(models, evaluation, batch_size=2)
    ids = evaluation.input_ids
    _, ref_lp = score_logits(model_logits(model, ids), ids, None)
    for name in ("none", "ghost"):
        alone, _ = score_logits(model_logits(models[name], ids), ids, None, Reference.of(ref_lp))
        summary = shared[name].summary
        assert summary["kl"] == pytest.approx(alone.kl.sum() / alone.tokens.sum(), rel=1e-4)
        assert summary["top1"] == pytest.approx(alone.agree.sum() / alone.tokens.sum())
        assert summary["kl"] > 0 and summary["ppl_low"] <= shared[name].ppl <= summary["ppl_high"]
    assert shared["dense"].summary["kl"] == 0 and shared["dense"].summary["top1"] == 1
    assert "d_none" in shared["ghost"].summary and "d_ghost" in shared["none"].summary
    assert shared["ghost"].summary["d_none"] == pytest.approx(shared["ghost"].ppl - shared["none"].ppl)

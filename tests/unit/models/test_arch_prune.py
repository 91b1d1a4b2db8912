"""Architecture adapter and non-mutating pruning on tiny random models of every family."""

import pytest
import torch

from ghosted.models.architecture import (UnsupportedArchitecture, embedding_of, get_path, head_of, hidden_of, layers_of,
                                         num_layers, removed_share, spec_for)
from ghosted.models.pruning import build_variant, format_layers, parse_layers, prune
from tests.tiny import FAMILIES, random_ids, tiny_model


def checksum(model) -> float:
    return float(sum(p.double().sum() for p in model.parameters()))


def layer_indices(model) -> list:
    return [m.layer_idx for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)]


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_finds_every_part(family):
    model = tiny_model(family)
    assert num_layers(model) == 6
    assert embedding_of(model).weight.shape[0] == 96
    assert head_of(model).weight.shape[0] == 96
    spec = spec_for(model)  # every path of the spec resolves on this family
    assert isinstance(get_path(get_path(model, spec.stack), spec.final_norm), torch.nn.Module)
    assert isinstance(get_path(layers_of(model)[0], spec.mlp_branch), torch.nn.Module)
    assert hidden_of((torch.ones(1), None)).shape == (1,)


@pytest.mark.parametrize("family", FAMILIES)
def test_prune_leaves_original_untouched(family):
    model = tiny_model(family)
    ids = random_ids()
    before_logits = model(ids).logits
    before_sum, before_idx = checksum(model), layer_indices(model)
    before_types = list(getattr(model.config, "layer_types", None) or [])
    pruned = prune(model, "1,3-4")
    assert num_layers(pruned) == 3 and pruned.config.num_hidden_layers == 3
    assert pruned(ids).logits.shape == before_logits.shape
    # untouched: same bits (same machine, same thread count)
    torch.testing.assert_close(model(ids).logits, before_logits, rtol=0, atol=0)
    assert checksum(model) == before_sum
    assert layer_indices(model) == before_idx
    assert model.config.num_hidden_layers == 6
    assert list(getattr(model.config, "layer_types", None) or []) == before_types
    assert len(layers_of(model)) == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_shares_weights_and_renumbers(family):
    model = tiny_model(family)
    pruned = prune(model, [2])
    kept_ptrs = {p.data_ptr() for p in pruned.parameters()}
    assert kept_ptrs <= {p.data_ptr() for p in model.parameters()}  # no copy of any weight
    per_layer = [sorted({m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)})
                 for layer in layers_of(pruned)]
    assert per_layer == [[i] for i in range(5)]
    assert pruned.ghosted_layers == [0, 1, 3, 4, 5]


def test_pruned_equals_manual_skip(tiny_llama):
    """Pruning layer 2 gives the same logits as running the kept layers by hand."""
    ids = random_ids()
    pruned = prune(tiny_llama, [2])
    stack = tiny_llama.model
    hidden = stack.embed_tokens(ids)
    pos = torch.arange(ids.shape[1])[None]
    rope = stack.rotary_emb(hidden, position_ids=pos)
    from transformers.masking_utils import create_causal_mask
    mask = create_causal_mask(config=tiny_llama.config, inputs_embeds=hidden, attention_mask=None,
                              cache=None, position_ids=pos)
    for i in [0, 1, 3, 4, 5]:
        hidden = stack.layers[i](hidden, attention_mask=mask, position_embeddings=rope, position_ids=pos)
    expected = tiny_llama.lm_head(stack.norm(hidden))
    torch.testing.assert_close(pruned(ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_gemma3_layer_types_follow_kept_layers():
    model = tiny_model("gemma3")
    pruned = prune(model, [0, 3])
    assert pruned.config.layer_types == [model.config.layer_types[i] for i in (1, 2, 4, 5)]


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen2", "gpt2", "opt"])
def test_pruned_generates_with_cache(family):
    model = tiny_model(family)
    pruned = prune(model, [1, 4])
    ids = random_ids(1, 8)
    with_cache = pruned.generate(ids, max_new_tokens=8, do_sample=False, use_cache=True)
    without = pruned.generate(ids, max_new_tokens=8, do_sample=False, use_cache=False)
    # token ids: cached and uncached logits differ by float32 round-off only, which never flips an argmax
    # of these seeds (same machine, same thread count); the promise is the greedy tokens, not the logit bits
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen2"])
def test_save_reload_round_trip(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_model(family)
    pruned = prune(model, [1, 2])
    pruned.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = random_ids(1, 8)
    a = pruned.generate(ids, max_new_tokens=10, do_sample=False)
    b = reloaded.generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(a, b)  # greedy tokens of the same weights and ops (same machine, same thread count)
    torch.testing.assert_close(pruned(ids).logits, reloaded(ids).logits)  # float32 defaults: rtol 1.3e-6


def test_prune_of_pruned_tracks_original_indices(tiny_llama):
    once = prune(tiny_llama, [1])
    twice = prune(once, [0])
    assert twice.ghosted_layers == [2, 3, 4, 5]


def test_build_variant_private_clone(tiny_llama):
    view = build_variant(tiny_llama, list(range(6)), clone=[0])
    assert layers_of(view)[0] is not layers_of(tiny_llama)[0]
    assert layers_of(view)[1] is layers_of(tiny_llama)[1]


def test_parse_layers():
    assert parse_layers("20-26") == list(range(20, 27))
    assert parse_layers("3,7,9-11") == [3, 7, 9, 10, 11]
    assert format_layers([3, 7, 9, 10, 11]) == "3,7,9-11"
    with pytest.raises(ValueError, match="do not exist"):
        parse_layers("28-31", 30)
    with pytest.raises(ValueError, match="Cannot read"):
        parse_layers("a-b")
    with pytest.raises(ValueError, match="backwards"):
        parse_layers("5-3")


def test_a_layer_range_is_bounded_before_it_is_expanded():
    """``--drop 0-99999999999`` used to fill memory while parsing; every range is checked first."""
    import tracemalloc

    tracemalloc.start()
    try:
        for spec, bound, words in [("0-2000000", None, "beyond any model"), ("4,0-2000000", 30, "do not exist"),
                                   (range(2_000_000), None, "more than any model")]:
            with pytest.raises(ValueError, match=words):
                parse_layers(spec, bound)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # nothing the size of the range was built
    assert parse_layers("0-1022") == list(range(1023))  # the bound leaves every real model's layers


def test_cannot_drop_everything(tiny_llama):
    with pytest.raises(ValueError, match="keep at least one"):
        prune(tiny_llama, "0-5")


def test_unsupported_architecture_is_named():
    class Weird(torch.nn.Module):
        class config:
            model_type = "weirdformer"
            architectures = ["WeirdForCausalLM"]

    with pytest.raises(UnsupportedArchitecture, match="WeirdForCausalLM"):
        spec_for(Weird())


def test_removed_share_is_what_pruning_takes_away():
    model = tiny_model("llama", layers=6)
    total = sum(p.numel() for p in model.parameters())
    kept = sum(p.numel() for p in prune(model, [2, 3]).parameters())
    assert removed_share(model, [2, 3]) == pytest.approx((total - kept) / total)
    assert removed_share(model, []) == 0.0

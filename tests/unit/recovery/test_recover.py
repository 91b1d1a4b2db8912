"""Recovery on tiny models: streaming statistics, operators, folding, KV cache, no mutation."""

import types

import pytest
import torch

from ghosted.models.architecture import layers_of
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.models.capture import tap
from ghosted.operators.sites import operators_of
from ghosted.recovery.fitting import RecoveryConfig, recover
from ghosted.recovery.solvers import stream_error
from tests.tiny import random_ids, tiny_model
from tests.tolerance import TINY_MODEL_TOL, assert_close_on_scale


def windows(n=6, t=24, seed=0):
    ids = random_ids(n, t, seed)
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})


def checksum(model):
    return float(sum(p.double().sum() for p in model.parameters()))


def test_streaming_stats_equal_stacked_computation():
    model = tiny_model("llama", layers=6)
    w = windows()
    w.attention_mask[1, :5] = 0  # padding positions must be excluded
    stats = collect_stats(model, w, [Gap(2, 4)], CalibrationConfig(batch_size=2))[Gap(2, 4)]
    hs = model(w.input_ids, attention_mask=w.attention_mask, output_hidden_states=True).hidden_states
    valid = w.attention_mask.bool()
    x, y = hs[2][valid].double(), hs[4][valid].double()  # (N, d) entering layers 2 and 4
    d = y - x
    torch.testing.assert_close(stats.xtx, x.T @ x)
    torch.testing.assert_close(stats.xtd, x.T @ d)
    torch.testing.assert_close(stats.dtd, d.T @ d)
    assert stats.n_tokens == int(valid.sum())


def test_capture_boundary_L_is_before_final_norm():
    model = tiny_model("llama", layers=4)
    ids = random_ids()
    with tap(model, boundaries=[4]) as t:
        got = t.run(ids).resid[4]
    hs = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(model.model.norm(got), hs[-1])  # HF's last entry is after the norm
    assert not torch.allclose(got, hs[-1])


def test_capture_stops_after_deepest_boundary_and_leaves_no_hook():
    model = tiny_model("llama", layers=6)
    calls = []
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: calls.append(i))
               for i, layer in enumerate(layers_of(model))]
    hook_counts = [len(layer._forward_pre_hooks) for layer in layers_of(model)]
    try:
        with tap(model, boundaries=[1, 3]) as t:
            t.run(random_ids())
    finally:
        after = [len(layer._forward_pre_hooks) for layer in layers_of(model)]
        for h in handles:
            h.remove()
    assert calls == [0, 1, 2, 3]  # layer 3 is entered (its input captured), nothing after it runs
    assert after == hook_counts  # the capture hooks lived on a private view only


@pytest.mark.parametrize("drop", ["2-3", "1,3-4", "0-1"])
def test_recover_never_mutates_and_all_methods_run(drop):
    model = tiny_model("llama", layers=6)
    before = checksum(model)
    logits = model(random_ids()).logits
    methods = ["none", "ghost", "ghost-robust", "linearpatch-diag", "linearpatch-rotate"]
    if not drop.startswith("0"):
        methods += ["replaceme-ls", "replaceme-cos", "replaceme-ls-robust"]
    run = recover(model, drop, methods, windows(), windows(2, seed=1))
    for name, r in run.results.items():
        out = r.model(random_ids()).logits
        assert torch.isfinite(out).all(), name
    assert checksum(model) == before
    # untouched: same bits (same machine, same thread count)
    torch.testing.assert_close(model(random_ids()).logits, logits, rtol=0, atol=0)
    assert not any(operators_of(model)), "no operator may be attached to the original"
    assert set(run.errors().method) >= {"pruned", "ghost"}


def test_ghost_beats_restricted_stream_operators_on_fit_tokens():
    model = tiny_model("llama", layers=6)
    run = recover(model, "2-3", ["ghost", "linearpatch-diag", "linearpatch-rotate"], windows(8, 32))
    stats = run.results["ghost"].stats[Gap(2, 4)]
    ghost = stream_error(stats, run.results["ghost"].operators[Gap(2, 4)])
    for name in ("linearpatch-diag", "linearpatch-rotate"):
        assert ghost <= stream_error(stats, run.results[name].operators[Gap(2, 4)]) + 1e-9
    assert ghost <= float(torch.trace(stats.dtd))  # never worse than no recovery on fit tokens


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt", "gpt_neox"])
def test_replaceme_folded_equals_hooked(family):
    model = tiny_model(family, layers=6)
    w = windows()
    folded = recover(model, "2-3", ["replaceme-ls"], w,
                     config=RecoveryConfig(fold=True)).results["replaceme-ls"]
    hooked = recover(model, "2-3", ["replaceme-ls"], w,
                     config=RecoveryConfig(fold=False)).results["replaceme-ls"]
    assert not operators_of(folded.model) and operators_of(hooked.model)
    ids = random_ids(2, 16, seed=5)
    torch.testing.assert_close(folded.model(ids).logits, hooked.model(ids).logits, rtol=1e-4, atol=1e-4)


def test_ghost_reduces_the_boundary_error_on_fit_tokens():
    """The least-squares operator can only lower the error of plain pruning on its own fit tokens."""
    model = tiny_model("llama", layers=6)
    w = windows(8, 32)
    stats = collect_stats(model, w, [Gap(2, 3)])[Gap(2, 3)]
    from ghosted.recovery.solvers import ghost_operator, relative_error
    rel = relative_error(stats, stream_error(stats, ghost_operator(stats)))
    assert 0 <= rel < 1


@pytest.mark.parametrize("method", ["ghost", "ghost-robust", "replaceme-ls", "linearpatch-rotate"])
def test_recovered_models_generate_with_kv_cache(method):
    model = tiny_model("llama", layers=6)
    run = recover(model, "2-3", [method], windows(), windows(2, seed=1))
    rec = run.results[method].model
    ids = random_ids(2, 8, seed=3)
    a = rec.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, use_cache=True)
    b = rec.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, use_cache=False)
    # token ids: operators act token by token, so cached and uncached logits differ by float32 round-off
    # only, which never flips an argmax of these seeds (same machine, same thread count)
    assert torch.equal(a, b)


def test_layer_zero_removed_uses_a_pre_hook_on_the_first_surviving_layer():
    model = tiny_model("llama", layers=6)
    run = recover(model, "0", ["ghost"], windows())
    ops = operators_of(run.results["ghost"].model)
    assert [(i, site) for i, site, _ in ops] == [(0, "ghosted_pre")]


def test_non_contiguous_gets_one_chained_operator_per_removed_layer():
    model = tiny_model("llama", layers=8)
    run = recover(model, "2-3,6", ["ghost"], windows())
    ops = operators_of(run.results["ghost"].model)
    assert [(i, op.boundary) for i, _, op in ops] == [(1, (2, 3)), (1, (3, 4)), (3, (6, 7))]


def test_sequential_mode_fits_on_the_patched_stream():
    model = tiny_model("llama", layers=8)
    cfg = RecoveryConfig(ghost_mode="sequential")
    seq = recover(model, "2,5", ["ghost"], windows(), windows(2, seed=1), cfg).results["ghost"]
    ind = recover(model, "2,5", ["ghost"], windows(), windows(2, seed=1)).results["ghost"]
    first, second = Gap(2, 3), Gap(5, 6)
    solve_tol = TINY_MODEL_TOL * float(torch.linalg.cond(ind.stats[first].xtx))  # float32 states, one solve
    assert_close_on_scale(seq.operators[first], ind.operators[first], solve_tol)  # nothing upstream of it
    assert not torch.allclose(seq.operators[second], ind.operators[second])  # fitted on drifted inputs


def test_recovering_an_already_pruned_model_uses_its_own_positions(tmp_path):
    from transformers import AutoModelForCausalLM

    from ghosted.models.pruning import prune

    model = tiny_model("llama", layers=8)
    pruned = prune(model, [0])
    pruned.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    w = windows()
    a = recover(pruned, "2-3", ["ghost"], w).results["ghost"]
    b = recover(reloaded, "2-3", ["ghost"], w).results["ghost"]
    assert_close_on_scale(a.stats[Gap(2, 4)].xtx, b.stats[Gap(2, 4)].xtx, TINY_MODEL_TOL)  # of float32 states
    ids = random_ids(2, 12, seed=7)
    torch.testing.assert_close(a.model(ids).logits, b.model(ids).logits, rtol=1e-4, atol=1e-4)


def test_sink_frames_are_reported_for_plain_methods_and_add_up():
    model = tiny_model("llama", layers=6)
    run = recover(model, "2-3", ["none", "ghost"], windows())
    plain = recover(model, "2-3", ["none", "ghost"], windows(), config=RecoveryConfig(report_sinks=False))
    torch.testing.assert_close(run.results["ghost"].operators[Gap(2, 4)], plain.results["ghost"].operators[Gap(2, 4)])
    assert len(run.sinks) == 1 and plain.sinks.empty  # the report costs nothing to the fit
    shares = run.token_shares().set_index("tokens")
    assert shares.loc["sink", "count"] == 6 and shares.delta_share.sum() == pytest.approx(1.0)
    positions = run.position_shares()
    assert positions.delta_share.sum() == pytest.approx(1.0)
    assert positions.delta_share.iloc[0] == pytest.approx(shares.loc["sink", "delta_share"])  # sink = position 0
    spectra = run.sink_spectra()
    stats = run.results["ghost"].stats[Gap(2, 4)]
    for tokens, gram in (("all tokens", stats.dtd), ("sinks only", stats.sink.dtd),
                         ("without sinks", stats.without_sink().dtd)):
        values = spectra[spectra.tokens == tokens].singular_value.to_numpy()
        assert (values**2).sum() == pytest.approx(float(torch.trace(gram)), rel=1e-6)

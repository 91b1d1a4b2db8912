"""layer-ls: replacement layers whose down-projection is solved in closed form, checked against a direct
least-squares solve on activations captured from the built model, held-out choices, export and its errors."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ghosted.calibration.collect import Gap
from ghosted.data.windows import TokenWindows
from ghosted.models.loading import OPERATORS_FILE
from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.operators.sites import operators_of
from ghosted.recovery import heldout, methods as registry
from ghosted.recovery.fitting import recover
from ghosted.recovery.layer_ls import COPY, RIDGES, check_layers
from tests.tiny import random_ids, tiny_model

DROP = "1,3-4"  # two blocks: [1, 2) and [3, 5)
IDS = random_ids(2, 14, seed=5)


def windows(n: int, t: int = 32, seed: int = 0) -> TokenWindows:
    ids = random_ids(n, t, seed)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids", "n_windows": n, "seq_len": t})


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def checksum(model) -> float:
    return float(sum(p.double().sum() for p in model.parameters()))


@pytest.fixture(scope="module")
def forced():
    """layer-ls on a tiny Llama with the solved layers kept whatever the held-out NLL says."""
    model = tiny_model("llama", layers=6)
    before = checksum(model)
    calib, held = windows(32), windows(8, seed=9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heldout, "wins", lambda candidate, simpler: (True, None))
        run = recover(model, DROP, ["layer-ls"], calib, held)
    assert checksum(model) == before  # the base model is untouched
    return model, run, calib, held


def captured(built, dense, position: int, end: int, win: TokenWindows):
    """Independently of the fit, by hooks of its own: the built model's layer at ``position`` on ``win``: its
    gated units U, its stream before the MLP H, its input X and output, and the dense stream Y entering
    layer ``end`` (tokens flattened). (Hooks, not ``output_hidden_states``: models that share layer objects
    would mix their recorded states.)"""
    layer = built.model.layers[position]
    seen = {}

    def keep(name, index=0):
        return lambda module, args, *out: seen.__setitem__(name, out[0] if out else args[index])
    hooks = [layer.mlp.down_proj.register_forward_pre_hook(keep("u")),
             layer.post_attention_layernorm.register_forward_pre_hook(keep("h")),
             layer.register_forward_pre_hook(keep("x")), layer.register_forward_hook(keep("out")),
             dense.model.layers[end].register_forward_pre_hook(keep("y"))]
    try:
        with torch.no_grad():
            built(win.input_ids)
            dense(win.input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return {k: t.reshape(-1, t.shape[-1]).double() for k, t in seen.items()}


def test_each_solved_projection_is_the_direct_ridge_least_squares_solve(forced):
    model, run, calib, _ = forced
    result = run.results["layer-ls"]
    assert result.kind == "layer"
    built = result.model
    assert built.ghosted_layers == [0, 1, 2, 3, 5]  # the first layer of each block is back
    rows = run.choices().set_index("gap")
    assert set(rows.index) == {"1", "3-4"}
    for gap, position in ((Gap(1, 2), 1), (Gap(3, 5), 3)):
        row = rows.loc["1" if gap.start == 1 else "3-4"]
        solved, source = built.model.layers[position].mlp.down_proj, model.model.layers[gap.start].mlp.down_proj
        assert solved.weight is not source.weight  # a copy: the base layer is never changed
        got, start = solved.weight.double(), source.weight.double()  # (d, f); the copied D0
        if row.kept_copy:
            torch.testing.assert_close(got, start)
            continue
        c = captured(built, model, position, gap.end, calib)
        lam, f = float(row.ridge), c["u"].shape[1]
        # min ‖U A − T‖² + λ‖A − D0ᵀ‖², stacked as one least-squares problem and solved by lstsq
        lhs = torch.cat([c["u"], lam ** 0.5 * torch.eye(f, dtype=torch.float64)])
        rhs = torch.cat([c["y"] - c["h"], lam ** 0.5 * start.T])
        direct = torch.linalg.lstsq(lhs, rhs, driver="gelsd").solution  # (f, d)
        torch.testing.assert_close(got, direct.T.float().double(), rtol=1e-4, atol=1e-5)
    assert not rows.loc["3-4"].kept_copy  # the two-layer block is solved (the one-layer block is exact as a copy)
    assert rows.loc["1"].heldout_relative_error == pytest.approx(0.0, abs=1e-6)


def test_the_ridge_is_the_held_out_best_and_its_error_is_measured_independently(forced):
    model, run, _, held = forced
    built = run.results["layer-ls"].model
    row = run.choices().set_index("gap").loc["3-4"]
    assert row.relative_ridge in RIDGES
    assert row.heldout_relative_error <= row.heldout_relative_error_copy  # the copy as it is is a candidate
    c = captured(built, model, 3, 5, held)
    error = float(((c["out"] - c["y"]) ** 2).sum() / ((c["x"] - c["y"]) ** 2).sum())
    assert error == pytest.approx(row.heldout_relative_error, rel=1e-3)
    assert error < 1.0  # better than no recovery on windows never fitted on


def test_the_solved_model_saves_as_a_plain_checkpoint_and_generates_with_its_cache(forced, tmp_path):
    _, run, _, _ = forced
    built = run.results["layer-ls"].model
    ids = random_ids(1, 6, seed=7)
    mask = torch.ones_like(ids)
    cached = built.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=True)
    plain = built.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
    folder = save_recovered(built, tmp_path / "layer-ls", recipe=run)
    assert not (folder / OPERATORS_FILE).exists()
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(folder).eval()), logits(built))
    assert torch.equal(logits(load_recovered(folder, device="cpu").model), logits(built))


def test_it_is_never_kept_over_ghost_without_a_significant_held_out_gain(tmp_path):
    model = tiny_model("llama", layers=6)
    calib, held = windows(32), windows(8, seed=9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heldout, "wins", lambda candidate, simpler: (False, None))
        run = recover(model, DROP, ["ghost", "layer-ls"], calib, held)
    result = run.results["layer-ls"]
    assert result.kind == "stream" and set(run.choices().chosen) == {"ghost"}
    assert "kept ghost" in result.notes[0]
    assert torch.equal(logits(result.model), logits(run.results["ghost"].model))  # ghost's fit, exactly
    folder = save_recovered(result.model, tmp_path / "fallback", recipe=run)
    assert len(operators_of(load_recovered(folder, device="cpu").model)) == len(result.fits) == 3  # per layer
    assert torch.equal(logits(load_recovered(folder, device="cpu").model), logits(result.model))


def test_the_real_rule_decides_and_the_choice_follows_the_held_out_nll():
    model = tiny_model("llama", layers=6)
    run = recover(model, DROP, ["layer-ls"], windows(32), windows(8, seed=9))
    rows = run.choices()
    assert set(rows.method) == {"layer-ls"} and rows.chosen.nunique() == 1
    kept_layers = rows.chosen.iloc[0] == "layers"
    assert run.results["layer-ls"].kind == ("layer" if kept_layers else "stream")
    if kept_layers:
        assert (rows.nll_layers < rows.nll_ghost).all()


def test_held_out_windows_are_required():
    with pytest.raises(ValueError, match="layer-ls chooses on held-out"):
        recover(tiny_model("llama"), "2-3", ["layer-ls"], windows(4))


@pytest.mark.parametrize(("family", "why"), [("olmo2", "normalise the MLP output"), ("gpt2", "Conv1D"),
                                             ("gpt_neox", "with a bias")])
def test_layers_it_cannot_solve_are_refused_with_a_clear_message(family, why):
    with pytest.raises(ValueError, match=why):
        check_layers(tiny_model(family))
    with pytest.raises(ValueError, match="Use ghost-auto or streamline-layer"):
        recover(tiny_model(family), "2-3", ["layer-ls"], windows(4, 16), windows(4, 16, seed=3))


def test_the_registry_entry_is_closed_form_and_chosen_on_held_out_windows():
    entry = registry.REGISTRY["layer-ls"]
    assert entry.closed_form and entry.kind == registry.LAYER and entry.heldout == "required"
    assert "layer-ls" not in registry.TRAINED_METHODS and COPY == float("inf")


def test_the_grid_skips_it_with_a_note_on_layers_it_cannot_solve():
    from ghosted.grid.run import applicable

    methods, notes = applicable(["ghost", "layer-ls"], [2, 3], tiny_model("olmo2"))
    assert methods == ["ghost"] and len(notes) == 1 and notes[0].startswith("layer-ls skipped: layer-ls solves")
    assert applicable(["ghost", "layer-ls"], [2, 3], tiny_model("llama")) == (["ghost", "layer-ls"], [])

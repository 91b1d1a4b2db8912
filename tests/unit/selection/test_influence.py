"""Every influence criterion against its direct definition, computed independently here.

Boundaries come from ``output_hidden_states`` of a private copy whose final norm is the identity (so
h_L is the last layer's output before the norm), never from ``ghosted.models.capture``. Removal criteria
are checked against a copy whose removed layers are skipped by identity hooks.
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from ghosted.models.architecture import get_path, layers_of, spec_for, with_hidden
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.selection.criteria import CRITERIA, SINGLE_PASS, InfluenceConfig, InfluenceReport, influence
from ghosted.selection.sums import GramSums, TokenWeightedSums, gram_bytes, last_valid_index, recoverability
from ghosted.selection.rules import select, selections
from ghosted.recovery.solvers import ghost_operator, relative_error, stream_error
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model
from tests.tolerance import FLOAT64_REL, TINY_MODEL_TOL

EPS = 1e-6
SIMILARITY = ["streamline_cosine", "angular_all", "angular_last", "seqcos_streamline", "block_influence",
              "seqcos_shortgpt", "recoverability"]


def windows_of(ids: torch.Tensor, mask: torch.Tensor | None = None) -> TokenWindows:
    return TokenWindows(ids, torch.ones_like(ids) if mask is None else mask, {"source": "test"})


def padded_windows() -> TokenWindows:
    """Three sequences of 24 tokens; the last one is right-padded after 15 tokens."""
    ids = random_ids(3, 24, seed=3)
    mask = torch.ones_like(ids)
    mask[2, 15:] = 0
    ids[2, 15:] = 0
    return windows_of(ids, mask)


def pre_norm_states(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """h_0 .. h_L (each (B, T, d) float64) from output_hidden_states of a copy without final norm."""
    twin = copy.deepcopy(model)
    spec = spec_for(twin)
    setattr(get_path(twin, spec.stack), spec.final_norm, torch.nn.Identity())
    with torch.no_grad():
        out = twin(input_ids=ids, output_hidden_states=True, use_cache=False)
    return [h.double() for h in out.hidden_states]


def per_sequence_states(model, windows: TokenWindows) -> list[list[torch.Tensor]]:
    """Boundaries of each sequence run alone without its padding: [sequence][boundary] -> (T_b, d)."""
    out = []
    for ids, mask in zip(windows.input_ids, windows.attention_mask):
        kept = ids[mask.bool()].unsqueeze(0)  # (1, T_b)
        out.append([h[0] for h in pre_norm_states(model, kept)])
    return out


def direct_similarities(states: list[list[torch.Tensor]], s: int, e: int) -> dict[str, float]:
    """The published definitions, token by token and sequence by sequence."""
    cos = torch.cat([F.cosine_similarity(seq[s], seq[e], dim=-1) for seq in states])  # (N,)
    last = torch.stack([F.cosine_similarity(seq[s][-1], seq[e][-1], dim=0) for seq in states])  # (S,)
    seqcos = torch.stack([torch.cosine_similarity(seq[s][None], seq[e][None]).mean() for seq in states])
    return {"streamline_cosine": float(cos.mean()),
            "angular_all": float((torch.arccos(cos.clamp(-1, 1)) / math.pi).mean()),
            "angular_last": float((torch.arccos(last.clamp(-1, 1)) / math.pi).mean()),
            "seqcos_streamline": float(seqcos.mean())}


def direct_recoverability(x: torch.Tensor, y: torch.Tensor, held: tuple) -> tuple[float, float, float]:
    """From token rows, with (XᵀX + εI)M = XᵀΔ: ‖XM − Δ‖²/‖Δ‖², the same on held-out rows (x, y),
    and mean_t ‖x_t M − δ_t‖²/‖y_t‖²."""
    delta = y - x  # (N, d)
    eye = torch.eye(x.shape[1], dtype=x.dtype)
    m = torch.linalg.solve(x.T @ x + EPS * eye, x.T @ delta)  # (d, d)
    residual = x @ m - delta  # (N, d)
    fit = float((residual**2).sum() / (delta**2).sum())
    token = float(((residual**2).sum(1) / (y**2).sum(1)).mean())
    hx, hy = held
    return fit, float(((hx @ m - (hy - hx)) ** 2).sum() / ((hy - hx) ** 2).sum()), token


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", layers=6)


@pytest.fixture(scope="module")
def report(model):
    cfg = InfluenceConfig(metrics=SIMILARITY, batch_size=2)
    return influence(model, padded_windows(), cfg)


def test_similarities_match_their_definitions_for_every_block(model, report):
    states = per_sequence_states(model, padded_windows())
    total = 6
    for n in range(1, total):  # n = 1 .. L-1, blocks touching layer 0 and the last layer included
        for s in range(total - n + 1):
            want = direct_similarities(states, s, s + n)
            for metric, value in want.items():
                got = report.matrix(metric).loc[s, n]  # batched and padded here, one by one in want
                assert got == pytest.approx(value, rel=TINY_MODEL_TOL, abs=TINY_MODEL_TOL), (metric, s, n)


def test_layer_criteria_are_the_n1_blocks(model, report):
    states = per_sequence_states(model, padded_windows())
    for layer in range(6):
        want = direct_similarities(states, layer, layer + 1)  # 1 - cos: absolute on the cosine's scale
        assert report.layer_values("block_influence")[layer] == pytest.approx(1 - want["streamline_cosine"],
                                                                              abs=TINY_MODEL_TOL)
        assert report.layer_values("seqcos_shortgpt")[layer] == pytest.approx(want["seqcos_streamline"],
                                                                              abs=TINY_MODEL_TOL)


def test_recoverability_matches_the_token_level_definition(model):
    fit, held = padded_windows(), windows_of(random_ids(2, 24, seed=9))
    metrics = ["recoverability", "recoverability_heldout", "recoverability_token"]
    report = influence(model, fit, InfluenceConfig(metrics=metrics), heldout=held)
    rows = per_sequence_states(model, fit)
    held_states = pre_norm_states(model, held.input_ids)
    for n in (1, 3, 5):
        for s in range(6 - n + 1):
            x = torch.cat([seq[s] for seq in rows])  # (N, d) valid tokens only
            y = torch.cat([seq[s + n] for seq in rows])  # (N, d)
            hx, hy = held_states[s].flatten(0, 1), held_states[s + n].flatten(0, 1)  # (N_h, d)
            want_fit, want_held, want_token = direct_recoverability(x, y, (hx, hy))
            # ratios in [0, 1] of float32 hidden states (batched here, one by one in want)
            assert report.matrix("recoverability").loc[s, n] == pytest.approx(want_fit, rel=TINY_MODEL_TOL,
                                                                              abs=TINY_MODEL_TOL)
            assert report.matrix("recoverability_heldout").loc[s, n] == pytest.approx(want_held, rel=TINY_MODEL_TOL,
                                                                                      abs=TINY_MODEL_TOL)
            assert report.matrix("recoverability_token").loc[s, n] == pytest.approx(want_token, rel=TINY_MODEL_TOL,
                                                                                    abs=TINY_MODEL_TOL)


def test_token_recoverability_is_not_fooled_by_one_huge_token():
    """Δ = a big change on one token plus an unfittable change on the others: the ‖Δ‖²-weighted
    score calls it recoverable, the token-normalised one does not."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=gen, dtype=torch.float64)
    y = x + 0.5 * torch.randn(400, 8, generator=gen, dtype=torch.float64)  # noise: no linear map fits it
    x[:, 7] = y[:, 7] = 0.0
    x[0], y[0] = torch.eye(8, dtype=torch.float64)[7], 200.0 * torch.eye(8, dtype=torch.float64)[7]  # the sink
    stack = torch.stack([x, y], dim=1)[None]  # (1, N, 2, d)
    valid = torch.ones(1, 400, dtype=torch.bool)
    cpu = torch.device("cpu")
    grams, weighted = GramSums([(0, 1)], 2, 8, cpu), TokenWeightedSums([(0, 1)], 8, cpu)
    grams.add(stack, valid)
    weighted.add(stack, valid)
    errors = recoverability(grams, None, [(0, 1)], weighted=weighted)[(0, 1)]
    _, _, want_token = direct_recoverability(x, y, (x, y))
    assert errors["recoverability_token"] == pytest.approx(want_token, rel=1e-6)
    assert errors["recoverability"] < 0.05 < 0.15 < errors["recoverability_token"]


def test_recoverability_equals_the_ghost_fit_error_of_recover(model):
    windows = windows_of(random_ids(4, 20, seed=4))
    report = influence(model, windows, InfluenceConfig(metrics=["recoverability"], n_values=[2]))
    stats = collect_stats(model, windows, [Gap(3, 5)], CalibrationConfig(replaceme=False, linearpatch=False))[Gap(3, 5)]
    want = relative_error(stats, stream_error(stats, ghost_operator(stats, eps=EPS)))
    # two float32 forward passes (influence's batches and collect_stats'): a ratio in [0, 1]
    assert report.matrix("recoverability").loc[3, 2] == pytest.approx(want, rel=TINY_MODEL_TOL, abs=TINY_MODEL_TOL)


def test_boundary_L_is_before_the_final_norm():
    model = tiny_model("llama", layers=6)
    with torch.no_grad():  # a norm weight that is not all ones, so norming changes cosines
        get_path(model, spec_for(model).stack).norm.weight.uniform_(0.2, 3.0)
    ids = padded_windows().input_ids[:2]  # unpadded sequences
    pre = pre_norm_states(model, ids)
    with torch.no_grad():
        hf = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    norm = get_path(model, spec_for(model).stack).norm
    with torch.no_grad():
        assert torch.allclose(hf[-1].double(), norm(pre[-1].float()).double(), atol=1e-5)  # HF's last is normed
    sub = influence(model, windows_of(ids), InfluenceConfig(metrics=["streamline_cosine"], n_values=[1]))
    ours = sub.matrix("streamline_cosine").loc[5, 1]
    with_pre = float(F.cosine_similarity(pre[5], pre[6], dim=-1).mean())
    with_hf = float(F.cosine_similarity(pre[5], hf[-1].double(), dim=-1).mean())
    assert ours == pytest.approx(with_pre, abs=TINY_MODEL_TOL)  # a cosine: absolute on its scale of 1
    assert abs(ours - with_hf) > 1e-3


def test_padding_never_counts(model, report):
    windows = padded_windows()
    garbage = windows.input_ids.clone()
    garbage[2, 15:] = random_ids(1, 9, seed=11)[0]  # different pad ids, same mask
    again = influence(model, windows_of(garbage, windows.attention_mask),
                      InfluenceConfig(metrics=SIMILARITY, batch_size=2))
    # masked pad keys get exactly zero attention, so valid tokens see the same float32 ops whatever the pad
    # ids (same machine, same thread count): only float64 round-off may differ
    pd.testing.assert_frame_equal(again.blocks, report.blocks, rtol=FLOAT64_REL)
    assert report.meta["tokens"] == 24 + 24 + 15


def test_last_valid_index_handles_left_and_right_padding():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]).bool()
    assert last_valid_index(mask).tolist() == [2, 4, 4]


def test_restricting_n_values_keeps_the_values_and_the_memory_small(model, report):
    few = influence(model, padded_windows(), InfluenceConfig(metrics=["recoverability"], n_values=[1, 5],
                                                             batch_size=2))
    assert sorted(set(few.blocks.n)) == [1, 5]
    full = report.blocks[report.blocks.metric == "recoverability"]
    merged = few.blocks.merge(full, on=["metric", "start", "n", "end"])
    # the same float32 forward pass (same machine, same thread count); only the float64 Gram layout and
    # the float64 ridge solves differ, on values in [0, 1]
    assert len(merged) == 6 + 2 and (merged.value_x - merged.value_y).abs().max() < 1e-9
    assert few.meta["gram_bytes"] < report.meta["gram_bytes"]


def test_recoverability_can_have_its_own_block_sizes(model, report):
    cfg = InfluenceConfig(metrics=["streamline_cosine", "recoverability"], recoverability_n_values=[2], batch_size=2)
    mixed = influence(model, padded_windows(), cfg)
    assert sorted(set(mixed.blocks[mixed.blocks.metric == "streamline_cosine"].n)) == [1, 2, 3, 4, 5]
    rec = mixed.blocks[mixed.blocks.metric == "recoverability"]  # same forward pass: float64 round-off only
    assert sorted(set(rec.n)) == [2] and mixed.meta["recoverability_n_values"] == [2]
    pd.testing.assert_series_equal(rec.set_index("start").value,
                                   report.matrix("recoverability")[2].dropna().rename("value"), rtol=1e-9,
                                   check_index_type=False)


def test_gram_memory_is_fixed_by_the_blocks_not_the_tokens():
    blocks = [(s, s + n) for n in (7, 11) for s in range(31 - n)]
    assert gram_bytes(blocks, 576) == 75 * 8 * 576 * 576  # 24 + 20 cross pairs, 31 diagonal
    every = [(s, s + n) for n in range(1, 30) for s in range(31 - n)]
    assert gram_bytes(every, 576) == 495 * 8 * 576 * 576  # upper triangle but (0, L): ~1.3 GB
    sums = GramSums([(0, 2), (1, 2)], 3, 4, torch.device("cpu"))
    before = sums.nbytes
    for _ in range(3):
        sums.add(torch.randn(2, 50, 3, 4, dtype=torch.float64), torch.ones(2, 50, dtype=torch.bool))
    assert sums.nbytes == before == gram_bytes([(0, 2), (1, 2)], 4) and sums.tokens == 300


def test_gram_limit_refuses_with_advice(model):
    with pytest.raises(ValueError, match="Restrict n_values"):
        influence(model, padded_windows(), InfluenceConfig(metrics=["recoverability"], max_gram_gib=1e-6))


def skip_layers(model, removed: set[int]):
    """A copy of ``model`` whose ``removed`` layers pass their input through unchanged."""
    twin = copy.deepcopy(model)
    for i in removed:
        def identity(module, args, kwargs, output):
            return with_hidden(output, args[0] if args else kwargs["hidden_states"])
        layers_of(twin)[i].register_forward_hook(identity, with_kwargs=True)
    return twin


def direct_nll(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits  # (B, T, V)
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), ids[:, 1:].flatten()))


def test_single_removal_perplexity_matches_skipping_each_layer(model):
    ids = random_ids(3, 16, seed=5)
    report = influence(model, windows_of(ids), InfluenceConfig(metrics=["ppl_single"], batch_size=2))
    for layer in range(6):
        want = math.exp(direct_nll(skip_layers(model, {layer}), ids))
        assert report.layer_values("ppl_single")[layer] == pytest.approx(want, rel=TINY_MODEL_TOL)  # float32 logits
    assert report.meta["dense_calibration_ppl"] == pytest.approx(math.exp(direct_nll(model, ids)), rel=TINY_MODEL_TOL)


def test_sleb_follows_the_greedy_definition(model):
    ids = random_ids(2, 16, seed=6)
    report = influence(model, windows_of(ids), InfluenceConfig(metrics=["sleb"], sleb_steps=3))
    alive, order = list(range(6)), []
    for _ in range(3):
        trials = {c: direct_nll(skip_layers(model, set(range(6)) - set(alive) | {c}), ids) for c in alive[1:-1]}
        best = min(trials, key=trials.get)
        alive.remove(best)
        order.append(best)
    steps = report.layer_values("sleb").dropna().sort_values()
    assert list(steps.index) == order
    layers, reason = select(report, "sleb", 2)
    assert layers == sorted(order[:2]) and "greedy" in reason
    assert 0 not in order and 5 not in order  # the first and last layers are never candidates


def taylor_direct(model, ids: torch.Tensor) -> list[float]:
    twin = copy.deepcopy(model)
    twin.requires_grad_(True)
    logits = twin(input_ids=ids, use_cache=False).logits  # (B, T, V)
    F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return [sum(float((p.detach() * p.grad).abs().sum())
                for name, p in layer.named_parameters() if name.endswith("weight"))
            for layer in layers_of(twin)]


def parameter_state(model) -> list[tuple]:
    return [(name, p.requires_grad, None if p.grad is None else p.grad.clone(), p.detach().clone())
            for name, p in model.named_parameters()]


@pytest.mark.parametrize("requires_grad", [False, True])
def test_taylor_matches_its_definition_and_leaves_the_model_alone(requires_grad):
    model = tiny_model("llama", layers=6)
    model.requires_grad_(requires_grad)
    ids = random_ids(4, 12, seed=7)
    before = parameter_state(model)
    report = influence(model, windows_of(ids), InfluenceConfig(metrics=["taylor"], batch_size=3))
    want = taylor_direct(model, ids)
    got = report.layer_values("taylor")
    for layer in range(6):
        assert got[layer] == pytest.approx(want[layer], rel=1e-4)
    after = parameter_state(model)
    for (name, grad_flag, grad, value), (_, grad_flag2, grad2, value2) in zip(before, after):
        assert grad_flag == grad_flag2 == requires_grad, name
        assert grad is None and grad2 is None, name
        assert torch.equal(value, value2), name


def frame_report(total: int, blocks: dict[str, dict[tuple[int, int], float]],
                 layers: dict[str, list[float]]) -> InfluenceReport:
    block_rows = [(m, s, n, s + n, v) for m, values in blocks.items() for (s, n), v in values.items()]
    layer_rows = [(m, i, v) for m, values in layers.items() for i, v in enumerate(values)]
    return InfluenceReport(pd.DataFrame(block_rows, columns=["metric", "start", "n", "end", "value"]),
                           pd.DataFrame(layer_rows, columns=["metric", "layer", "value"]), total)


def test_block_rules_at_the_edges():
    total = 8
    best_at_ends = {(s, n): (1.0 if s in (0, total - n) else 0.5 - 0.01 * s)
                    for n in (1, 2, 7) for s in range(total - n + 1)}
    rep = frame_report(total, {"streamline_cosine": best_at_ends, "seqcos_streamline": best_at_ends,
                               "angular_all": {k: -v for k, v in best_at_ends.items()}}, {})
    assert select(rep, "streamline_cosine", 1)[0] == [0]  # may touch layer 0 (ties: lower start)
    assert select(rep, "angular_all", 2)[0] == [0, 1]  # lowest distance wins
    assert select(rep, "seqcos_streamline", 1)[0] == [1]  # never start 0 ...
    assert select(rep, "seqcos_streamline", 2)[0] == [1, 2]  # ... nor a block touching the last layer
    assert select(rep, "streamline_cosine", 7)[0] == list(range(7))  # n = L - 1
    with pytest.raises(ValueError, match="allows no block"):
        select(rep, "seqcos_streamline", 7)
    with pytest.raises(ValueError, match="n_values"):
        select(rep, "streamline_cosine", 3)


def test_layer_rules():
    total = 10
    rising = [float(i) for i in range(total)]
    rep = frame_report(total, {}, {"block_influence": rising, "seqcos_shortgpt": rising, "taylor": rising})
    assert select(rep, "block_influence", 3)[0] == [0, 1, 2]  # lowest influence
    assert select(rep, "seqcos_shortgpt", 2)[0] == [7, 8]  # highest similarity, last layer excluded
    assert select(rep, "taylor", 2)[0] == [4, 5]  # Taylor+: layers 0-3 and the last two stay
    with pytest.raises(ValueError, match="fewer than n"):
        select(rep, "taylor", 5)


def test_select_on_a_model_agrees_with_the_report(model, report):
    for metric in ("recoverability", "block_influence", "seqcos_streamline"):
        direct, reason = select(model, metric, 2, windows=padded_windows(), config=InfluenceConfig(batch_size=2))
        assert (direct, reason) == select(report, metric, 2)
        assert metric in reason
    with pytest.raises(ValueError, match="windows"):
        select(model, "block_influence", 2)


def test_report_frames_and_files(report, tmp_path):
    assert list(report.blocks.columns) == ["metric", "start", "n", "end", "value"]
    assert list(report.layers.columns) == ["metric", "layer", "value"]
    assert (report.blocks.end == report.blocks.start + report.blocks.n).all()
    assert report.matrix("streamline_cosine").shape == (6, 5)  # starts 0..5 × n 1..5
    paths = report.save(tmp_path)
    assert pd.read_csv(paths[0]).shape == report.blocks.shape
    import json
    data = json.loads(paths[2].read_text())
    assert data["criteria"]["seqcos_streamline"]["label"].startswith("SEQUENCE-AXIS")
    table = selections(report, [1, 5])
    assert set(table.metric) == set(SIMILARITY) and table.layers.notna().sum() >= 12


def test_every_criterion_is_registered_with_a_rule():
    assert set(SINGLE_PASS) == {m for m, c in CRITERIA.items() if c.cost in ("pass", "heldout")}
    assert {c.prune for c in CRITERIA.values()} == {"highest", "lowest"}
    with pytest.raises(ValueError, match="Unknown criteria"):
        influence(tiny_model("llama"), padded_windows(), InfluenceConfig(metrics=["bogus"]))

"""Sink detection and the sink-robust fit, on synthetic data with a known massive token."""

import torch

from ghosted.recovery.diagnostics import residual_gram_of, sink_residual_gram
from ghosted.operators.assembly import GapFit
from ghosted.recovery.robust import fit_robust
from ghosted.calibration.sinks import SinkDetector, SinkRule, first_valid, fit_sink_map, position_sinks, sink_map_error
from ghosted.recovery.solvers import ghost_operator, relative_error, stream_error
from ghosted.calibration.stats import BoundaryAccumulator

D, T = 16, 32


def synthetic(n_seqs, seed, sink_offset=2000.0):
    """Ordinary tokens follow Y = X·A + noise; position 0 jumps to a fixed huge vector."""
    gen = torch.Generator().manual_seed(seed)
    a_true = torch.eye(D) + 0.3 * torch.randn(D, D, generator=torch.Generator().manual_seed(99))
    x = torch.randn(n_seqs, T, D, generator=gen, dtype=torch.float64)  # (B, T, d)
    y = x @ a_true.double() + 0.01 * torch.randn(n_seqs, T, D, generator=gen, dtype=torch.float64)
    target = torch.zeros(D, dtype=torch.float64)
    target[0] = sink_offset  # input-independent: the sink's X_post is the same vector every time
    y[:, 0] = target + 0.01 * torch.randn(n_seqs, D, generator=gen, dtype=torch.float64)
    return x, y


def accumulate(x, y, rule):
    acc = BoundaryAccumulator(0, 1, D, with_mlp=False)
    detector = SinkDetector(rule)
    valid = torch.ones(x.shape[:2], dtype=torch.bool)
    acc.update(x, y, valid, sink=detector(x, valid))
    return acc.finalize()


def test_paper_fit_degrades_ordinary_tokens_and_robust_fit_does_not():
    rule = SinkRule(position=True)
    fit_stats = accumulate(*synthetic(16, seed=0), rule)
    held = accumulate(*synthetic(8, seed=1), rule)
    paper = ghost_operator(fit_stats)
    robust = fit_robust(fit_stats, held)
    ordinary = held.without_sink()
    paper_err = relative_error(ordinary, stream_error(ordinary, paper))
    robust_err = relative_error(ordinary, stream_error(ordinary, robust.weight))
    assert paper_err > 10 * robust_err
    assert robust_err < 0.01
    # and the sink itself is mapped to its (input-independent) target
    assert sink_map_error(held.sink_only(), robust.sink_map) / held.sink.n_tokens < 1.0


def test_robust_and_paper_agree_when_no_sink_exists():
    x, y = synthetic(16, seed=0)
    y[:, 0] = y[:, 1]  # position 0 is now an ordinary token
    x[:, 0] = x[:, 1]
    by_norm = accumulate(x, y, SinkRule(position=False, norm_factor=10.0))
    assert by_norm.sink.n_tokens == 0  # nothing is massive: nothing is flagged
    torch.testing.assert_close(fit_robust(by_norm, None, choose_ridge=False).weight, ghost_operator(by_norm))


def test_norm_rule_finds_massive_tokens_anywhere():
    x, y = synthetic(4, seed=0)
    x[2, 7] *= 500  # a massive token in the middle of a sequence
    detector = SinkDetector(SinkRule(position=False, norm_factor=20.0))
    mask = detector(x, torch.ones(x.shape[:2], dtype=torch.bool))
    assert mask.nonzero().tolist() == [[2, 7]]
    assert detector.position_counts == {7: 1}


def test_sink_residual_gram_matches_direct_computation():
    x, y = synthetic(6, seed=3)
    stats = accumulate(x, y, SinkRule(position=True))
    for kind in ("constant", "affine"):
        smap = fit_sink_map(stats.sink_only(), kind)
        xs, ys = x[:, 0], y[:, 0]  # (B, d) the sink tokens
        pred = smap.constant.expand_as(ys) if smap.linear is None else xs @ smap.linear + smap.constant
        r = pred - ys
        torch.testing.assert_close(sink_residual_gram(stats.sink_only(), smap), r.T @ r)
        assert abs(sink_map_error(stats.sink_only(), smap) - float((r * r).sum())) < 1e-6 * float((ys * ys).sum())
    fit = GapFit(stream=torch.eye(D, dtype=torch.float64), sink_map=fit_sink_map(stats.sink_only()))
    total = residual_gram_of(fit, stats)
    ordinary = (y[:, 1:] - x[:, 1:]).reshape(-1, D)
    sink_r = fit.sink_map.constant - y[:, 0]
    torch.testing.assert_close(total, ordinary.T @ ordinary + sink_r.T @ sink_r)


def test_residual_gram_reads_cpu_maps_on_the_statistics_device():
    """Statistics on an accelerator and a map solved on the CPU (ReplaceMe-cosine's token sample):
    the error is computed on the statistics' device. The meta device mixes with the CPU as CUDA does."""
    from dataclasses import replace

    x, y = synthetic(2, seed=4)
    stats = accumulate(x, y, SinkRule(position=True))
    with_branch = replace(stats, mtm=stats.xtx, mtd=stats.xtd, sink=None)  # stand-in branch sums: shapes count
    eye = torch.eye(D, dtype=torch.float64)  # on the CPU
    cases = [(GapFit(branch=eye), with_branch), (GapFit(stream=eye), stats),
             (GapFit(stream=eye, sink_map=fit_sink_map(stats.sink_only())), stats)]
    for fit, sums in cases:
        assert residual_gram_of(fit, sums.to("meta")).device.type == "meta"


def test_first_valid_with_left_padding():
    valid = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert first_valid(valid).tolist() == [[False, False, True, False], [True, False, False, False]]


def test_position_sinks_prefill_decode_and_position_ids():
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    got = position_sinks((), {"input_ids": ids, "attention_mask": mask})
    assert got.tolist() == [[False, True, False, False], [True, False, False, False]]

    class Cache:
        def get_seq_length(self):
            return 4
    decode = position_sinks((), {"input_ids": ids[:, :1], "attention_mask": mask, "cache": Cache()})
    assert not decode.any()  # a decoding step is never the sink
    pos = torch.tensor([[1, 0, 1, 2]])
    assert position_sinks((), {"input_ids": ids[:1], "position_ids": pos}).tolist() == [[False, True, False, False]]

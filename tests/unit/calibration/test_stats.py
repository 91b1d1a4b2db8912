"""Streaming boundary statistics equal the stacked computation on valid tokens only."""
from __future__ import annotations

import pytest
import torch

from ghosted.core.hadamard import normalized_hadamard
from ghosted.calibration.stats import BoundaryAccumulator, BoundaryStats, TokenReservoir

D = 8  # tiny hidden size with a Sylvester Hadamard


def make_batches(n_batches: int = 3, b: int = 3, t: int = 7, d: int = D, seed: int = 0):
    """Random (x, y, m, valid, sink) batches with right padding and one all-padding row."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(n_batches):
        x = torch.randn(b, t, d, generator=gen) * torch.linspace(0.5, 4.0, d)  # (B, T, d)
        m = torch.randn(b, t, d, generator=gen)  # (B, T, d)
        y = x + 0.3 * torch.randn(b, t, d, generator=gen) + 0.5 * m  # (B, T, d)
        lengths = torch.randint(1, t + 1, (b,), generator=gen)
        lengths[0] = 0 if i == 1 else lengths[0]  # one sequence that is all padding
        valid = torch.arange(t) < lengths[:, None]  # (B, T)
        sink = torch.zeros(b, t, dtype=torch.bool)  # (B, T)
        sink[:, 0] = True  # first-position "attention sink" tokens
        sink &= valid | (torch.rand(b, t, generator=gen) > 0.5)  # some sinks on padding too
        batches.append((x, y, m, valid, sink))
    return batches


def accumulate(batches, **kwargs) -> BoundaryStats:
    acc = BoundaryAccumulator(3, 5, D, with_mlp=True, **kwargs)
    for x, y, m, valid, sink in batches:
        acc.update(x, y, valid, m=m, sink=sink)
    return acc.finalize()


def stacked(batches, select=lambda valid, sink: valid):
    """Token rows (N, d) in float64 of the tokens chosen by `select`."""
    rows = [[], [], []]
    for x, y, m, valid, sink in batches:
        mask = select(valid, sink)
        for out, t in zip(rows, (x, y, m)):
            out.append(t[mask].double())
    return [torch.cat(r) for r in rows]


def assert_moments_match(stats: BoundaryStats, x, y, m) -> None:
    delta = y - x  # (N, d)
    assert stats.n_tokens == x.shape[0]
    torch.testing.assert_close(stats.xtx, x.T @ x)
    torch.testing.assert_close(stats.xtd, x.T @ delta)
    torch.testing.assert_close(stats.dtd, delta.T @ delta)
    torch.testing.assert_close(stats.x_sum, x.sum(0))
    torch.testing.assert_close(stats.y_sum, y.sum(0))
    torch.testing.assert_close(stats.mtm, m.T @ m)
    torch.testing.assert_close(stats.mtd, m.T @ delta)


def test_streaming_stats_equal_stacked_valid_tokens():
    batches = make_batches()
    stats = accumulate(batches)
    assert stats.xtx.dtype == torch.float64
    assert_moments_match(stats, *stacked(batches))


def test_linearpatch_ratios_use_valid_tokens_of_each_sequence():
    batches = make_batches()
    stats = accumulate(batches)
    h = normalized_hadamard(D)
    plain, rotated, n = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64), 0
    for x, y, _, valid, _ in batches:
        for seq in range(x.shape[0]):
            xs, ys = x[seq][valid[seq]].double(), y[seq][valid[seq]].double()  # (t, d)
            if xs.shape[0] == 0:
                continue
            n += 1
            plain += ys.abs().mean(0) / xs.abs().mean(0)
            rotated += (ys @ h).abs().mean(0) / (xs @ h).abs().mean(0)
    assert stats.n_samples == n
    torch.testing.assert_close(stats.lp_ratio_sum, plain)
    torch.testing.assert_close(stats.lp_rot_ratio_sum, rotated)


def test_low_precision_inputs_are_accumulated_in_float64():
    as_bf16 = lambda t: t.bfloat16() if t.is_floating_point() else t  # noqa: E731
    batches = [tuple(as_bf16(t) for t in batch) for batch in make_batches()]
    stats = accumulate(batches)
    assert stats.xtx.dtype == torch.float64
    assert_moments_match(stats, *stacked(batches))


def _tensors(obj, seen=None):
    """Every tensor reachable from an object's attributes (recursively)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    children = obj.values() if isinstance(obj, dict) else getattr(obj, "__dict__", {}).values()
    return [t for child in children for t in _tensors(child, seen)]


def test_accumulator_keeps_no_activations():
    held = []
    for n_batches in (4, 8):
        acc = BoundaryAccumulator(3, 5, D, with_mlp=True)
        for x, y, m, valid, sink in make_batches(n_batches=n_batches, t=11):
            acc.update(x, y, valid, m=m, sink=sink)
        tensors = _tensors(acc)
        # only (d,) and (d, d) sums, and the (T,) per-position sums of the window length T = 11
        assert tensors and all(all(size == D for size in t.shape) or t.shape == (11,) for t in tensors)
        held.append(sum(t.numel() for t in tensors))
    assert held[0] == held[1]  # twice the tokens, the same memory


def test_reservoir_is_bounded_and_holds_real_rows():
    batches = make_batches(n_batches=4, t=11)
    stats = accumulate(batches, reservoir_tokens=5)
    sample = stats.replaceme_samples
    x, y, m = stacked(batches)
    assert sample.m.shape == (5, D) and sample.m.dtype == torch.float32
    assert sample.seen == x.shape[0]
    target = (y - x + m).float()  # (N, d)
    for row_m, row_t in zip(sample.m, sample.target):
        index = (m.float() - row_m).abs().sum(1).argmin()
        torch.testing.assert_close(row_m, m[index].float())
        torch.testing.assert_close(row_t, target[index])


def test_reservoir_is_uniform_and_seeded():
    counts = torch.zeros(60)
    for seed in range(300):
        reservoir, gen = TokenReservoir.empty(6, 1), torch.Generator().manual_seed(seed)
        for chunk in torch.arange(60.0).split([4, 1, 17, 8, 30]):
            reservoir.offer(chunk[:, None], chunk[:, None], gen)
        counts[reservoir.m.squeeze(1).long()] += 1
    inclusion = counts / 300  # expected 6/60 = 0.1 for every token
    assert abs(inclusion[:30].mean() - 0.1) < 0.02 and abs(inclusion[30:].mean() - 0.1) < 0.02
    first = accumulate(make_batches(), reservoir_tokens=4, seed=7).replaceme_samples
    again = accumulate(make_batches(), reservoir_tokens=4, seed=7).replaceme_samples
    assert torch.equal(first.m, again.m)  # seeded reservoir: the same rows are kept (same machine, same thread count)


def test_sink_split_adds_up():
    batches = make_batches()
    stats = accumulate(batches)
    sink, rest = stats.sink_only(), stats.without_sink()
    assert_moments_match(sink, *stacked(batches, lambda valid, s: valid & s))
    assert_moments_match(rest, *stacked(batches, lambda valid, s: valid & ~s))
    assert sink.n_tokens + rest.n_tokens == stats.n_tokens
    for name in ("xtx", "xtd", "dtd", "x_sum", "y_sum", "mtm", "mtd"):
        torch.testing.assert_close(getattr(sink, name) + getattr(rest, name), getattr(stats, name))


def test_merge_equals_accumulating_everything():
    batches = make_batches(n_batches=4)
    whole = accumulate(batches, reservoir_tokens=6)
    first, rest = batches[:1], batches[1:]
    merged = accumulate(first, reservoir_tokens=6) + accumulate(rest, reservoir_tokens=6)
    assert merged.n_tokens == whole.n_tokens and merged.n_samples == whole.n_samples
    for name in ("xtx", "xtd", "dtd", "mtm", "mtd", "lp_ratio_sum", "lp_rot_ratio_sum"):
        torch.testing.assert_close(getattr(merged, name), getattr(whole, name))
    torch.testing.assert_close(merged.sink.xtx, whole.sink.xtx)
    assert merged.replaceme_samples.m.shape == (6, D)
    assert merged.replaceme_samples.seen == whole.n_tokens


def test_merge_rejects_other_boundary_and_update_checks_m():
    a = accumulate(make_batches())
    other = BoundaryAccumulator(4, 6, D, with_mlp=False)
    x, y, _, valid, _ = make_batches()[0]
    other.update(x, y, valid)
    with pytest.raises(ValueError):
        a.merge(other.finalize())
    with pytest.raises(ValueError, match="with_mlp"):
        other.update(x, y, valid, m=x)
    assert other.finalize().mtm is None


def test_without_sink_requires_sink_masks():
    acc = BoundaryAccumulator(0, 1, D, with_mlp=False, lp=False)
    x, y, _, valid, _ = make_batches()[0]
    acc.update(x, y, valid)
    stats = acc.finalize()
    assert stats.lp_ratio_sum is None and stats.sink is None
    with pytest.raises(ValueError, match="sink"):
        stats.without_sink()


def test_per_position_sums_equal_stacked_and_merge_across_lengths():
    batches = make_batches()
    stats = accumulate(batches)
    expected_sq, expected_n = torch.zeros(7, dtype=torch.float64), torch.zeros(7, dtype=torch.float64)
    for x, y, _, valid, _ in batches:
        expected_sq += (((y - x).double() ** 2).sum(-1) * valid).sum(0)
        expected_n += valid.sum(0)
    torch.testing.assert_close(stats.position_dtd, expected_sq)
    torch.testing.assert_close(stats.position_tokens, expected_n)
    torch.testing.assert_close(stats.position_dtd.sum(), torch.trace(stats.dtd))  # every valid token once
    longer = accumulate(make_batches(n_batches=1, t=10, seed=1))
    merged = stats + longer
    assert merged.position_dtd.shape == (10,)
    torch.testing.assert_close(merged.position_dtd[:7], stats.position_dtd + longer.position_dtd[:7])
    assert stats.without_sink().position_dtd is None  # positions mix sink and other tokens

"""The Learn page's numbers, read from a tiny run: each step's facts match the run's own frames and its
evaluation, and each rule picking a sentence (spread Δ, dominating sink) decides at its threshold."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest

from ghosted.service import lessons
from ghosted.service import workbench as wb
from ghosted.service.results import ZeroShot
from ghosted.recovery.diagnostics import directions_holding, removed_shares
from tests.tiny import tiny_loaded

FIT = dict(model="tiny", layers=(2, 3), calib_seqs=4, seq_len=24, heldout_seqs=2, methods=("ghost", "ghost-auto"),
           batch_size=2)


@pytest.fixture(scope="module")
def run():
    """A tiny run of ghost and ghost-auto, with its evaluation."""
    lm = tiny_loaded(layers=6)
    fit = wb.FitRequest(**FIT)
    fitted = fit.compute(lm)
    return fitted.with_results(evaluation=wb.EvalRequest(fit=fit, eval_tokens=96, eval_seq_len=24).compute(lm, fitted))


def test_pruning_reads_the_gap_its_tokens_and_the_spectrum(run):
    told = lessons.pruning(run)
    assert (told.layers, told.gap, told.end, told.gaps) == ("2-3", "2-3", 4, 1)
    assert told.tokens == run.frames["errors"].query("split == 'fit'").tokens.iloc[0]
    table = run.evaluation.table
    assert (told.dense_ppl, told.pruned_ppl) == (table.row("dense").ppl, table.row("pruned").ppl)
    spectra = run.frames["spectra"]
    delta = spectra[(spectra.gap == "2-3") & (spectra.method == "pruned")].singular_value
    assert (told.top, told.directions) == (directions_holding(delta, 0.9), 32)
    assert lessons.pruning(replace(run, evaluation=None)).dense_ppl is None


def test_delta_is_spread_past_a_tenth_of_the_directions(run):
    told = lessons.pruning(run)
    assert replace(told, top=4, directions=40).spread is False
    assert replace(told, top=5, directions=40).spread is True


def test_ghost_fit_restricted_and_frontier_come_from_the_run(run):
    ghost = lessons.ghost_fit(run)
    assert ghost.solve == run.run.results["ghost"].solve_seconds
    assert 0 < ghost.fit <= 1 and ghost.heldout is not None
    assert lessons.several_fits(run)
    assert 0 <= lessons.ghost_asymmetry(run) <= 1
    frontier = lessons.frontier(run)
    table = run.evaluation.table
    assert (frontier.fitted, frontier.evaluated, frontier.pruned_ppl) == (2, True, table.row("pruned").ppl)
    assert frontier.closed.ppl == min(table.row(m).ppl for m in ("ghost", "ghost-auto"))
    assert frontier.trained is None  # neither method is trained
    assert lessons.frontier(replace(run, evaluation=None)) == lessons.Frontier(2, False, None, None, None)


def test_sinks_and_the_sink_aware_fits(run):
    told = lessons.sinks(run)
    assert told.gap == "2-3" and told.count >= 1 and 0 < told.share <= 1 and 0 < told.fraction < 1
    assert set(told.norms) == {"sink_x", "sink_y", "other_x", "other_y"}
    assert replace(told, ratio=12.4).times == "12" and replace(told, ratio=2.44).times == "2.4"
    assert replace(told, share=0.51).dominated and not replace(told, share=0.5).dominated
    assert list(lessons.auto_choices(run).columns) == ["gap", "chosen", "reason"]
    table = run.evaluation.table
    assert lessons.sink_aware_perplexities(run) == {m: table.row(m).ppl for m in ("ghost", "ghost-auto")}
    assert not lessons.needs_sink_aware(run)
    assert lessons.needs_sink_aware(replace(run, methods=["none", "ghost"]))
    assert lessons.sink_aware_perplexities(replace(run, methods=["none", "ghost"])) is None
    shown = lessons.sink_table(run.frames["sinks"])
    assert shown["share of ‖Δ‖² %"].tolist() == (100 * run.frames["sinks"].delta_share).round(2).tolist()


def test_fit_summary_gives_the_removed_shares_in_percent_and_the_overfit_rule(run):
    told = lessons.fit_summary(run)
    shares = removed_shares(run.frames["errors"])
    assert told.errors.method.tolist() == shares.method.tolist() == ["ghost", "ghost-auto"]
    assert told.errors["removed (fit) %"].tolist() == (100 * shares.fit).round(1).tolist()
    solves = [round(run.run.results[m].solve_seconds, 3) for m in ("ghost", "ghost-auto")]
    assert told.errors["solve s"].tolist() == solves
    assert (told.tokens, told.width, told.wanted) == (4 * 24, 32, 128)
    assert told.overfits and not replace(told, tokens=128).overfits


def test_a_sink_aware_fit_below_zero_is_named_and_the_paper_fit_never(run):
    told = lessons.fit_summary(run)
    errors = told.errors.copy()
    errors["removed (held-out) %"] = [-114.3, -114.3]  # ghost, ghost-auto both worse than pruning on ‖Δ‖²
    assert replace(told, errors=errors).sinks_below_zero == ["ghost-auto"]  # ghost treats no sink apart
    errors["removed (held-out) %"] = [-1.0, 0.0]
    assert replace(told, errors=errors).sinks_below_zero == []


def _scores(tasks: dict) -> ZeroShot:
    """Zero-shot accuracies: task -> {variant: accuracy (a fraction)}."""
    rows = [{"model": m, "task": t, "metric": "acc", "value": v, "stderr": 0.01}
            for t, values in tasks.items() for m, v in values.items()]
    return ZeroShot(pd.DataFrame(rows), {}, {}, [])


def test_accuracy_cost_quotes_the_average_over_several_tasks():
    one = _scores({"a": {"dense": 0.6, "pruned": 0.3, "ghost": 0.5}})
    cost = lessons.accuracy_cost(one)
    assert (cost.scope, cost.dense, cost.pruned, cost.recovered) == ("a", 60.0, 30.0, {"ghost": 50.0})
    two = lessons.accuracy_cost(_scores({"a": {"dense": 0.6, "pruned": 0.3}, "b": {"dense": 0.4, "pruned": 0.1}}))
    assert (two.scope, two.dense, two.pruned, two.recovered) == ("averaged over your tasks", 50.0, 20.0, {})
    assert lessons.accuracy_cost(_scores({"a": {"dense": 0.6}})) is None
    assert lessons.accuracy_cost(None) is None


def test_the_stream_shows_block_influence_when_measured():
    def report(metrics):
        return SimpleNamespace(layers=pd.DataFrame({"metric": metrics, "layer": range(len(metrics))}))

    assert lessons.stream_metric(report(["angular", "block_influence"])) == "block_influence"
    assert lessons.stream_metric(report(["angular", "cosine"])) == "angular"
    assert lessons.stream_metric(report([])) is None and lessons.stream_metric(None) is None

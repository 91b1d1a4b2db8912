"""The evaluation's typed table: its rows hold what ``Session.evaluate`` gives, and the tables the Compare
page shows (intervals, paired differences, size, frontier) come from it unchanged through the disk copy."""

from __future__ import annotations

import json
import math

import pytest

from ghosted.service import codecs
from ghosted.service import workbench as wb
from ghosted.service.comparison import Difference, VariantRow, VariantTable, span
from tests.tiny import tiny_loaded

FIT = dict(model="tiny", layers=(2, 3), calib_seqs=4, seq_len=24, heldout_seqs=2, methods=("ghost", "ghost-auto"),
           batch_size=2)
TIMES = ("eval_seconds", "latency (ms)")  # wall times: differ between two scorings of the same windows


@pytest.fixture(scope="module")
def evaluated():
    """A tiny run, its evaluation through the app's request, and the session's own table of the same run."""
    lm = tiny_loaded(layers=6)
    fit = wb.FitRequest(**FIT)
    fitted = fit.compute(lm)
    request = wb.EvalRequest(fit=fit, eval_tokens=96, eval_seq_len=24)
    session = request.session(lm)
    return request.compute(lm, fitted), session.evaluate(wb.session_run(fitted))


def test_rows_hold_what_the_session_evaluates(evaluated):
    result, session_table = evaluated
    table = result.table
    assert table.labels == ["dense", "pruned", "ghost", "ghost-auto"]
    for row, expected in zip(table.rows, session_table.rows):
        assert (row.method, row.label, row.role, row.text) == (expected.method, expected.label, expected.role,
                                                               expected.text)
        assert (row.ppl, row.nll, row.tokens, row.parameters) == (expected.ppl, expected.nll, expected.tokens,
                                                                  expected.parameters)
        summary = expected.summary
        assert (row.ppl_low, row.ppl_high, row.kl, row.top1) == (summary["ppl_low"], summary["ppl_high"],
                                                                 summary["kl"], summary["top1"])
        for base in ("none", "ghost"):
            found = row.difference(base)
            if f"d_{base}" not in summary:
                assert found is None
                continue
            assert (found.value, found.low, found.high, found.significant) == tuple(
                summary[f"d_{base}{suffix}"] for suffix in ("", "_low", "_high", "_significant"))
        assert row.details == expected.fit
        assert row.parameters_m == round(expected.parameters / 1e6, 2) and row.latency_ms > 0
    assert table.row("pruned").difference("none") is None  # never from itself


def test_the_frame_is_the_sessions_with_the_size_columns(evaluated):
    result, session_table = evaluated
    frame, expected = result.table.frame(), session_table.frame()
    assert list(frame.columns) == [*expected.columns, "parameters (M)", "memory (MB)", "latency (ms)"]
    kept = [c for c in expected.columns if c not in TIMES]
    assert frame[kept].astype(str).equals(expected[kept].astype(str))


def test_the_disk_copy_gives_the_same_tables(evaluated):
    result, _ = evaluated
    again = codecs.decode_evaluation(json.loads(json.dumps(codecs.encode_evaluation(result)))).table
    assert again == result.table
    assert again.interval_rows().equals(result.table.interval_rows())
    stored_frame = VariantTable.from_records(result.table.frame().to_dict("records"))  # NaN where absent
    assert stored_frame == result.table


def _row(label, method, ppl, parameters=None, differences=(), **fields) -> VariantRow:
    return VariantRow(method=method, label=label, ppl=ppl, nll=math.log(ppl), parameters=parameters,
                      differences=tuple(differences), **fields)


def test_differences_are_cells_with_ns_where_the_interval_holds_zero():
    assert Difference("ghost", -0.5, -1.5, 0.4, False).cell() == "-0.50 [-1.50, 0.40] ns"
    assert Difference("none", -25.0, -28.0, -22.0, True).cell() == "-25.00 [-28.00, -22.00]"
    assert Difference("none", 3.0).cell() == "+3.00"  # too few windows: no interval, no verdict
    assert span(None, 2.0) == "" and span(1.0, math.nan) == "" and span(1.0, 2.5) == "[1.00, 2.50]"


def test_interval_rows_drop_the_ghost_column_when_nothing_is_measured_from_ghost():
    table = VariantTable((_row("dense", "dense", 20.0, ppl_low=19.0, ppl_high=21.0,
                               differences=[Difference("none", -35.0, -40.0, -30.0, True)]),
                          _row("pruned", "none", 55.0)))
    shown = table.interval_rows()
    assert list(shown.columns) == ["label", "ppl", "95 % interval", "Δ vs pruned", "nll"]
    assert shown["95 % interval"].tolist() == ["[19.00, 21.00]", ""]
    assert shown["Δ vs pruned"].tolist() == ["-35.00 [-40.00, -30.00]", ""]
    assert table.ppl_error_bars() == ([1.0, 0.0], [1.0, 0.0])
    assert VariantTable((_row("dense", "dense", 20.0),)).ppl_error_bars() is None


def test_frontier_points_are_parameters_added_over_the_pruned_model():
    table = VariantTable((_row("dense", "dense", 20.0, 1000), _row("pruned", "none", 55.0, 700),
                          _row("ghost", "ghost", 45.0, 1100), _row("prunecomp", "prunecomp", 50.0, 700),
                          _row("streamline-ffn", "streamline-ffn", 44.0, 1300)))
    assert table.has_frontier
    assert [(p.label, p.added, p.fit) for p in table.frontier()] == [
        ("ghost", 400, "closed form"), ("prunecomp", 0, "closed form"), ("streamline-ffn", 600, "trained")]
    assert table.best_on_frontier(trained=False).label == "ghost"
    assert table.best_on_frontier(trained=True).label == "streamline-ffn"
    assert not VariantTable(table.rows[:2]).has_frontier  # nothing fitted


@pytest.mark.parametrize("record, why", [
    ({"method": "dense", "label": "dense", "ppl": "oops", "nll": 1.0}, "not a number"),
    ({"method": "dense", "label": "dense", "nll": 1.0}, "lacks 'ppl'"),
    ({"method": ["x"], "label": "dense", "ppl": 1.0, "nll": 1.0}, "not a number or a string"),
    ({"method": "dense", "label": "dense", "ppl": 1.0, "nll": 1.0, "tokens": 9.5}, "whole number"),
    ({"method": "ghost", "label": "ghost", "ppl": 1.0, "nll": 1.0, "d_none": 0.1, "d_none_significant": "no"},
     "true, false or null"),
])
def test_a_bad_record_is_refused(record, why):
    with pytest.raises(ValueError, match=why):
        VariantTable.from_records([record])

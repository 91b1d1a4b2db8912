"""The Compare page's perplexity table and chart from an evaluation table: intervals, "ns", KL, top-1."""

import math

import pandas as pd
import pytest

from ghosted.service.comparison import VariantTable
from pages import _charts


def _table() -> pd.DataFrame:
    nan = math.nan
    return pd.DataFrame({
        "method": ["dense", "none", "ghost", "ghost-auto"], "label": ["dense", "pruned", "ghost", "ghost-auto"],
        "ppl": [20.0, 55.0, 30.0, 29.5], "nll": [3.0, 4.0, 3.4, 3.38],
        "ppl_low": [19.0, 50.0, 28.0, 28.0], "ppl_high": [21.0, 60.0, 32.0, 31.0],
        "kl": [0.0, 1.2, 0.4, 0.39], "top1": [1.0, 0.5, 0.7, 0.71],
        "d_none": [-35.0, nan, -25.0, -25.5], "d_none_low": [-40.0, nan, -28.0, -29.0],
        "d_none_high": [-30.0, nan, -22.0, -22.0], "d_none_significant": [True, None, True, True],
        "d_ghost": [-10.0, 25.0, nan, -0.5], "d_ghost_low": [-12.0, 20.0, nan, -1.5],
        "d_ghost_high": [-8.0, 30.0, nan, 0.4], "d_ghost_significant": [True, True, None, False]})


def typed(frame: pd.DataFrame) -> VariantTable:
    """The evaluation's typed table from a frame of its records (NaN: not measured)."""
    return VariantTable.from_records(frame.to_dict("records"))


def test_each_perplexity_has_its_interval_and_each_difference_says_if_it_is_significant():
    shown = typed(_table()).interval_rows().set_index("label")
    assert shown.ppl.tolist() == [20.0, 55.0, 30.0, 29.5]
    assert shown.loc["ghost", "95 % interval"] == "[28.00, 32.00]"
    assert shown.loc["ghost", "Δ vs pruned"] == "-25.00 [-28.00, -22.00]"  # significant: no mark
    assert shown.loc["pruned", "Δ vs pruned"] == ""  # not from itself
    assert shown.loc["ghost-auto", "Δ vs ghost"] == "-0.50 [-1.50, 0.40] ns"  # the interval holds zero
    assert shown["KL from dense"].tolist() == pytest.approx([0.0, 1.2, 0.4, 0.39])
    assert shown["top-1 agreement %"].tolist() == pytest.approx([100.0, 50.0, 70.0, 71.0])


def test_a_table_without_intervals_still_shows():
    table = _table()[["method", "label", "ppl", "nll"]]
    shown = typed(table).interval_rows()
    assert list(shown.columns) == ["label", "ppl", "95 % interval", "Δ vs pruned", "nll"]
    assert (shown["95 % interval"] == "").all()
    assert "error_y" not in _charts.perplexity_bars(typed(table)).to_dict()["data"][0]


def test_the_bars_carry_the_interval_as_error_bars():
    table = _table()
    (bars,) = _charts.perplexity_bars(typed(table)).to_dict()["data"]
    assert bars["error_y"]["array"] == pytest.approx((table.ppl_high - table.ppl).tolist())
    assert bars["error_y"]["arrayminus"] == pytest.approx((table.ppl - table.ppl_low).tolist())

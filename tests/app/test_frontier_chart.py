"""The Compare page's frontier chart from an evaluation table: what it plots and how it marks each fit."""

import pandas as pd
import pytest

from ghosted.service.comparison import VariantTable
from pages import _charts


def _table() -> VariantTable:
    frame = pd.DataFrame({"method": ["dense", "none", "ghost", "ghost-lowrank", "prunecomp", "streamline-ffn"],
                         "label": ["dense", "pruned", "ghost", "ghost-lowrank", "prunecomp", "streamline-ffn"],
                         "ppl": [20.0, 55.0, 45.0, 47.0, 50.0, 44.0],
                         "parameters": [1000, 700, 1100, 800, 700, 1300], "nll": [3.0, 4.0, 3.8, 3.85, 3.9, 3.78]})
    return VariantTable.from_records(frame.to_dict("records"))


def test_points_are_parameters_added_over_the_pruned_model():
    points = pd.DataFrame([{"label": p.label, "parameters added": p.added, "ppl": p.ppl, "fit": p.fit}
                           for p in _table().frontier()]).set_index("label")
    assert list(points.index) == ["ghost", "ghost-lowrank", "prunecomp", "streamline-ffn"]  # dense, pruned out
    assert points["parameters added"].tolist() == [400, 100, 0, 600]
    assert points.ppl.tolist() == [45.0, 47.0, 50.0, 44.0]
    assert points.fit.tolist() == ["closed form", "closed form", "closed form", "trained"]


def test_figure_draws_closed_form_and_trained_apart_with_the_pruned_reference():
    closed, trained = _charts.frontier_scatter(_table()).to_dict()["data"]
    assert list(closed["text"]) == ["ghost", "ghost-lowrank", "prunecomp"]
    assert list(closed["x"]) == [400, 100, 0] and list(trained["x"]) == [600]
    assert list(trained["y"]) == pytest.approx([44.0])
    assert closed["marker"]["symbol"] != trained["marker"]["symbol"]
    fig = _charts.frontier_scatter(_table())
    assert fig.layout.shapes[0].y0 == pytest.approx(55.0)  # the pruned model's perplexity

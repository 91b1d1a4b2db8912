"""Run-wide quantities the pages show, computed once in ghosted.recovery.diagnostics: the share of ‖Δ‖² removed over
every gap, and how many directions carry most of Δ's energy."""

import numpy as np
import pandas as pd
import pytest

from ghosted.recovery.diagnostics import directions_holding, removed_shares


def _errors() -> pd.DataFrame:
    """Two gaps, fit and held-out splits; "pruned" rows hold ‖Δ‖², the method rows what each leaves."""
    rows = [("0-1", "pruned", "fit", 10.0), ("3-4", "pruned", "fit", 30.0),
            ("0-1", "pruned", "heldout", 4.0), ("3-4", "pruned", "heldout", 6.0),
            ("0-1", "ghost", "fit", 1.0), ("3-4", "ghost", "fit", 3.0),
            ("0-1", "ghost", "heldout", 2.0), ("3-4", "ghost", "heldout", 3.0),
            ("0-1", "linearpatch-diag", "fit", 5.0), ("3-4", "linearpatch-diag", "fit", 29.0)]
    return pd.DataFrame(rows, columns=["gap", "method", "split", "error"])


def test_removed_share_is_one_minus_the_total_error_over_the_total_delta():
    table = removed_shares(_errors()).set_index("method")
    assert list(table.index) == ["ghost", "linearpatch-diag"]  # fitted methods, in the frame's order
    assert table.loc["ghost", "fit"] == pytest.approx(1 - (1 + 3) / (10 + 30))
    assert table.loc["ghost", "heldout"] == pytest.approx(1 - (2 + 3) / (4 + 6))
    assert table.loc["linearpatch-diag", "fit"] == pytest.approx(1 - 34 / 40)  # not the mean of 0.5 and 0.033
    assert np.isnan(table.loc["linearpatch-diag", "heldout"])  # no held-out rows for it


def test_directions_holding_counts_the_leading_directions_of_the_energy():
    assert directions_holding([3.0, 1.0, 1.0, 1.0], 0.75) == 1  # 9 of 12
    assert directions_holding([3.0, 1.0, 1.0, 1.0], 0.9) == 3  # 11 of 12 after three
    assert directions_holding([1.0, 1.0, 3.0, 1.0], 0.75) == 1  # order of the input does not matter
    values = np.random.default_rng(0).random(50)
    energy = np.cumsum(np.sort(values)[::-1] ** 2) / (values**2).sum()
    assert directions_holding(values) == int(np.argmax(energy >= 0.9)) + 1

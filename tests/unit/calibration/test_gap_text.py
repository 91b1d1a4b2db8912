"""A gap as users read it: its layers in the drop notation (inclusive ranges), the text ``--drop`` takes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ghosted.calibration.collect import Gap, gap_text, gaps_of
from ghosted.models.pruning import parse_layers
from tests.properties import examples

GAPS = st.tuples(st.integers(0, 200), st.integers(1, 40)).map(lambda s: Gap(s[0], s[0] + s[1]))


def test_a_gap_is_written_with_its_last_layer_included():
    assert gap_text(Gap(12, 19)) == "12-18"  # layers 12..18, as --drop 12-18
    assert gap_text(Gap(0, 2)) == "0-1"


def test_a_one_layer_gap_is_its_layer():
    assert gap_text(Gap(12, 13)) == "12"
    assert [gap_text(g) for g in gaps_of([3, 4, 7], "layer")] == ["3", "4", "7"]


def test_anything_with_start_and_end_reads_the_same():
    class Stats:  # BoundaryStats carries start and end without being a Gap
        start, end = 5, 9

    assert gap_text(Stats()) == gap_text(Gap(5, 9)) == "5-8"


@examples("gap_text")
@given(GAPS)
def test_the_text_parses_back_to_the_gaps_layers(gap):
    text = gap_text(gap)
    assert parse_layers(text) == gap.layers
    assert gaps_of(parse_layers(text)) == [gap]
    assert "," not in text  # one contiguous run: a single range or a single layer

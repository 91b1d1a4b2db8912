"""The drop-spec parser, for any input: a sorted list of distinct layer indices, or a ValueError/TypeError
with a message; never an exhausted memory ("0-99999999999" once allocated the whole range)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from ghosted.models.pruning import parse_layers
from tests.properties import assert_refusal, bounded_memory, examples

NUMBER = st.one_of(st.integers(-5, 40), st.integers(0, 10**13), st.just(99999999999)).map(str)
PART = st.one_of(NUMBER, st.tuples(NUMBER, NUMBER).map("-".join), st.text("0123456789-, x.", max_size=8))
SPEC = st.one_of(st.lists(PART, max_size=6).map(",".join), st.text(max_size=40))
REFUSALS = (ValueError, TypeError)


def parsed(spec, n_layers=None):
    """parse_layers under the memory bound: the list, or the refusal it raised."""
    with bounded_memory():
        try:
            return parse_layers(spec, n_layers)
        except REFUSALS as err:
            return err


def assert_layer_list(out, n_layers=None) -> None:
    assert isinstance(out, list) and all(type(i) is int and i >= 0 for i in out), out
    assert out == sorted(set(out))
    if n_layers is not None:
        assert all(i < n_layers for i in out) and len(out) < n_layers


@examples("drop_spec_text")
@given(SPEC)
@example("0-99999999999")
@example("5-99999999999,3")
def test_any_text_is_a_layer_list_or_a_refusal(spec):
    out = parsed(spec)
    if isinstance(out, BaseException):
        assert_refusal(out, REFUSALS)
    else:
        assert_layer_list(out)


@examples("drop_spec_within_a_model")
@given(SPEC, st.integers(1, 200))
@example("0-99999999999", 30)
@example("0-29", 30)
def test_within_a_model_every_index_exists_and_one_layer_is_kept(spec, n_layers):
    out = parsed(spec, n_layers)
    if isinstance(out, BaseException):
        assert_refusal(out, REFUSALS)
    else:
        assert_layer_list(out, n_layers)


JSONISH = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=5))


@examples("drop_spec_lists")
@given(st.one_of(st.lists(JSONISH, max_size=6), JSONISH, st.dictionaries(st.text(max_size=3), JSONISH, max_size=3)))
@example([True, 2])
@example([1.0, 2])
def test_any_api_value_is_a_layer_list_or_a_refusal(value):
    """What the API and a recipe may hand the parser: lists of anything, numbers, null, objects."""
    out = parsed(value, 32)
    if isinstance(out, BaseException):
        assert_refusal(out, REFUSALS)
    else:
        assert_layer_list(out, 32)

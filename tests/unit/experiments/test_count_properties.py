"""Every count and size of a spec is bounded before anything is allocated: for any numbers, checking a spec
either accepts it (and then what it would draw fits the bound) or refuses it with a ValueError/TypeError."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ghosted.experiments import validate
from ghosted.experiments.spec import ExperimentSpec
from tests.properties import assert_refusal, bounded_memory, examples

ANY_COUNT = st.one_of(st.integers(min_value=-2, max_value=10**18), st.floats(allow_nan=True), st.booleans(),
                      st.text(max_size=4), st.none())


@examples("window_counts")
@given(calib_seqs=ANY_COUNT, seq_len=ANY_COUNT, heldout_seqs=ANY_COUNT, eval_tokens=ANY_COUNT,
       batch_size=ANY_COUNT)
def test_window_counts_are_bounded_before_anything_is_drawn(calib_seqs, seq_len, heldout_seqs, eval_tokens,
                                                            batch_size):
    spec = ExperimentSpec().with_options(drop="2-3", methods=["dense", "none", "ghost"])
    flat = spec.flat()
    for name, value in dict(calib_seqs=calib_seqs, seq_len=seq_len, heldout_seqs=heldout_seqs,
                            eval_tokens=eval_tokens, batch_size=batch_size).items():
        setattr(flat, name, value)
    with bounded_memory():
        try:
            validate.check_run(flat)
        except (ValueError, TypeError) as err:
            assert_refusal(err, (ValueError, TypeError))
            return
    assert (flat.calib_seqs + flat.heldout_seqs) * flat.seq_len <= validate.MAX_TOKENS
    assert flat.eval_tokens <= validate.MAX_TOKENS and flat.batch_size <= validate.MAX_BATCH

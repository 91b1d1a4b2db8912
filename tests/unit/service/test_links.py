"""Links that reopen an experiment: every choice survives the round trip, and a link is untrusted input."""

from __future__ import annotations

import pytest

from ghosted.data.sources import TextSource
from ghosted.service import workbench as wb
from ghosted.service.deploy import DEMO, LOCAL
from ghosted.service.links import from_query, to_query

KEY = wb.BUNDLED_KEY


def test_a_run_and_its_evaluation_survive_the_round_trip():
    fit = wb.FitRequest(model=KEY, layers=(20, 21, 22, 23, 24, 25), calib_seqs=16, seq_len=64, heldout_seqs=2,
                        seed=3, methods=("ghost-auto", "linearpatch-diag"), ghost_mode="sequential", batch_size=2,
                        granularity="layer")
    evaluation = wb.EvalRequest(fit=fit, eval_tokens=1024, eval_seq_len=256)
    query = to_query(wb.BUNDLED_MODEL, fit, evaluation)
    assert query["layers"] == "20-25" and query["methods"] == "ghost-auto,linearpatch-diag"
    link = from_query(query, KEY, 30, LOCAL)
    assert link.fit == fit and link.evaluation == evaluation and link.model == wb.BUNDLED_MODEL
    assert link.fit.key() == fit.key() and link.evaluation.key() == evaluation.key()  # the same shared results


def test_a_short_link_takes_the_page_defaults():
    link = from_query({"layers": "3-5"}, KEY, 30, DEMO)
    assert link.fit == wb.FitRequest(model=KEY, layers=(3, 4, 5)) and link.evaluation is None
    assert from_query({"methods": "ghost"}, KEY, 30, LOCAL) is None  # no layers: nothing to reopen
    assert from_query({"layers": ["1", "4"]}, KEY, 30, LOCAL).fit.layers == (4,)  # a repeated one: the last


def test_a_run_on_an_upload_has_no_link():
    upload = TextSource.from_string("mine.txt", "some text")
    assert to_query(wb.BUNDLED_MODEL, wb.FitRequest(layers=(3,), text=upload)) is None


@pytest.mark.parametrize("params, message", [
    ({"layers": "28-35"}, "layers are not valid"),
    ({"layers": "0-29"}, "keep at least one"),
    ({"layers": "3", "n": "-1"}, "whole number"),
    ({"layers": "3", "n": "99999"}, "whole number"),
    ({"layers": "3", "seed": "1e9"}, "whole number"),
    ({"layers": "3", "methods": "ghost,evil"}, "unknown methods"),
    ({"layers": "3", "methods": ","}, "unknown methods"),
    ({"layers": "3", "mode": "parallel"}, "mode must be"),
    ({"layers": "3", "calib": "/etc/passwd"}, "does not read files"),
    ({"layers": "3", "eval": "hf:some/dataset", "tokens": "1024"}, "does not fetch"),
    ({"layers": "3", "tokens": "100000"}, "evaluation tokens"),
    ({"layers": "3", "n": "512"}, "calibration tokens"),
])
def test_a_bad_link_is_refused_naming_the_parameter(params, message):
    with pytest.raises(ValueError, match=message):
        from_query(params, KEY, 30, DEMO)

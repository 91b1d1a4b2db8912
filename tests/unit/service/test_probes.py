"""The token view and the lens as app requests: keys that name every choice (the text by its content),
refusals before anything is queued, and results on a tiny run that agree with the library's own calls."""

from __future__ import annotations

import pandas as pd
import pytest

from ghosted.evaluation.lens import logit_lens, token_losses
from ghosted.service import workbench as wb
from ghosted.service.deploy import CLASSROOM, DEMO, LOCAL, PROBE_CHARS_PER_TOKEN
from ghosted.service.probes import LensRequest, TokenLossRequest, default_passage
from tests.tiny import tiny_loaded

FIT = wb.FitRequest(model="tiny", layers=(2, 3), calib_seqs=4, seq_len=24, heldout_seqs=2, methods=("ghost",),
                   batch_size=2)


def test_keys_change_with_every_choice_and_only_with_them():
    base = TokenLossRequest(fit=FIT, passage="The cat sat on the mat.")
    assert base.key() == TokenLossRequest(fit=FIT, passage="The cat sat on the mat.").key()
    for other in (TokenLossRequest(fit=FIT, passage="The cat sat on the hat."),
                  TokenLossRequest(fit=FIT, passage="The cat sat on the mat.", max_tokens=64),
                  TokenLossRequest(fit=wb.FitRequest(**{**FIT.__dict__, "seed": 1}), passage=base.passage),
                  LensRequest(fit=FIT, prompt=base.passage, max_tokens=base.max_tokens)):
        assert other.key() != base.key(), other
    lens = LensRequest(fit=FIT, prompt="The capital of France is")
    assert lens.key() == LensRequest(fit=FIT, prompt="The capital of France is").key()
    assert lens.key() != LensRequest(fit=FIT, prompt="The capital of Italy is").key()
    assert base.key().startswith("token_losses-") and lens.key().startswith("lens-")


def test_a_text_is_named_by_its_content_never_read_as_a_path(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("one")
    before = TokenLossRequest(fit=FIT, passage=str(path)).key()
    path.write_text("two, and longer")
    assert TokenLossRequest(fit=FIT, passage=str(path)).key() == before
    TokenLossRequest(fit=FIT, passage="x" * 100_000).key()  # a name far too long for a path is still a key


def test_requests_refuse_what_the_deployment_forbids():
    cap = DEMO.max_probe_tokens
    with pytest.raises(ValueError, match=f"at most {cap}"):
        TokenLossRequest(passage="Some text.", max_tokens=cap + 1).check(DEMO)
    with pytest.raises(ValueError, match="characters"):
        TokenLossRequest(passage="word " * (cap * PROBE_CHARS_PER_TOKEN), max_tokens=cap).check(DEMO)
    with pytest.raises(ValueError, match="characters"):
        LensRequest(prompt="a" * (cap * PROBE_CHARS_PER_TOKEN + 1)).check(DEMO)
    with pytest.raises(ValueError, match="Type a text"):
        TokenLossRequest(passage="  \n").check(LOCAL)
    with pytest.raises(ValueError, match="Type a prompt"):
        LensRequest().check(LOCAL)
    with pytest.raises(TypeError, match="string"):
        TokenLossRequest(passage=b"bytes").check(LOCAL)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        LensRequest(prompt="Hi", max_tokens=1).check(LOCAL)
    TokenLossRequest(passage="word " * 100_000, max_tokens=10_000).check(LOCAL)  # a workstation caps nothing
    for cfg in (DEMO, CLASSROOM, LOCAL):  # the page defaults pass everywhere
        TokenLossRequest(passage=default_passage()).check(cfg)
        LensRequest(prompt="The capital of France is").check(cfg)


def test_default_passage_is_whole_sentences_of_text_never_calibrated_on():
    from ghosted.data.sources import resolve_source

    passage = default_passage()
    assert passage.endswith((".", "!", "?")) and 40 < len(passage) <= 400
    assert resolve_source("bundled:wiki").part("evaluation")[0].startswith(passage)


@pytest.fixture(scope="module")
def tiny_run():
    lm = tiny_loaded(layers=6)
    return lm, FIT.compute(lm)


def test_token_view_on_a_tiny_run_is_the_librarys_token_losses(tiny_run):
    lm, fitted = tiny_run
    request = TokenLossRequest(fit=FIT, passage="hello world, hello there", max_tokens=16)
    view = request.compute(lm, fitted)
    assert view.cut == "pruned" and view.recovered == ("ghost",) and view.variants == ("pruned", "ghost")
    direct = token_losses(wb.variants(lm, fitted), lm.tokenizer, request.passage, max_tokens=16).frame
    pd.testing.assert_frame_equal(view.frame, direct)
    assert len(view.frame) == 15
    assert view.hurt(3)["pruned Δ"].tolist() == sorted(direct["pruned Δ"], reverse=True)[:3]
    repaired = (direct["pruned"] - direct["ghost"]).max()
    assert view.repaired("ghost", 2).repaired.iloc[0] == pytest.approx(repaired)
    assert view.mean_change("ghost") == pytest.approx(direct["ghost Δ"].mean())


def test_lens_on_a_tiny_run_marks_the_cut(tiny_run):
    lm, fitted = tiny_run
    view = LensRequest(fit=FIT, prompt="abcdefgh").compute(lm, fitted)
    assert view.variants == ("dense", "pruned", "ghost") and view.removed == (2, 3) and view.depth == 6
    assert len(view.tokens) == 8
    direct = logit_lens(wb.variants(lm, fitted), lm.tokenizer, "abcdefgh")
    pd.testing.assert_frame_equal(view.frame, direct)
    inside = view.frame.boundary.isin(view.removed)
    assert view.frame.loc[inside, "pruned"].isna().all() and view.frame.loc[~inside, "pruned"].notna().all()
    assert view.answer == direct.set_index("boundary").loc[6, "dense"]  # dense's own prediction, bold on the page

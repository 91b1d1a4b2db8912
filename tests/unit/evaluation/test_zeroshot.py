"""Zero-shot accuracy through lm-evaluation-harness on in-memory models, offline with a local task."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ghosted.models.architecture import layers_of
from ghosted.models.pruning import prune

TASKS = Path(__file__).resolve().parents[2] / "data" / "lm_eval_tiny"


def test_missing_lm_eval_says_how_to_install(monkeypatch):
    from ghosted.evaluation.zeroshot import ZeroShotUnavailable, zero_shot

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` fail
    with pytest.raises(ZeroShotUnavailable, match="requirements-eval.txt"):
        zero_shot({}, tokenizer=None)


@pytest.mark.slow
def test_local_task_scores_in_memory_models_and_skips_unloadable(bundled):
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install -r requirements-eval.txt")
    from ghosted.evaluation.zeroshot import ZeroShotConfig, zero_shot

    pruned = prune(bundled.model, "10-20")
    hooks_before = [len(layer._forward_hooks) + len(layer._forward_pre_hooks) for layer in layers_of(bundled.model)]
    lines = []
    cfg = ZeroShotConfig(tasks=["ghosted_tiny", "ghosted_missing"], include_path=str(TASKS),
                         include_defaults=False, bootstrap_iters=0, batch_size=4)
    res = zero_shot({"dense": bundled.model, "pruned": pruned}, bundled.tokenizer, cfg,
                    progress=lambda stage, done, total: lines.append(stage))
    assert list(res.frame.model) == ["dense", "pruned"]
    assert set(res.frame.task) == {"ghosted_tiny"} and set(res.frame.metric) == {"acc,none"}
    dense = res.frame[res.frame.model == "dense"].value.item()
    assert dense == 1.0  # four easy questions (a model scored at random gets them all with p = 1/16)
    assert res.frame[res.frame.model == "pruned"].value.item() in {0.0, 0.25, 0.5, 0.75, 1.0}
    assert list(res.skipped) == ["ghosted_missing"] and "could not load its data" in res.skipped["ghosted_missing"]
    assert any("skipping ghosted_missing" in line for line in lines)
    assert res.mean()["dense"] == pytest.approx(100.0)
    hooks_after = [len(layer._forward_hooks) + len(layer._forward_pre_hooks) for layer in layers_of(bundled.model)]
    assert hooks_before == hooks_after


def test_unknown_task_is_skipped_not_fatal():
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install -r requirements-eval.txt")
    from ghosted.evaluation.zeroshot import ZeroShotConfig, zero_shot

    cfg = ZeroShotConfig(tasks=["no_such_task_anywhere"], include_path=str(TASKS), include_defaults=False)
    res = zero_shot({"m": object()}, tokenizer=None, config=cfg, progress=lambda stage, done, total: None)
    assert res.frame.empty
    assert "unknown task" in res.skipped["no_such_task_anywhere"]

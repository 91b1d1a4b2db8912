"""The quickstart in the README (or docs/QUICKSTART.md) runs as written and does what it says."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import ghosted

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"<!-- quickstart:start -->\s*```python\n(.*?)```\s*<!-- quickstart:end -->", re.S)


def quickstart_code() -> tuple[str, Path]:
    """The fenced python block between the quickstart markers: README.md first, else the docs copy."""
    for path in (ROOT / "README.md", ROOT / "docs" / "QUICKSTART.md"):
        if path.exists():
            match = BLOCK.search(path.read_text())
            if match:
                return match.group(1), path
    raise AssertionError("No quickstart block between <!-- quickstart:start/end --> markers.")


def test_quickstart_block_is_found_and_uses_the_public_api():
    code, _ = quickstart_code()
    used = set(re.findall(r"ghosted\.(\w+)\(", code))
    assert used <= set(dir(ghosted)), used - set(dir(ghosted))
    assert {"load", "calibrate", "fit", "evaluate", "save"} <= used


def test_public_api_has_docstrings_with_examples():
    for name in ("load", "calibrate", "influence", "select", "fit", "prune", "evaluate", "generate",
                 "save", "save_recovered", "load_recovered"):
        doc = getattr(ghosted, name).__doc__
        assert doc and "Example:" in doc and ">>>" in doc, name


def test_api_names_are_functions_even_after_their_modules_are_imported():
    import ghosted.evaluation.perplexity
    import ghosted.models.pruning  # noqa: F401  (binds ghosted.models.pruning, must not touch ghosted.prune)

    for name in ("calibrate", "influence", "prune", "evaluate", "generate"):
        assert isinstance(getattr(ghosted, name), types.FunctionType), name
    assert ghosted.models.pruning.parse_layers("3,7,9-11") == [3, 7, 9, 10, 11]


@pytest.mark.slow
def test_quickstart_runs(bundled, tmp_path, monkeypatch, capsys):
    code, source = quickstart_code()
    real_load = ghosted.load

    def load(source=None, **options):  # the bundled model is already loaded for this session
        return bundled if source is None and not options else real_load(source, **options)

    monkeypatch.setattr(ghosted, "load", load)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, str(source), "exec"), scope)  # noqa: S102 - our own documentation
    printed = capsys.readouterr().out
    assert "PPL" in printed and "bundled:wiki" in printed
    assert len(scope["drop"]) == 7
    ids = scope["calib"].input_ids[:2, :64]  # (2, 64)
    with torch.no_grad():
        # bitwise: a reloaded model runs the same float32 ops on the same weights (same machine, same thread count)
        assert torch.equal(scope["again"].model(input_ids=ids).logits, scope["ghost"](input_ids=ids).logits)
    assert (tmp_path / "smollm2-ghost" / "ghosted_recipe.json").exists()
    ppl = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(none|ghost) ([\d.e+]+)$", printed, re.M)}
    assert ppl["ghost"] < ppl["none"]  # the ghost operator recovers part of what pruning lost


def tiny_windows(n: int = 6, length: int = 16):
    from ghosted.data.windows import TokenWindows
    from tests.tiny import random_ids

    ids = random_ids(n, length, seed=2)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids"})


def test_fit_passes_settings_to_both_configs():
    from tests.tiny import tiny_model

    run = ghosted.fit(tiny_model("llama"), "2-3", tiny_windows(), "ghost", eps=1e-3, batch_size=2)
    assert list(run.results) == ["ghost"]
    assert run.config.eps == 1e-3 and run.config.calibration.batch_size == 2
    with pytest.raises(TypeError, match="bogus"):
        ghosted.fit(tiny_model("llama"), "2-3", tiny_windows(), "ghost", bogus=1)


def test_fit_defaults_to_ghost_auto_and_draws_held_out_windows_as_the_spec_says():
    from tests.tiny import tiny_loaded, tiny_model

    with pytest.raises(ValueError, match="heldout"):  # given windows and nothing held out: no silent split
        ghosted.fit(tiny_model("llama"), "2-3", tiny_windows())
    run = ghosted.fit(tiny_loaded(6), "2-3", calib_seqs=4, seq_len=32, heldout_seqs=2, batch_size=2)
    assert list(run.results) == ["ghost-auto"]
    assert run.protocol["n_windows"] == 4  # the spec's draw: 4 fitted, 2 more kept apart to choose on
    assert set(run.choices().chosen) <= {"paper", "robust", "none"}


def test_fit_and_run_take_the_spec_names():
    from tests.tiny import tiny_loaded, tiny_model

    run = ghosted.fit(tiny_model("llama"), "2-3", tiny_windows(), "ghost", ghost_mode="sequential", fold=False)
    assert run.config.ghost_mode == "sequential" and run.config.fold is False
    report, _ = ghosted.run(model=tiny_loaded(6), drop="2-3", methods=["none"], ghost_mode="sequential",
                            calib_seqs=2, seq_len=32, heldout_seqs=0, eval_tokens=64, eval_seq_len=32, cache=False)
    assert report["spec"]["recovery"]["ghost_mode"] == "sequential"
    with pytest.raises(TypeError, match="source"):
        ghosted.run(model=3)


def test_influence_without_heldout_skips_heldout_criteria():
    from tests.tiny import tiny_model

    report = ghosted.influence(tiny_model("llama"), tiny_windows(), n_values=[2])
    assert "recoverability" in report.metrics and "recoverability_heldout" not in report.metrics
    layers, _ = ghosted.select(report, "recoverability", 2)
    assert len(layers) == 2 and layers[1] == layers[0] + 1


def test_load_brings_back_a_saved_recovered_folder(tmp_path):
    from tests.tiny import tiny_model

    model = tiny_model("llama")
    calib = tiny_windows()
    ghost = ghosted.fit(model, "2-3", calib, "ghost").results["ghost"].model
    ghosted.save(ghost, tmp_path / "g")
    again = ghosted.load(str(tmp_path / "g"), device="cpu")
    assert again.extra["operators"] == 1
    assert ghosted.evaluate(again.model, calib).ppl == pytest.approx(ghosted.evaluate(ghost, calib).ppl, rel=1e-6)
    assert ghosted.prune(model, "2-3").config.num_hidden_layers == 4

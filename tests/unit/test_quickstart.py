"""The quickstart in the README (or docs/QUICKSTART.md) runs as written and does what it says."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import ghosted

ROOT = Path(__file__).resolve().parents[2]
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
        function = getattr(ghosted, name)
        doc = (function.__call__ if isinstance(function, types.ModuleType) else function).__doc__
        assert doc and "Example:" in doc and ">>>" in doc, name


def test_submodules_named_like_api_functions_stay_modules():
    from ghosted import prune  # the module, as code importing it expects

    assert prune.parse_layers("3,7,9-11") == [3, 7, 9, 10, 11]
    assert callable(ghosted.prune) and ghosted.prune is prune
    import ghosted.evaluate as evaluate_module

    assert hasattr(evaluate_module, "perplexity") and callable(evaluate_module)


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
        assert torch.equal(scope["again"].model(input_ids=ids).logits, scope["ghost"](input_ids=ids).logits)
    assert (tmp_path / "smollm2-ghost" / "ghosted_recipe.json").exists()
    evaluate = scope["ghosted"].evaluate
    none = evaluate(scope["run"].results["none"].model, bundled, tokens=512, seq_len=256).ppl
    ghost = evaluate(scope["ghost"], bundled, tokens=512, seq_len=256).ppl
    assert ghost < none  # the ghost operator recovers part of what pruning lost

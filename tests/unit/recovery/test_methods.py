"""The method registry (ghosted.recovery.methods) and the commands that print it and the selection criteria."""

from pathlib import Path

import pytest

from ghosted.recovery import methods, fitting as recover
from ghosted.cli import build_parser, main
from ghosted.selection.criteria import ALIASES, CRITERIA

ROOT = Path(__file__).resolve().parents[3]
KINDS = {methods.STREAM, methods.BRANCH, methods.WEIGHTS, methods.TRAINED, methods.LAYER, methods.NONE}


def readme_table() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(methods.README_START) == 1 and text.count(methods.README_END) == 1, "README method markers"
    return text.split(methods.README_START, 1)[1].split(methods.README_END, 1)[0].strip()


def test_readme_method_table_is_the_registry():
    assert readme_table() == methods.markdown_table(), (
        "README.md's method table differs from ghosted/recovery/methods.py: run "
        "`python -c 'from ghosted.recovery.methods import update_readme; update_readme()'`")


def test_recover_methods_are_the_registry_and_keep_their_kinds():
    assert recover.METHODS == tuple(n for n in methods.REGISTRY if n != "dense")
    assert recover.METHODS[0] == "none"
    # the dispatch in recover() branches on these groups: the registry's kinds must give the same ones
    assert set(recover.BRANCH_METHODS) == {"replaceme-ls", "replaceme-ls-robust", "replaceme-cos"}
    frontier = {"prunecomp", "streamline-ffn", "streamline-layer"}
    assert set(methods.names_of(methods.WEIGHTS, methods.TRAINED)) == frontier
    assert {"ghost", "ghost-robust", "ghost-auto", "ghost-lowrank"} <= set(methods.names_of(methods.STREAM))
    assert not set(methods.names_of(methods.STREAM)) & set(recover.BRANCH_METHODS)


def test_every_entry_is_complete():
    for name, m in methods.REGISTRY.items():
        assert m.name == name and m.summary and m.description and m.statistics
        assert m.kind in KINDS, name
        assert m.heldout in ("required", "used if given", "no"), name
        assert "\n" not in m.summary + m.description, f"{name}: the table needs one line"
        if m.paper is not None:
            assert m.paper.arxiv == "" or len(m.paper.arxiv.split(".")) == 2, name
    assert methods.REGISTRY[methods.DEFAULT].heldout == "required"  # ghost-auto chooses on held-out windows


def test_check_methods_uses_the_registry_names():
    recover.check_methods(list(methods.REGISTRY), [3, 4])  # every registered name is accepted
    with pytest.raises(ValueError, match="ghost-auto"):  # the message lists the registry's names
        recover.check_methods(["ghoast"], [3, 4])


def test_update_readme_writes_the_table_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{methods.README_START}\nold table\n{methods.README_END}\nafter\n", encoding="utf-8")
    assert methods.update_readme(readme) is True
    assert readme.read_text(encoding="utf-8") == (
        f"intro\n{methods.README_START}\n{methods.markdown_table()}\n{methods.README_END}\nafter\n")
    assert methods.update_readme(readme) is False  # already up to date: unchanged


def test_help_texts_come_from_the_registry():
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    flat = " ".join(run_help.split()).replace("- ", "-")  # argparse may wrap a line at a name's hyphen
    for name in methods.REGISTRY:
        assert name in flat
    app_help = methods.help_text(["ghost", "prunecomp"])
    assert app_help == (f"ghost: {methods.REGISTRY['ghost'].summary}. "
                        f"prunecomp: {methods.REGISTRY['prunecomp'].summary}.")


def test_methods_command_prints_every_method(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for m in methods.REGISTRY.values():
        assert f"\n{m.name}" in f"\n{out}" and m.summary in out
    assert "arXiv 2505.02819" in out  # ReplaceMe's paper
    assert main(["methods", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == methods.markdown_table()


def test_criteria_command_prints_every_criterion_and_alias(capsys):
    assert main(["criteria"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name, c in CRITERIA.items():
        assert any(line.startswith(name) for line in lines), name
        assert c.label in out and c.origin in out
    for alias, name in ALIASES.items():
        header = next(line for line in lines if line.startswith(name + " ") or line == name)
        assert alias in header, (alias, header)
    assert "recoverability_token" in out  # the criterion the Influence page once missed


def test_every_fitted_entry_names_a_fit_that_resolves():
    for name in recover.METHODS:
        entry = methods.REGISTRY[name]
        assert callable(methods.fit_function(entry)), name
        assert entry.scope in ("gap", "run"), name
    with pytest.raises(ValueError, match="not fitted"):
        methods.fit_function(methods.REGISTRY["dense"])
    # the groups recover() once spelled out by hand, now read from the entries
    assert set(methods.names_where(uses_sinks=True)) == {"ghost-robust", "ghost-auto", "replaceme-ls-robust",
                                                         "ghost-lowrank-robust"}
    assert set(methods.names_where(sequential=True)) == {"none", "ghost", "ghost-robust", "ghost-auto", "layer-ls"}


def _fit_half_step(stats, heldout, cfg):
    """A method for the test below: W = I + M/2, half the paper's correction."""
    import torch

    from ghosted.operators.assembly import GapFit
    from ghosted.recovery.solvers import ghost_operator

    w = ghost_operator(stats, eps=cfg.eps)
    eye = torch.eye(w.shape[0], dtype=w.dtype)
    return GapFit(stream=eye + (w - eye) / 2), {"step": 0.5}


def test_a_new_method_is_one_entry_and_one_fit_function(monkeypatch):
    import types

    import torch

    from tests.tiny import random_ids, tiny_model

    entry = methods.Method("ghost-half", "half the paper's correction", "half the paper's correction", None,
                           methods.STREAM, "per --granularity", methods.GRAM, "no", fit=_fit_half_step)
    monkeypatch.setitem(methods.REGISTRY, entry.name, entry)
    ids = random_ids(6, 24)
    calib = types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})
    run = recover.recover(tiny_model("llama", layers=6), "2-3", ["ghost", "ghost-half"], calib)
    (gap,) = run.results["ghost"].operators
    eye = torch.eye(32, dtype=torch.float64)
    half = run.results["ghost-half"]
    torch.testing.assert_close(half.operators[gap] - eye, (run.results["ghost"].operators[gap] - eye) / 2)
    assert half.kind == "stream" and half.choices == [{"method": "ghost-half", "gap": "2-3", "step": 0.5}]
    assert torch.isfinite(half.model(random_ids()).logits).all()

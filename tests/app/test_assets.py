"""The app's static assets: the Learn texts fill every placeholder, the prompts and the icon are used.

The Learn page's texts are ``str.format`` templates in ``assets/learn/``. Reading ``pages/learn.py``
finds every ``say(step, part, ...)`` call, so a placeholder the page forgets to fill, or a part it
names that does not exist, fails here even on a branch no run of the page takes.
"""

from __future__ import annotations

import ast
import string
from pathlib import Path

import pytest
import streamlit as st

from pages import _assets
from tests.app.conftest import ROOT, no_exception, open_page

LEARN_PAGE = ROOT / "pages" / "learn.py"


def fields(template: str) -> set[str]:
    """The placeholder names of a ``str.format`` template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def constants(node: ast.expr) -> list[str]:
    """The string constants an argument can be: a constant, or either branch of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return constants(node.body) + constants(node.orelse)
    raise AssertionError(f"pages/learn.py line {node.lineno}: name the Learn part with a string constant")


def say_calls() -> list[tuple[str, str, set[str], bool, int]]:
    """(step, part, keywords given, whether ``**`` adds more, line) for every ``say(...)`` in learn.py."""
    calls = []
    for node in ast.walk(ast.parse(LEARN_PAGE.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "say":
            step, part = node.args
            given = {k.arg for k in node.keywords if k.arg}
            spread = any(k.arg is None for k in node.keywords)
            calls += [(s, p, given, spread, node.lineno) for s in constants(step) for p in constants(part)]
    return calls


def spread_keys() -> set[str]:
    """The keys of the dict ``best_of`` returns in learn.py (the one helper whose result is ``**``-passed)."""
    tree = ast.parse(LEARN_PAGE.read_text())
    (function,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "best_of"]
    (returned,) = [n.value for n in ast.walk(function) if isinstance(n, ast.Return)]
    return {key.value for key in returned.keys}


def test_every_template_is_named_fields_only():
    for path in sorted(_assets.LEARN.glob("*.md")):
        for part, template in _assets.learn_parts(path.stem).items():
            parsed = list(string.Formatter().parse(template))  # raises on a lone brace
            assert all(name != "" and not (name or "x")[0].isdigit() for _, name, _, _ in parsed), (path, part)


def test_the_page_fills_every_placeholder_of_every_part_it_names():
    spread_names = spread_keys()  # the page module runs on import: read best_of's keys from its source
    calls = say_calls()
    assert len(calls) > 20
    for step, part, given, spread, line in calls:
        parts = _assets.learn_parts(step)
        assert part in parts, f"learn.py:{line} names {step}/{part}, not in assets/learn/{step}.md"
        supplied = given | (spread_names if spread else set())
        assert fields(parts[part]) == supplied, f"learn.py:{line} {step}/{part}"


def test_every_part_of_the_learn_texts_is_shown_somewhere():
    named = {(step, part) for step, part, *_ in say_calls()}
    for path in sorted(_assets.LEARN.glob("*.md")):
        unused = set(_assets.learn_parts(path.stem)) - {part for step, part in named if step == path.stem}
        assert not unused, f"assets/learn/{path.name}: parts no page shows: {sorted(unused)}"


def test_a_missing_number_raises_instead_of_showing_its_placeholder():
    assert "{dense:.2f}" in _assets.learn_parts("pruning")["perplexity"]
    with pytest.raises(KeyError, match="pruned"):
        _assets.learn("pruning", "perplexity", dense=20.0)
    with pytest.raises(KeyError, match="no part 'nothing'"):
        _assets.learn("pruning", "nothing")
    text = _assets.learn("pruning", "perplexity", dense=20.0, pruned=55.123)
    assert "**20.00** (dense) to **55.12** (pruned)" in text and "{" not in text


def test_parts_are_cut_at_their_markers_and_paragraph_lines_joined(tmp_path, monkeypatch):
    (tmp_path / "demo.md").write_text("<!-- a comment -->\n<!-- part: one -->\nfirst line\nsecond {x}\n\n"
                                      "next paragraph\n<!-- part: two -->\nonly {y:.1f}\n")
    monkeypatch.setattr(_assets, "LEARN", tmp_path)
    assert _assets.learn_parts("demo") == {"one": "first line second {x}\n\nnext paragraph", "two": "only {y:.1f}"}
    assert _assets.learn("demo", "two", y=0.25) == "only 0.2"
    (tmp_path / "twice.md").write_text("<!-- part: one -->\na\n<!-- part: one -->\nb\n")
    with pytest.raises(ValueError, match="twice"):
        _assets.learn_parts("twice")


def test_prompts_file_holds_the_default_prompts():
    assert _assets.PROMPTS == ROOT / "assets" / "prompts.txt"
    lines = [line for line in _assets.PROMPTS.read_text().splitlines() if line.strip()]
    assert _assets.prompts() == lines and len(lines) >= 2


def test_the_icon_is_a_png_and_app_py_sets_it_as_the_page_icon(monkeypatch):
    assert _assets.ICON.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    seen = []
    original = st.set_page_config

    def recording(*args, **kwargs):
        seen.append(kwargs.get("page_icon"))
        return original(*args, **kwargs)

    monkeypatch.setattr(st, "set_page_config", recording)
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import TIMEOUT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    no_exception(at)
    assert seen and Path(seen[-1]) == _assets.ICON


@pytest.mark.parametrize("page", ["compare", "export", "learn"])
def test_require_run_without_a_run_says_so_links_calibration_and_stops(app, page):
    open_page(app, page)
    no_exception(app)
    assert any("calibrate and fit the recovery methods first" in i.value for i in app.info)
    links = [link.proto.page for link in app.get("page_link")]
    assert "recover" in links
    assert not ({"evaluate_run", "zeroshot_run", "save_submit"} & {b.key for b in app.button})  # it stopped
    if page == "learn":
        assert [h.value for h in app.header] == ["1 · The residual stream"]  # step 1 needs no run


def test_a_run_of_another_model_counts_as_none(app):
    from ghosted.service.workbench import FitRequest
    from pages._ui import RUN

    app.session_state[RUN] = FitRequest(model="another|model", layers=(1,))
    open_page(app, "compare")
    no_exception(app)
    assert any("calibrate and fit the recovery methods first" in i.value for i in app.info)

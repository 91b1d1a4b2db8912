"""ghosted.core.docblocks: generated blocks of Markdown between two markers."""

from __future__ import annotations

import pytest

from ghosted.core.docblocks import markers, read_block, replace_block, write_block

START, END = markers("demo")


def test_replace_touches_only_the_body_between_the_markers():
    text = f"before\n{START}\nold\n{END}\nafter\n"
    new = replace_block(text, START, END, "new body")
    assert new == f"before\n{START}\nnew body\n{END}\nafter\n"
    assert read_block(new, START, END) == "new body"
    assert replace_block(new, START, END, "new body") == new  # idempotent


def test_missing_markers_are_an_error_unless_appending():
    with pytest.raises(ValueError, match="no <!-- demo -->"):
        replace_block("no block here\n", START, END, "x")
    assert replace_block("doc\n", START, END, "x", append=True) == f"doc\n\n{START}\nx\n{END}\n"
    assert read_block("doc\n", START, END) is None


@pytest.mark.parametrize("text", [f"{START}\na\n{END}\n{START}\nb\n{END}\n", f"{START}\na\n", f"{END}\n{START}\n"])
def test_a_doubled_lone_or_reversed_marker_is_refused(text):
    with pytest.raises(ValueError):
        read_block(text, START, END)


def test_write_block_writes_only_when_the_body_changes(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"{START}\nold\n{END}\n", encoding="utf-8")
    assert write_block(doc, START, END, "new") is True
    stamp = doc.stat().st_mtime_ns
    assert write_block(doc, START, END, "new") is False and doc.stat().st_mtime_ns == stamp

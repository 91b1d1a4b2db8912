"""Every number the README and docs/*.md quote is generated from a committed results file.

``bench.docs`` lists each generated block with the file it is rendered from; these tests render every
block again and fail when a document's text and its file disagree (rerun ``python -m bench.docs``
after changing a file, and rerun the measurement to change a file), when a results file feeds no
block, or when a document holds a block nobody generates.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import docs
from ghosted.core.docblocks import read_block

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPENING = re.compile(r"^<!-- ([\w:-]+) -->$", re.M)  # a block's opening marker, on a line of its own
NOT_GENERATED = {"quickstart"}  # marked code that a test runs instead (tests/unit/project/test_quickstart.py)


@pytest.mark.parametrize("block", docs.blocks(), ids=lambda b: f"{b.doc.name}:{b.name}")
def test_generated_block_is_what_its_results_file_renders(block):
    text = read_block(block.doc.read_text(encoding="utf-8"), *block.pair)
    assert text is not None, f"{block.doc.name} lost the markers of block {block.name}"
    assert text.strip() == block.render().strip(), (
        f"{block.doc.name}'s block {block.name} differs from {block.source}: run `python -m bench.docs` "
        "(and never edit a generated block by hand)")


def test_every_results_file_feeds_a_block():
    used = {b.source for b in docs.blocks()}
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "results").rglob("*.json")}
    assert files <= used, f"results files no block is rendered from: {sorted(files - used)}"


def test_every_marked_block_in_the_documents_is_generated():
    known = {(b.doc, b.name) for b in docs.blocks()}
    for doc in DOCUMENTS:
        for name in OPENING.findall(doc.read_text(encoding="utf-8")):
            if name.split(":")[0] in NOT_GENERATED or name in ("methods:start", "methods:end"):
                continue
            assert (doc, name) in known, f"{doc.name} has a block <!-- {name} --> that bench.docs does not generate"


def test_check_reports_a_hand_edited_block(tmp_path, monkeypatch):
    """`python -m bench.docs --check` fails on a document whose generated block was edited by hand."""
    block = next(b for b in docs.blocks() if b.name == "grid:readme")
    copy = tmp_path / block.doc.name
    copy.write_text(block.doc.read_text(encoding="utf-8").replace(block.render().strip(), "typed by hand"),
                    encoding="utf-8")
    monkeypatch.setattr(docs, "blocks", lambda: [type(block)(copy, block.name, block.source, block.render)])
    assert docs.main(["--check"]) == 1
    assert docs.main([]) == 0 and docs.main(["--check"]) == 0  # rewritten from its file: agrees again


def test_a_grid_written_before_the_drop_notation_is_read_in_it():
    """Committed grids name ghost-auto's gaps `start-end` with `end` excluded; read, they are in the drop
    notation, and a grid already in it is kept as it is."""
    from bench.grid_results import drop_notation

    assert drop_notation("12-19: paper", "12-18") == "12-18: paper"
    assert drop_notation("12-13: paper, 13-14: none, 28-29: robust", "12-13,28") == "12: paper, 13: none, 28: robust"
    assert drop_notation("12-19: paper 3.9239, robust 3.9217", "12-18", "; ") == "12-18: paper 3.9239, robust 3.9217"
    for new in ("12-18: paper", "12: paper, 13: none", "12-13: robust"):  # already in the drop notation
        assert drop_notation(new, "12-18" if new.startswith("12-18") else "12-13") == new
    assert drop_notation(None, "12-18") is None

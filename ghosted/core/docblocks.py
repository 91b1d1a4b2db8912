"""Generated blocks of Markdown: the text between two HTML-comment markers that a script writes.

Every number the README and docs/*.md quote lives in such a block: a script renders it from a committed
results file (``docs/results/``) and writes it here, and a test renders it again and fails when the
Markdown and the file disagree. The markers stay in the file, so a block can be rewritten any number
of times; nothing outside them is touched.

Markers are ``<!-- NAME -->`` ... ``<!-- /NAME -->`` (``markers(NAME)``); a caller with older markers
(the method table's ``<!-- methods:start -->`` ... ``<!-- methods:end -->``) passes its own pair.
"""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    """The opening and closing marker of block ``name``."""
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def _span(text: str, start: str, end: str) -> tuple[int, int] | None:
    """Where the block's body begins and ends in ``text``, or None without the markers; a marker
    found twice, or an end before its start, is an error (which copy would be the block?)."""
    if start not in text and end not in text:
        return None
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected each of {start} and {end} once, found {text.count(start)} and "
                         f"{text.count(end)}")
    begin, stop = text.index(start) + len(start), text.index(end)
    if stop < begin:
        raise ValueError(f"{end} comes before {start}")
    return begin, stop


def read_block(text: str, start: str, end: str) -> str | None:
    """The body between the markers (without the surrounding newlines), or None without them."""
    span = _span(text, start, end)
    return None if span is None else text[span[0]:span[1]].strip("\n")


def replace_block(text: str, start: str, end: str, body: str, append: bool = False) -> str:
    """``text`` with the body between the markers replaced by ``body``.

    Without the markers: the block is added at the end when ``append``, otherwise it is an error
    (a document that lost its markers must not silently lose its numbers)."""
    span = _span(text, start, end)
    body = body.strip("\n")
    block = f"\n{body}\n" if body else "\n"  # an empty block keeps its markers on consecutive lines
    if span is None:
        if not append:
            raise ValueError(f"no {start} ... {end} block to replace")
        return f"{text.rstrip(chr(10))}\n\n{start}{block}{end}\n"
    return text[:span[0]] + block + text[span[1]:]


def write_block(path: str | Path, start: str, end: str, body: str, append: bool = False) -> bool:
    """Rewrite the block in the file at ``path``; True when the file changed (it is written only then)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = replace_block(text, start, end, body, append=append)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text

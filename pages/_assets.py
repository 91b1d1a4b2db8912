"""The app's static assets, from the top-level ``assets/`` folder: Learn texts, default prompts, the icon.

The Learn page's explanations are Markdown files, one per step, cut into named parts by a line
``<!-- part: name -->``. Each part (its wrapped lines joined, as Markdown reads them) is a
``str.format`` template the page fills with the user's own numbers, so a placeholder the page does
not fill raises (KeyError) instead of showing "{x}".
"""

from __future__ import annotations

import re
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"
ICON = ASSETS / "icon.png"  # the page icon (browser tab)
PROMPTS = ASSETS / "prompts.txt"  # default generation prompts, one per line
LEARN = ASSETS / "learn"  # the Learn page's explanations, one Markdown file per step
PART = re.compile(r"^<!-- part: ([a-z_]+) -->[ \t]*$", re.MULTILINE)


def prompts() -> list[str]:
    """The default generation prompts (non-empty lines of assets/prompts.txt)."""
    return [line.strip() for line in PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]


def learn_parts(step: str) -> dict[str, str]:
    """The named parts of ``assets/learn/<step>.md``: part name -> its template (Markdown)."""
    pieces = PART.split(LEARN.joinpath(f"{step}.md").read_text(encoding="utf-8"))
    names, bodies = pieces[1::2], pieces[2::2]  # pieces[0]: what precedes the first part (a comment)
    if len(set(names)) != len(names):
        raise ValueError(f"assets/learn/{step}.md names a part twice: {names}")
    return {name: _unwrap(body.strip()) for name, body in zip(names, bodies)}


def _unwrap(markdown: str) -> str:
    """Join the wrapped lines of each paragraph (Markdown reads a single line break as a space)."""
    return re.sub(r"(?<!\n)\n(?!\n)", " ", markdown)


def learn(step: str, part: str, **numbers) -> str:
    """One part of a Learn step, filled with ``numbers``; KeyError if the part or a placeholder is missing."""
    parts = learn_parts(step)
    if part not in parts:
        raise KeyError(f"assets/learn/{step}.md has no part {part!r}; it has {sorted(parts)}")
    return parts[part].format(**numbers)

"""Every ``python -m ghosted ...`` example in README.md and docs/*.md runs, through ``--dry-run``.

The examples are read from the Markdown files themselves (fenced code blocks, and inline code spans
that start with the command), so a new example is covered as soon as it is written. ``--dry-run``
validates every setting and prints the plan from the model's config alone, so the Llama-3.1-8B
commands (a hub id, offline here) are checked as far as they can be without the model.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ghosted.cli import main

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIX = "python -m ghosted"
OUTPUT_FLAGS = ("--out", "--out-dir")  # pointed into a temporary folder (a dry run writes nothing anyway)
TEXT_FLAGS = ("--calib", "--eval")  # a file of the reader's own is written there first


def fenced_lines(text: str) -> list[str]:
    """Lines of the fenced code blocks, continuation backslashes joined, comments dropped."""
    lines, inside = [], False
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            inside = not inside
            continue
        if inside:
            lines.append(raw)
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [line.split(" #")[0].strip() for line in joined.splitlines()]


def inline_commands(text: str) -> list[str]:
    """Inline code spans that are whole commands, with options (prose also names a bare subcommand)."""
    spans = [span.strip() for span in re.findall(r"`([^`\n]+)`", text)]
    return [span for span in spans if span.startswith(PREFIX) and " --" in span]


def examples() -> list[tuple[str, str]]:
    """(file name, command) for every example, each command once."""
    found = {}
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for command in [*fenced_lines(text), *inline_commands(text)]:
            if command.startswith(PREFIX + " ") and "..." not in command:  # the bare name is no example
                found.setdefault(command, path.name)
    return [(name, command) for command, name in found.items()]


EXAMPLES = examples()


def test_the_docs_hold_the_known_examples():
    commands = [c for _, c in EXAMPLES]
    assert len(EXAMPLES) >= 10, commands
    assert any("--select streamline" in c for c in commands)
    assert any(c.startswith(f"{PREFIX} export") for c in commands)
    assert any("meta-llama/Llama-3.1-8B" in c for c in commands)


def user_file(value: str) -> bool:
    """A text named by an example that is the reader's own file (notes.md), not a bundled or hub text."""
    from ghosted.data.sources import HUB_SHORTCUTS

    return not value.startswith(("bundled:", "hf:")) and value not in HUB_SHORTCUTS


def argv_of(command: str, tmp_path: Path) -> list[str]:
    """The command's arguments, with --dry-run added, output paths moved under ``tmp_path``, and a
    small text written there for every file of the reader's own that the example names."""
    argv = shlex.split(command)[3:]
    for i, arg in enumerate(argv[:-1]):
        if arg in OUTPUT_FLAGS:
            argv[i + 1] = str(tmp_path / argv[i + 1].strip("/"))
        if arg in TEXT_FLAGS and user_file(argv[i + 1]):
            text = tmp_path / "texts" / Path(argv[i + 1]).name
            text.parent.mkdir(exist_ok=True)
            text.write_text("A first document of the reader's own.\n\nA second one.\n")
            argv[i + 1] = str(text)
    return argv if "--help" in argv or not argv else [*argv, "--dry-run"]


@pytest.mark.parametrize("source, command", EXAMPLES, ids=[f"{n}:{c[len(PREFIX):][:60]}" for n, c in EXAMPLES])
def test_example_runs(source, command, tmp_path, capsys):
    argv = argv_of(command, tmp_path)
    before = sorted(tmp_path.rglob("*"))
    if "--help" in argv:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        return
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith("dry run:") and ("model:" in out or argv[0] == "cache")  # cache has no model
    assert sorted(tmp_path.rglob("*")) == before  # a dry run writes nothing

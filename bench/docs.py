"""Write every generated block of README.md and docs/*.md from the committed results files.

Each number the documents quote sits between two markers (``ghosted.core.docblocks``) and is rendered here
from a file under ``docs/results/`` (or, for the method table, from the registry). ``python -m bench.docs``
rewrites every block; ``python -m bench.docs --check`` only lists the blocks that differ (exit code 1).
tests/unit/project/test_docs_numbers.py renders them again and fails when a document and its file disagree.

Where each block comes from:

- ``methods`` (README): the method registry, ``ghosted.recovery.methods.markdown_table``;
- ``bench:NAME`` (docs/BENCHMARKS.md), ``curve:NAME`` (docs/REPRODUCTION.md): ``docs/results/bench/NAME.json``,
  ``docs/results/curve/NAME.json``, written by ``python -m bench.NAME``;
- ``grid:table`` and the ``grid:*`` sentences (README, docs/REPRODUCTION.md): ``docs/results/grid.json``,
  written by ``python -m bench.grid``, read and rendered by ``bench.grid_results``;
- ``run:*`` (README, docs/REPRODUCTION.md): a ``python -m ghosted run --out`` results file in
  ``docs/results/runs/``, rendered by ``bench.run_tables``;
- ``frontier:table`` (docs/REPRODUCTION.md): ``docs/results/frontier.json``, written by ``python -m bench.frontier``;
- ``load:classroom`` (docs/DEPLOY.md): ``bench/results/load.json``, written by ``python -m bench.load``;
- ``deploy:budgets`` (docs/DEPLOY.md): the deployment presets and the cost model (``bench.cost.budgets``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench._common import RESULTS, ROOT, SECTION_DOCS, render_section

from ghosted.core.docblocks import markers, read_block, write_block

README = ROOT / "README.md"
REPRODUCTION = ROOT / "docs" / "REPRODUCTION.md"


@dataclass(frozen=True)
class Block:
    """One generated block: the document, its markers, where its numbers come from, and how to render it."""

    doc: Path
    name: str
    source: str  # the results file (relative to the repository) or the code it is rendered from
    render: Callable[[], str]
    start: str = ""  # markers; empty: markers(name)
    end: str = ""

    @property
    def pair(self) -> tuple[str, str]:
        return (self.start, self.end) if self.start else markers(self.name)


def _section(kind: str, path: Path) -> Block:
    return Block(SECTION_DOCS[kind], f"{kind}:{path.stem}", str(path.relative_to(ROOT)),
                 lambda: render_section(json.loads(path.read_text(encoding="utf-8"))))


def _grid(name: str, doc: Path, fact: str) -> Block:
    def render() -> str:
        from bench import grid_facts, grid_results

        result = grid_results.read_results()
        return grid_results.block(result) if fact == "block" else getattr(grid_facts, fact)(result.frame)

    return Block(doc, name, "docs/results/grid.json", render)


def _run(name: str, doc: Path, file: str, table: str) -> Block:
    def render() -> str:
        from bench import run_tables

        return getattr(run_tables, table)(json.loads((RESULTS / "runs" / file).read_text(encoding="utf-8")))

    return Block(doc, name, f"docs/results/runs/{file}", render)


def _methods() -> Block:
    from ghosted.recovery import methods

    return Block(README, "methods", "ghosted/recovery/methods.py (the registry)", methods.markdown_table,
                 methods.README_START, methods.README_END)


def _frontier() -> Block:
    """docs/REPRODUCTION.md's closed-form frontier cells, from docs/results/frontier.json."""
    def render() -> str:
        from bench import frontier

        return frontier.block()

    return Block(REPRODUCTION, "frontier:table", "docs/results/frontier.json", render)


def _classroom_load() -> Block:
    """docs/DEPLOY.md's sentence on a class at once, from bench/results/load.json (empty until measured)."""
    def render() -> str:
        from bench import load_report as load

        results = load.load_results()
        return load.deploy_sentence(results) if results["cells"] else ""

    return Block(ROOT / "docs" / "DEPLOY.md", "load:classroom", "bench/results/load.json", render)


def _scale_layerwise() -> Block:
    """docs/SCALE.md's layer-wise plan, from the figures bench/layerwise.py measured."""
    def render() -> str:
        from bench import layerwise

        return layerwise.scale_block(json.loads(layerwise.NUMBERS.read_text(encoding="utf-8")))

    return Block(ROOT / "docs" / "SCALE.md", "scale:layerwise", "docs/results/layerwise.json", render)


def _budgets() -> Block:
    """docs/DEPLOY.md's budgets per job and per visitor, from the deployment presets and the cost model."""
    from bench import cost

    return Block(ROOT / "docs" / "DEPLOY.md", "deploy:budgets", "ghosted/service/deploy.py and ghosted/service/cost.py",
                 cost.budgets)


def blocks() -> list[Block]:
    """Every generated block of the documents, in document order."""
    found = [_methods(),
             _run("run:sinks", README, "sinks.json", "sinks_table"),
             _grid("grid:readme", README, "readme_sentence"),
             _grid("grid:table", REPRODUCTION, "block"),
             _grid("grid:reading", REPRODUCTION, "rerun_reading"),
             _grid("grid:ordering", REPRODUCTION, "paper_ordering"),
             _grid("grid:sink-cell", REPRODUCTION, "sink_cell"),
             _grid("grid:questions", REPRODUCTION, "three_questions"),
             _frontier(),
             _classroom_load(), _budgets(), _scale_layerwise()]
    for kind in SECTION_DOCS:
        found += [_section(kind, path) for path in sorted((RESULTS / kind).glob("*.json"))]
    return found


def stale() -> list[Block]:
    """The blocks whose text in the document is not what their results file renders (or that are missing)."""
    out = []
    for block in blocks():
        text = read_block(block.doc.read_text(encoding="utf-8"), *block.pair)
        if text is None or text.strip() != block.render().strip():
            out.append(block)
    return out


def write_all() -> list[Block]:
    """Rewrite every block from its source; the blocks that changed."""
    return [b for b in blocks() if write_block(b.doc, *b.pair, b.render())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only list the blocks that differ from their files")
    args = p.parse_args(argv)
    changed = stale() if args.check else write_all()
    for block in changed:
        verb = "differs from" if args.check else "rewritten from"
        doc = block.doc.relative_to(ROOT) if block.doc.is_relative_to(ROOT) else block.doc
        print(f"{doc} <!-- {block.name} --> {verb} {block.source}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())

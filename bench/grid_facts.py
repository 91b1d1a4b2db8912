"""The sentences of README.md and docs/REPRODUCTION.md that quote the reproduction grid, computed from it.

Each function takes the committed grid (``docs/results/grid.json``, read by ``bench.grid_results.read_results``) and
returns Markdown; ``bench.docs`` writes it between the document's markers. A claim is worded from the
numbers ("never worse" only when no cell is worse), so a rerun that changes them changes the words too.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ghosted.recovery.methods import BASELINE_METHOD as NONE, RECOVERY, REFERENCE_METHOD as DENSE, with_role

TRAINED = ("streamline-ffn", "streamline-layer")  # LLM-Streamline's trained replacements
ITERATIVE = ("replaceme-cos",)  # fitted by Adam, not in closed form
PAPER_SELECTIONS = ("streamline", "shortgpt")  # the paper's own criteria (its released code's sequence-axis rules)


def fmt(value: float) -> str:
    """A perplexity as the grid's tables print it (2 decimals, 3 significant digits from 1000 on)."""
    return f"{value:.2f}" if value < 1000 else f"{value:.3g}"


def pct(new: float, old: float) -> str:
    """The relative change from ``old`` to ``new`` in per cent, one decimal below 10 % (two below 0.1 %)."""
    change = abs(new / old - 1) * 100
    return f"{change:.2f}" if change < 0.1 else f"{change:.1f}" if change < 10 else f"{change:.0f}"


@dataclass(frozen=True)
class Cell:
    """One layer set scored on one text: every method's perplexity."""

    selection: str
    n: int
    layers: str
    text: str
    ppl: dict

    @property
    def name(self) -> str:
        return f"{self.selection} {self.n} ({self.layers}) on {self.text}"

    def best(self, methods) -> tuple[str, float]:
        """The best (lowest) of ``methods`` that this cell has."""
        have = {m: self.ppl[m] for m in methods if m in self.ppl}
        method = min(have, key=have.get)
        return method, have[method]

    def recovery(self) -> list[str]:
        return with_role(self.ppl, RECOVERY)

    def closed_forms(self) -> list[str]:
        return [m for m in self.recovery() if m not in TRAINED + ITERATIVE]


def cells(frame: pd.DataFrame) -> list[Cell]:
    """The grid's cells in its own order (layer set, then text)."""
    found = []
    for (selection, n, layers, text), group in frame.groupby(["selection", "n", "layers", "eval"], sort=False):
        found.append(Cell(selection, int(n), layers, text, dict(zip(group.method, group.ppl))))
    return found


def _listing(items: list[str]) -> str:
    return "; ".join(items) if items else "none"


def auto_against_paper(grid: list[Cell]) -> dict:
    """ghost-auto against the paper's fit (ghost) and no recovery, cell by cell."""
    both = [c for c in grid if {"ghost", "ghost-auto", NONE} <= set(c.ppl)]
    return {"cells": both,
            "better": [c for c in both if c.ppl["ghost-auto"] < c.ppl["ghost"]],
            "same": [c for c in both if c.ppl["ghost-auto"] == c.ppl["ghost"]],
            "worse": [c for c in both if c.ppl["ghost-auto"] > c.ppl["ghost"]],
            "above_none": [c for c in both if c.ppl["ghost-auto"] > c.ppl[NONE]],
            "biggest_win": min(both, key=lambda c: c.ppl["ghost-auto"] / c.ppl["ghost"])}


def readme_sentence(frame: pd.DataFrame) -> str:
    """README: what ghost-auto did on the grid, in one sentence."""
    grid = cells(frame)
    facts = auto_against_paper(grid)
    total, worse = len(facts["cells"]), facts["worse"]
    sets = len({(c.selection, c.n, c.layers) for c in grid})
    texts = len({c.text for c in grid})
    exceptions = "" if len(worse) != 1 else (
        f" (the other: {worse[0].name}, {fmt(worse[0].ppl['ghost-auto'])} against {fmt(worse[0].ppl['ghost'])}, "
        f"+{pct(worse[0].ppl['ghost-auto'], worse[0].ppl['ghost'])} %)")
    above = facts["above_none"]
    versus_none = ("was never worse than no recovery" if not above else
                   f"was worse than no recovery in {len(above)} cells ({_listing([c.name for c in above])})")
    win = facts["biggest_win"]
    return (f"On the reproduction grid ({sets} layer sets x {texts} texts; "
            f"[docs/REPRODUCTION.md](docs/REPRODUCTION.md)) `ghost-auto` matched or beat the paper's fit in "
            f"{total - len(worse)} of {total} cells{exceptions}, {versus_none}, and where it gained most, "
            f"{win.name}, scored {fmt(win.ppl['ghost-auto'])} against the paper's {fmt(win.ppl['ghost'])} and "
            f"{fmt(win.ppl[NONE])} unrecovered.")


def three_questions(frame: pd.DataFrame) -> str:
    """REPRODUCTION: does ghost-auto match the paper everywhere, is it ever worse than no recovery, how much
    does it win at the largest n."""
    grid = cells(frame)
    facts = auto_against_paper(grid)
    better, same, worse = facts["better"], facts["same"], facts["worse"]
    gains = [pct(c.ppl["ghost-auto"], c.ppl["ghost"]) for c in better]
    gain_range = f" (by {min(gains, key=float)} % to {max(gains, key=float)} %)" if gains else ""
    worse_text = _listing([f"{c.name}, {fmt(c.ppl['ghost-auto'])} against {fmt(c.ppl['ghost'])} "
                           f"(+{pct(c.ppl['ghost-auto'], c.ppl['ghost'])} %)" for c in worse])
    closest = min(facts["cells"], key=lambda c: c.ppl[NONE] / c.ppl["ghost-auto"])
    above = facts["above_none"]
    largest = max(c.n for c in grid)
    wins = [f"{c.name}: {fmt(c.ppl['ghost-auto'])} against {fmt(c.ppl['ghost'])} "
            f"({c.ppl['ghost'] / c.ppl['ghost-auto']:.2f} x lower)" if c.ppl["ghost-auto"] < c.ppl["ghost"] else
            f"{c.name}: no win ({fmt(c.ppl['ghost-auto'])} against {fmt(c.ppl['ghost'])})"
            for c in facts["cells"] if c.n == largest]
    return "\n".join([
        f"1. **Does `auto` beat or match the paper everywhere?** On {len(facts['cells'])} cells it is better in "
        f"{len(better)}{gain_range}, identical in {len(same)} ({_listing([c.name for c in same])}) and worse "
        f"in {len(worse)} ({worse_text}).",
        "2. **Is it ever worse than no recovery?** "
        + ("No. " if not above else f"Yes, in {len(above)} cells ({_listing([c.name for c in above])}). ")
        + f"The closest cell: {closest.name}, {fmt(closest.ppl['ghost-auto'])} against "
        f"{fmt(closest.ppl[NONE])}.",
        f"3. **By how much does it win at {largest} layers?** " + "; ".join(wins) + ".",
    ])


def paper_ordering(frame: pd.DataFrame) -> str:
    """REPRODUCTION: does the grid order the methods as the paper does (ghost < ReplaceMe-LS < LinearPatch <
    no recovery) with the paper's own selections?"""
    grid = [c for c in cells(frame) if c.selection in PAPER_SELECTIONS]
    held, broken, lines = [], [], []
    for c in grid:
        linearpatch = min(c.ppl["linearpatch-diag"], c.ppl["linearpatch-rotate"])
        order = c.ppl["ghost"] < c.ppl["replaceme-ls"] < linearpatch < c.ppl[NONE]
        (held if order else broken).append(c)
        lines.append(f"- {c.name}: ghost {fmt(c.ppl['ghost'])}, ReplaceMe-LS {fmt(c.ppl['replaceme-ls'])}, "
                f"LinearPatch-D {fmt(c.ppl['linearpatch-diag'])}, -R {fmt(c.ppl['linearpatch-rotate'])}, "
                f"pruned {fmt(c.ppl[NONE])} (dense {fmt(c.ppl[DENSE])})")
    head = (f"With the paper's own selections ({', '.join(PAPER_SELECTIONS)}: the released code's sequence-axis "
            f"cosine), the paper's ordering ghost < ReplaceMe-LS < LinearPatch (the better of D and R) < no "
            f"recovery holds in {len(held)} of {len(grid)} cells"
            + (f"; not in {_listing([c.name for c in broken])}" if broken else "") + ":")
    return "\n".join([head, "", *lines])


def sink_cell(frame: pd.DataFrame) -> str:
    """REPRODUCTION: the cell where the paper's fit does worst against no recovery, method by method."""
    grid = cells(frame)
    worst = max((c for c in grid if "ghost" in c.ppl), key=lambda c: c.ppl["ghost"] / c.ppl[NONE])
    same_set = [c for c in grid if (c.selection, c.n, c.layers) == (worst.selection, worst.n, worst.layers)]
    lines = []
    for c in same_set:
        verdict = "worse than" if c.ppl["ghost"] > c.ppl[NONE] else "better than"
        others = ", ".join(f"{m} {fmt(c.ppl[m])}" for m in ("replaceme-ls", *TRAINED, "ghost-robust", "ghost-auto")
                           if m in c.ppl)
        lines.append(f"- {c.name}: the paper's fit {fmt(c.ppl['ghost'])}, {verdict} no recovery "
                     f"({fmt(c.ppl[NONE])}); {others}")
    return "\n".join(lines)


def rerun_reading(frame: pd.DataFrame) -> str:
    """REPRODUCTION: which method is best where, the low-rank ghost, Prune&Comp and ReplaceMe-cosine against
    no recovery, and ghost-auto against the best closed form."""
    grid = cells(frame)
    best = {c.name: c.best(c.recovery()) for c in grid}
    by_method: dict[str, list[str]] = {}
    for name, (method, value) in best.items():
        by_method.setdefault(method, []).append(f"{name} ({fmt(value)})")
    lines = [f"- best recovery, `{m}`: {_listing(where)}" for m, where in by_method.items()]
    if all("ghost-lowrank" in c.ppl for c in grid):
        for n in sorted({c.n for c in grid}):
            gaps = [c.ppl["ghost-lowrank"] / c.ppl["ghost"] - 1 for c in grid if c.n == n]
            lines.append(f"- `ghost-lowrank` against `ghost` at {n} layers: from {min(gaps) * 100:+.1f} % to "
                         f"{max(gaps) * 100:+.1f} %")
    for method in ("prunecomp", "replaceme-cos"):
        above = [f"{c.name} ({fmt(c.ppl[method])} against {fmt(c.ppl[NONE])})" for c in grid
                 if method in c.ppl and c.ppl[method] > c.ppl[NONE]]
        lines.append(f"- `{method}` worse than no recovery: {_listing(above)}")
    gaps = [(c.ppl["ghost-auto"] / c.best(c.closed_forms())[1] - 1, c) for c in grid if "ghost-auto" in c.ppl]
    gap, cell = max(gaps, key=lambda g: g[0])
    lines.append(f"- `ghost-auto` against the best closed form of its cell: at most {gap * 100:.2f} % above it "
                 f"({cell.name})")
    return "\n".join(lines)

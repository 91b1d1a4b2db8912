"""The training-free frontier: the closed-form replacement layer (``layer-ls``) against ``ghost`` and the
trained LLM-Streamline layer (``streamline-layer``), cell by cell of the reproduction grid.

Runs ``python -m ghosted grid`` on the cells asked for (or reads grids already run, ``--from DIR,DIR``: one
folder per cell, run one at a time on a shared machine), keeps their rows in the committed results file
``docs/results/frontier.json`` and writes the ``<!-- frontier:table -->`` section of docs/REPRODUCTION.md from
it (``python -m bench.docs`` renders it again from that file): per cell and evaluation text, each method's
perplexity with its 95 % bootstrap interval, KL from and top-1 agreement with the dense model, its parameters
beyond the pruned model, and its fit time against ``ghost``'s. A fit's time is its own solve or training plus,
for the methods that read the shared calibration statistics (every closed form here), that pass; the trained
layer captures its own stream pairs and reads none.

Command: ``python -m bench.frontier [--selections shortgpt] [--n 7,11] [--out-dir frontier-grid]``, or
``python -m bench.frontier --from DIR[,DIR...]`` from grids run with ``python -m ghosted grid --methods
dense,none,ghost,layer-ls,streamline-layer``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench._common import RESULTS, ROOT, command_line, machine, table, today

import pandas as pd

METHODS = ["dense", "none", "ghost", "layer-ls", "streamline-layer"]
RESULT_FILE = RESULTS / "frontier.json"  # the rows every number of the section comes from
DOC = ROOT / "docs" / "REPRODUCTION.md"
BLOCK = "frontier:table"  # its markers in DOC
TITLE = "The closed-form replacement layer against the trained one"
GRID_FILE = RESULTS / "grid.json"  # the committed reproduction grid: the reference rows a cell run here lacks
SHARED_STATS = {"ghost", "ghost-robust", "ghost-auto", "layer-ls"}  # read the shared calibration pass


def run_cells(selections: str, n: str, methods: str, out_dir: str, extra: list[str]) -> list[str]:
    """Run the grid once per (selection, n) cell, each into its own folder; the folders."""
    from ghosted.cli import main as ghosted

    folders = []
    for selection in selections.split(","):
        for count in n.split(","):
            folder = f"{out_dir}/{selection}-{count}"
            code = ghosted(["grid", "--selections", selection, "--n", count, "--methods", methods,
                            "--out-dir", folder, "--resume", *extra])
            if code:
                raise SystemExit(f"the grid of {selection} n={count} failed (exit code {code})")
            folders.append(folder)
    return folders


def gather(folders: list[str]) -> dict:
    """The rows and the command of every grid folder, as the committed results file holds them."""
    from bench.grid import grid_command

    payloads = [json.loads((Path(f) / "grid.json").read_text(encoding="utf-8")) for f in folders]
    rows = [row for p in payloads for row in p["rows"]]
    have = {(r["layers"], r["eval"], r["method"]) for r in rows}
    grid = json.loads(GRID_FILE.read_text(encoding="utf-8"))["rows"]
    cells = {(r["layers"], r["eval"]) for r in rows}
    borrowed = [{**r, "source": "docs/results/grid.json"} for r in grid
                if (r["layers"], r["eval"]) in cells and r["method"] in METHODS
                and (r["layers"], r["eval"], r["method"]) not in have]
    return {"commands": [grid_command(p["meta"]["config"]) for p in payloads],
            "machine": [p["meta"].get("versions", {}) for p in payloads],
            "rows": rows + borrowed}


def borrowed(row) -> bool:
    """A row taken from the committed reproduction grid (another machine: its times are not compared)."""
    return isinstance(row.get("source"), str)


def fit_seconds(row) -> float | None:
    """A method's time to fit (``row``: its grid row, named by the method): its own solve or training, plus
    the shared calibration pass when it reads it."""
    if row.name in ("dense", "none") or pd.isna(row.solve_seconds) or borrowed(row):
        return None
    shared = row.calib_seconds if row.name in SHARED_STATS and not pd.isna(row.calib_seconds) else 0.0
    return float(row.solve_seconds) + float(shared)


def _interval(row) -> str:
    return f"{row.ppl:.2f} [{row.ppl_low:.2f}, {row.ppl_high:.2f}]"


def cell_rows(frame: pd.DataFrame) -> list[list]:
    """One row per cell, text and method: perplexity, fidelity, parameters and fit time (ghost's = 1)."""
    rows = []
    if "source" not in frame:
        frame = frame.assign(source=None)
    for (selection, n, layers, text), cell in frame.groupby(["selection", "n", "layers", "eval"], sort=False):
        cell = cell.set_index("method")
        pruned = cell.parameters.get("none")
        ghost = fit_seconds(cell.loc["ghost"].rename("ghost")) if "ghost" in cell.index else None
        for method in [m for m in METHODS if m in cell.index]:
            row = cell.loc[method].rename(method)
            seconds = fit_seconds(row)
            fidelity = "-" if pd.isna(row.kl) else f"{row.kl:.3f} · {row.top1:.1%}"
            extra = "-" if pruned is None or method == "dense" else f"{int(row.parameters - pruned):,}"
            ratio = "-" if seconds is None or not ghost else f"{seconds / ghost:.1f}x"
            name = f"`{method}`" + (" †" if borrowed(row) else "")
            rows.append([f"{selection} {n} ({layers})", text, name, _interval(row), fidelity, extra,
                         "-" if seconds is None else f"{seconds:.1f}", ratio])
    return rows


def render(result: dict) -> str:
    """The section from the committed rows (``bench.docs`` renders it again from the file)."""
    frame = pd.DataFrame(result["rows"])
    header = ["cell", "text", "method", "perplexity [95 %]", "KL · top-1", "parameters added", "fit s",
              "fit vs ghost"]
    commands = "; ".join(f"`{c}`" for c in result["commands"])
    return (f"## {TITLE}\n\n`{result['command']}`, {result['date']}; {result['machine_line']}.\n\n"
            f"From `docs/results/frontier.json`, made by {commands}. Perplexity of the first calibration draw "
            "(bundled:news, 32 x 256 tokens + 8 held-out windows) with its 95 % bootstrap interval over the "
            "evaluation windows; KL(dense ‖ model) in nats per token and top-1 agreement with the dense model; "
            "parameters beyond the pruned model; fit time: the method's own solve or training plus, for the "
            "closed forms, the shared calibration pass (ghost's is its pass and its solve).\n\n"
            + table(header, cell_rows(frame))
            + "\n\n†: not run here; the row of the committed reproduction grid (`docs/results/grid.json`: the same "
              "cell, calibration draw and evaluation windows, measured on the machine that file names), so its "
              "fit time is not compared.\n\nReading: `layer-ls` and `streamline-layer` put back one layer per "
              "removed block (a copy of its first layer, which for a one-layer block is that layer itself: there "
              "both are exact at the start); "
              "`layer-ls` solves the copy's down-projection in closed form where `streamline-layer` trains the "
              "whole copy with gradient steps, and keeps `ghost`'s fit instead unless the solved layers predict "
              "the held-out windows significantly better.")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="folders", default="", help="grid folders already run, comma list")
    p.add_argument("--selections", default="shortgpt", help="selection criteria, comma list")
    p.add_argument("--n", default="7,11", help="numbers of layers removed, comma list")
    p.add_argument("--methods", default=",".join(METHODS), help="methods, comma list")
    p.add_argument("--out-dir", default="frontier-grid", help="where the grid folders go")
    args, extra = p.parse_known_args(argv)
    folders = [f for f in args.folders.split(",") if f] or run_cells(args.selections, args.n, args.methods,
                                                                     args.out_dir, extra)
    from ghosted.core.docblocks import markers, write_block

    result = {"command": command_line("frontier", argv), "date": today(), "machine_line": machine(),
              **gather(folders)}
    RESULT_FILE.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_block(DOC, *markers(BLOCK), render(result), append=True)
    return result


def block() -> str:
    """The section as ``bench.docs`` renders it from the committed file."""
    return render(json.loads(RESULT_FILE.read_text(encoding="utf-8")))


if __name__ == "__main__":
    main()

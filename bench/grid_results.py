"""The committed reproduction grid (``docs/results/grid.json``): read, merge, save, and render it as
docs/REPRODUCTION.md's generated block.

``python -m bench.grid`` writes the file (running the grid or reading the grid.json of ``python -m ghosted
grid``); ``python -m bench.docs`` renders the blocks from it through this module, so neither imports the other.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench._common import RESULTS, ROOT, machine, today

import pandas as pd

from ghosted.grid.run import GridConfig, GridResult
from ghosted.models.pruning import format_layers, parse_layers

DOC = ROOT / "docs" / "REPRODUCTION.md"
RESULT_FILE = RESULTS / "grid.json"  # the committed grid every generated grid number comes from


def load_result(folders: str) -> tuple[GridResult, list[str]]:
    """The grid(s) in comma-separated folders, merged, and the command that made each one."""
    payloads = [json.loads((Path(folder) / "grid.json").read_text()) for folder in folders.split(",") if folder]
    return merge(payloads), [grid_command(p["meta"]["config"]) for p in payloads]


def merge(payloads: list[dict]) -> GridResult:
    """Several grid.json payloads as one grid: their rows, and the first one's meta with the others' added."""
    frames = [pd.DataFrame(p["rows"]) for p in payloads]
    metas = [p["meta"] for p in payloads]
    meta = dict(metas[0])
    for key in ("selections", "settings"):
        meta[key] = {k: v for m in metas for k, v in m.get(key, {}).items()}
    meta["notes"] = [n for m in metas for n in m.get("notes", [])]
    meta["seconds"] = sum(m.get("seconds", 0) for m in metas)
    meta["influence_seconds"] = sum(m.get("influence_seconds", 0) for m in metas)
    frame = pd.concat(frames, ignore_index=True)
    for column, sep in (("chosen", ", "), ("auto_heldout_nll", "; ")):
        if column in frame:
            frame[column] = [drop_notation(text, layers, sep) for text, layers in zip(frame[column], frame.layers)]
    return GridResult(frame, meta)


def drop_notation(text, layers: str, sep: str = ", "):
    """ghost-auto's "<gap>: ..." parts (``chosen``, ``auto_heldout_nll``) with each gap in the drop notation.

    Grids written before gaps were named in the drop notation hold ``start-end`` with ``end`` excluded
    ("12-19: paper" for the layers 12-18). Read that way, their gaps cover the removed ``layers`` exactly, one
    layer fewer per gap than the drop notation would: those are rewritten ("12-18: paper"); anything else
    (already in the drop notation, or not a string) is kept as it is.
    """
    if not isinstance(text, str) or not text:
        return text
    parts = [part.partition(": ") for part in text.split(sep)]
    try:
        spans = [tuple(int(i) for i in gap.split("-")) for gap, _, _ in parts]
        old = [range(start, end) for start, end in spans]
    except ValueError:  # a single layer ("12") or not two numbers: not the old notation
        return text
    covered = [layer for span in old for layer in span]
    if sorted(covered) != parse_layers(layers):
        return text
    return sep.join(f"{format_layers(span)}: {rest}" for span, (_, _, rest) in zip(old, parts))


def read_results(path: Path = RESULT_FILE) -> GridResult:
    """The committed grid (docs/results/grid.json)."""
    return merge([json.loads(path.read_text(encoding="utf-8"))])


def save_results(result: GridResult, commands: list[str], path: Path = RESULT_FILE, where: str | None = None) -> None:
    """Save the grid as the committed results file, with when, where (``where``, default: this machine)
    and how it was made."""
    meta = {**result.meta, "generated": {"date": today(), "machine": where or machine(), "commands": commands}}
    rows = json.loads(result.frame.to_json(orient="records"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n", encoding="utf-8")


def grid_command(config: dict) -> str:
    """``python -m ghosted grid`` with the flags that differ from the defaults in ``config``."""
    flags = {"selections": "--selections", "n_values": "--n", "evals": "--evals", "eval_tokens": "--eval-tokens",
             "calib_seqs": "--calib-seqs", "seq_len": "--seq-len", "heldout_seqs": "--heldout-seqs",
             "eval_seq_len": "--eval-seq-len", "seed": "--seed", "calib": "--calib", "seeds": "--seeds",
             "device": "--device", "dtype": "--dtype"}
    default = vars(GridConfig().flat())
    parts = ["python -m ghosted grid"]
    for key, flag in flags.items():
        value = config.get(key)
        if value is not None and value != default[key]:
            parts.append(f"{flag} {','.join(map(str, value)) if isinstance(value, list) else value}")
    return " ".join(parts)


def block(result: GridResult) -> str:
    """The generated grid of REPRODUCTION.md: where it comes from, tables, selections, protocol, wall time."""
    meta, cfg = result.meta, result.meta.get("config", {})
    made = meta.get("generated", {})
    cal = meta.get("calibration", {})
    picks = "\n".join(f"- {k}: layers {v['layers']} ({v['criterion']})" for k, v in meta.get("selections", {}).items())
    notes = "".join(f"\n- {n}" for n in meta.get("notes", []))
    commands = " and ".join(f"`{c}`" for c in made.get("commands", []))
    head = f"From `docs/results/grid.json`, made {made.get('date')} by {commands} on {made.get('machine')}"
    if meta.get("seconds"):
        timing = ", ".join(f"{k}: fit {v['fit_seconds']} s, evaluation {v['eval_seconds']} s"
                           for k, v in meta.get("settings", {}).items())
        head += (f"; the grid took **{meta['seconds'] / 60:.1f} minutes** (influence pass "
                 f"{meta.get('influence_seconds')} s; per layer set: {timing})")
    provenance = f"\n\n{meta['provenance']}" if meta.get("provenance") else ""
    return (f"{head}.{provenance}\n\n"
            f"Model: {meta.get('model')}. Calibration: {cal.get('source')} ({cal.get('part')} part), "
            f"{cal.get('n_windows')} x {cal.get('seq_len')} tokens fitted + {cfg.get('heldout_seqs')} held-out "
            f"windows, seed {cfg.get('seed')}. Bold: the best recovery method in the row (dense and none excluded).\n\n"
            f"{result.markdown()}\n\nLayers removed (0-based):\n{picks}{notes}\n\n"
            "What ghost-auto chose (per gap, by next-token NLL on the held-out calibration windows):\n"
            + "\n".join(auto_choices(result.frame)))


def auto_choices(frame: pd.DataFrame) -> list[str]:
    """What ghost-auto chose per setting: its reported choice, or else the fit whose perplexity it shares
    on every evaluation text (one text alone can tie by chance, more so in a grid rounded as printed)."""
    lines = []
    for (selection, n, layers), group in frame.groupby(["selection", "n", "layers"], sort=False):
        by_text = [dict(zip(g.method, g.ppl)) for _, g in group.groupby("eval", sort=False)]
        if any("ghost-auto" not in ppl for ppl in by_text):
            continue
        auto = group[group.method == "ghost-auto"]
        if "chosen" in group and isinstance(auto.chosen.iloc[0], str):
            chose = auto.chosen.iloc[0]
        elif all(ppl["ghost-auto"] == ppl.get("ghost") for ppl in by_text):
            chose = "paper (same perplexity as ghost)"
        elif all(ppl["ghost-auto"] == ppl.get("ghost-robust") for ppl in by_text):
            chose = "robust (same perplexity as ghost-robust)"
        else:
            chose = "a mix of paper and robust fits across gaps"
        lines.append(f"- {selection} {n} ({layers}): {chose}")
    return lines

"""The grid's Markdown: perplexity, fidelity, zero-shot and calibration-draw tables from its tidy rows.

``GridResult.markdown()`` (``ghosted.grid.run``) joins them; docs/REPRODUCTION.md embeds the
result. Every table has one row per (selection, n, layers) and one column per method.
"""

from __future__ import annotations

import math

import pandas as pd

from ghosted.recovery import methods as registry

SETTING = ["selection", "n", "layers"]  # what identifies one row of every table


def to_markdown(frame: pd.DataFrame, meta: dict) -> str:
    """One table per evaluation text: rows = selection x n, columns = methods; best recovery in bold."""
    if frame.empty:
        return "(empty grid)"
    methods = list(dict.fromkeys(frame.method))
    parts = []
    for source in dict.fromkeys(frame["eval"]):
        proto = meta.get("evaluation", {}).get(source, {})
        parts.append(f"**Perplexity on {source}** ({proto.get('scored_tokens', '?')} tokens scored in "
                     f"{proto.get('n_windows', '?')} windows of {proto.get('seq_len', '?')}; lower is better; "
                     "[95 % bootstrap interval over windows]; ns: the paired difference from none holds zero)\n")
        parts.append("| selection | n | layers | " + " | ".join(methods) + " |")
        parts.append("|---|---|---|" + "---|" * len(methods))
        sub = frame[frame["eval"] == source]
        for (selection, n, layers), group in sub.groupby(SETTING, sort=False):
            ppl = dict(zip(group.method, group.ppl))
            recovered = {m: v for m, v in ppl.items() if registry.role_of(m) == registry.RECOVERY}
            best = min(recovered, key=recovered.get) if recovered else None
            rows = {r["method"]: r for r in group.to_dict("records")}
            cells = [_cell(ppl.get(m), m == best) + _interval_suffix(rows.get(m)) for m in methods]
            parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells) + " |")
        parts.append("")
        parts += fidelity_markdown(sub, methods, source)
    return "\n".join(parts).rstrip()


def _known(row: dict | None, key: str) -> bool:
    value = None if row is None else row.get(key)
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _interval_suffix(row: dict | None) -> str:
    """`` [low, high]`` (95 % bootstrap) and `` ns`` when the paired Δppl from the pruned model holds zero."""
    if not _known(row, "ppl_low"):
        return ""
    ns = " ns" if _known(row, "d_none_significant") and not row["d_none_significant"] else ""
    return f" [{row['ppl_low']:.2f}, {row['ppl_high']:.2f}]{ns}"


def fidelity_markdown(sub: pd.DataFrame, methods: list[str], source: str) -> list[str]:
    """A table of each method's KL from the dense model (nats per token) and top-1 agreement with it."""
    if "kl" not in sub or sub.kl.isna().all():
        return []
    shown = [m for m in methods if registry.role_of(m) != registry.REFERENCE]
    parts = [f"**Fidelity to the dense model on {source}** (mean per-token KL(dense ‖ model) in nats "
             "[95 % interval] · top-1 agreement; lower KL, higher agreement is closer)\n",
             "| selection | n | layers | " + " | ".join(shown) + " |", "|---|---|---|" + "---|" * len(shown)]
    for (selection, n, layers), group in sub.groupby(SETTING, sort=False):
        rows = {r["method"]: r for r in group.to_dict("records")}
        cells = [f"{rows[m]['kl']:.3f} [{rows[m]['kl_low']:.3f}, {rows[m]['kl_high']:.3f}] · "
                 f"{100 * rows[m]['top1']:.1f}%" if _known(rows.get(m), "kl_low") else "n/a" for m in shown]
        parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells) + " |")
    return [*parts, ""]


def task_markdown(tasks: pd.DataFrame | None) -> str:
    """One accuracy table per task (% with its 95 % interval), rows = selection x n, columns = methods; and the
    average over tasks when there are several (the paper's AVG). Empty without tasks."""
    if tasks is None or tasks.empty:
        return ""
    acc = tasks[tasks.metric == "acc"]
    names = list(dict.fromkeys(acc.task))
    parts = [""]
    for task in [*names, "average"] if len(names) > 1 else names:
        sub = acc[acc.task == task] if task != "average" else \
            acc.groupby(["selection", "n", "layers", "model"], sort=False, as_index=False).value.mean()
        methods = list(dict.fromkeys(sub.model))
        what = f"Zero-shot accuracy on {task}" if task != "average" else "Zero-shot accuracy, average over tasks"
        parts += [f"\n**{what}** (%, higher is better)\n", "| selection | n | layers | " + " | ".join(methods) + " |",
                  "|---|---|---|" + "---|" * len(methods)]
        for (selection, n, layers), group in sub.groupby(SETTING, sort=False):
            cells = {r.model: _acc_cell(r) for r in group.itertuples()}
            parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells.get(m, "n/a") for m in methods) + " |")
    return "\n".join(parts)


def _acc_cell(row) -> str:
    """An accuracy in % with its 95 % interval, or ± its stderr when no interval is known."""
    def known(name):
        value = getattr(row, name, None)
        return None if value is None or math.isnan(value) else value
    if known("low") is not None and known("high") is not None:
        return f"{100 * row.value:.1f} [{100 * row.low:.1f}, {100 * row.high:.1f}]"
    stderr = known("stderr")
    return f"{100 * row.value:.1f}" + ("" if stderr is None else f" ± {100 * stderr:.1f}")


def _cell(value: float | None, bold: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    text = f"{value:.2f}" if value < 1000 else f"{value:.3g}"
    return f"**{text}**" if bold else text


def seeds_markdown(frame: pd.DataFrame, meta: dict) -> str:
    """One table per evaluation text of each method's perplexity over the calibration draws (mean ± std
    over the seeds, n - 1); empty for a grid of one draw."""
    seeds = meta.get("seeds") or []
    if len(seeds) < 2 or "ppl_mean" not in frame:
        return ""
    methods = list(dict.fromkeys(frame.method))
    parts = [""]
    for source in dict.fromkeys(frame["eval"]):
        parts += [f"\n**Perplexity on {source} over {len(seeds)} calibration draws** (seeds "
                  f"{', '.join(map(str, seeds))}; mean ± standard deviation over the draws; the dense model "
                  "is not fitted, so it does not move)\n",
                  "| selection | n | layers | " + " | ".join(methods) + " |", "|---|---|---|" + "---|" * len(methods)]
        sub = frame[frame["eval"] == source]
        for (selection, n, layers), group in sub.groupby(SETTING, sort=False):
            rows = {r["method"]: r for r in group.to_dict("records")}
            cells = [_spread_cell(rows.get(m), len(seeds)) for m in methods]
            parts.append(f"| {selection} | {n} | {layers} | " + " | ".join(cells) + " |")
    return "\n".join(parts)


def _spread_cell(row: dict | None, draws: int) -> str:
    """``mean ± std`` of a row's perplexity over the draws (``(k of K draws)`` when some did not finish)."""
    if not _known(row, "ppl_mean"):
        return "n/a"
    std = f" ± {row['ppl_std']:.2f}" if _known(row, "ppl_std") else ""
    partial = f" ({int(row['seeds'])} of {draws} draws)" if int(row["seeds"]) < draws else ""
    return f"{_cell(row['ppl_mean'], False)}{std}{partial}"

"""``ghost-auto``: per gap, the paper's fit, the robust one or no operator, chosen by held-out NLL.

Independent mode scores every candidate fitted on the unpruned model's statistics; sequential mode
goes gap by gap, fitting each gap's candidates on the stream of the model patched upstream with the
choices made so far, then keeps the best of that result, no operator anywhere and sequential
``ghost``. Either way the result is never worse on the held-out windows than plain pruning.
The registry entry ``ghost-auto`` names ``fit_auto``; ``recover`` calls it with its ``FitContext``.
"""

from __future__ import annotations

import time

from ghosted.calibration.collect import Gap
from ghosted.core.progress import counted
from ghosted.operators.assembly import GapFit, assemble
from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import (FitContext, assembled_result, fit_ghost, fit_ghost_robust,
                                      sequential_fits)
from ghosted.recovery.methods import MethodResult

AUTO_CANDIDATES = ("paper", "robust", "none")  # ghost-auto's choices per gap; "none": no operator there
_AUTO_FITS = {"paper": fit_ghost, "robust": fit_ghost_robust}  # the candidates with an operator
_AUTO_LABEL = {"paper": "the paper's fit", "robust": "the robust fit",
               "none": "no operator (plain pruning is best here)"}


def fit_auto(ctx: FitContext, name: str) -> MethodResult:
    """``ghost-auto``: per gap, the paper's fit, the robust one or no operator, by held-out next-token
    NLL; in sequential mode each gap's candidates are fitted on the model patched upstream."""
    entry = registry.REGISTRY[name]
    if ctx.cfg.mode == "sequential":
        return _auto_sequential(ctx, entry)
    t0 = time.perf_counter()
    fits, choices = _auto(ctx, name)
    gaps = ctx.stream_gaps
    return assembled_result(ctx, entry, fits, choices, time.perf_counter() - t0, ctx.pick(ctx.stats, gaps),
                      ctx.pick(ctx.heldout, gaps), ctx.calib_seconds, statistics=ctx.shared)


def _heldout_nll(ctx: FitContext, fits: dict[Gap, GapFit], name: str) -> float:
    """Held-out next-token NLL of the cut with ``fits`` at their gaps (no operator at the others)."""
    from ghosted.evaluation.perplexity import perplexity

    return perplexity(assemble(ctx.model, ctx.dropped, fits, name, rule=ctx.rule), ctx.heldout_windows,
                      batch_size=ctx.cfg.calibration.batch_size, label=f"{name} held-out").nll


def _auto_choice(ctx: FitContext, name: str, gap: Gap, pick: str, trials: dict[str, float], how: str = "") -> dict:
    """One row of the run's choices: the three held-out NLLs of a gap and what was kept."""
    return {"method": name, "boundary": f"{gap.start}-{gap.end}", "chosen": pick,
            **{f"nll_{c}": trials[c] for c in AUTO_CANDIDATES},
            "reason": f"held-out NLL {trials['paper']:.4f} (paper), {trials['robust']:.4f} (robust), "
                      f"{trials['none']:.4f} (no operator) on {ctx.heldout_windows.input_ids.numel()} "
                      f"tokens{how}; chose {_AUTO_LABEL[pick]}"}


def _auto(ctx: FitContext, name: str):
    """Independent mode: every candidate fitted on the unpruned model's statistics.

    Starts from the better of "paper everywhere" and "no operator anywhere", then tries every other
    candidate gap by gap and keeps what lowers the held-out NLL, so the result is never worse on the
    held-out windows than plain pruning, nor than the paper's fit. Each configuration is scored once.
    """
    gaps = ctx.stream_gaps
    options = {c: {g: fit(ctx.stats[g], ctx.heldout[g], ctx.cfg)[0] for g in gaps} for c, fit in _AUTO_FITS.items()}
    scored: dict[tuple[str, ...], float] = {}

    def nll(picks: tuple[str, ...]) -> float:
        if picks not in scored:
            scored[picks] = _heldout_nll(ctx, {g: options[p][g] for g, p in zip(gaps, picks) if p != "none"}, name)
        return scored[picks]

    current = min((("paper",) * len(gaps), ("none",) * len(gaps)), key=nll)
    choices = []
    for i, g in enumerate(counted(gaps, ctx.progress, "ghost-auto: choosing per gap")):
        trials = {c: nll(current[:i] + (c,) + current[i + 1:]) for c in AUTO_CANDIDATES}
        pick = min(AUTO_CANDIDATES, key=lambda c: (trials[c], c != current[i]))  # ties keep the current one
        current = current[:i] + (pick,) + current[i + 1:]
        choices.append(_auto_choice(ctx, name, g, pick, trials))
    return {g: options[p][g] for g, p in zip(gaps, current) if p != "none"}, choices


def _auto_sequential(ctx: FitContext, entry: registry.Method) -> MethodResult:
    """Sequential mode: gap by gap, in order, the candidates are fitted on the stream of the model
    already pruned and patched upstream with the choices made so far, and scored on the held-out
    windows with every gap removed (no operator downstream yet). Last, the result is compared with
    no operator anywhere and with sequential ``ghost``, and the best of the three is kept, so it is
    never worse on the held-out windows than either."""
    gaps, name = ctx.stream_gaps, entry.name
    chosen: dict[Gap, GapFit | None] = {}  # gap -> its operator (None: no operator there), in order
    fit_stats, held_stats, rows = {}, {}, []
    calib_seconds = solve_seconds = 0.0
    final_nll = float("nan")  # held-out NLL of the choices once the last gap is chosen
    for i, gap in enumerate(counted(gaps, ctx.progress, "ghost-auto: choosing per gap (sequential)")):
        t0 = time.perf_counter()
        fit_stats[gap], held_stats[gap] = ctx.stats_upstream(gap, chosen, name, sinks=True)
        t1 = time.perf_counter()
        options = {c: fit(fit_stats[gap], held_stats[gap], ctx.cfg)[0] for c, fit in _AUTO_FITS.items()}
        kept = {g: f for g, f in chosen.items() if f is not None}
        trials = {c: _heldout_nll(ctx, {**kept, **({gap: options[c]} if c in options else {})}, name)
                  for c in AUTO_CANDIDATES}
        pick = min(AUTO_CANDIDATES, key=trials.get)  # ties: the first in AUTO_CANDIDATES
        chosen[gap], final_nll = options.get(pick), trials[pick]
        rows.append(_auto_choice(ctx, name, gap, pick, trials, ", fitted on the stream patched upstream"))
        calib_seconds += t1 - t0
        solve_seconds += time.perf_counter() - t1
    fits = {g: f for g, f in chosen.items() if f is not None}
    fits, note = _auto_safeguard(ctx, name, fits, rows, final_nll)
    notes = ["sequential: each gap's candidates fitted on the model patched upstream with the choices made so far"]
    return assembled_result(ctx, entry, fits, rows, solve_seconds, fit_stats, held_stats, calib_seconds,
                      notes=notes + ([note] if note else []))


def _auto_safeguard(ctx: FitContext, name: str, fits: dict[Gap, GapFit], rows: list[dict], mine: float):
    """Keep the gap-by-gap result (held-out NLL ``mine``, scored when its last gap was chosen) unless
    no operator anywhere, or the paper's fit everywhere fitted sequentially, predicts the held-out
    windows better; the rows then say so."""
    if all(row["chosen"] == "paper" for row in rows):
        return fits, ""  # the gap-by-gap result is sequential ghost already
    paper = sequential_fits(ctx, fit_ghost, name, sinks=False).fits
    others = {"no operator anywhere": {}, "the paper's fit everywhere (sequential)": paper}
    scores = {label: _heldout_nll(ctx, f, name) for label, f in others.items()}
    best = min(scores, key=scores.get)
    if scores[best] >= mine:
        return fits, ""
    for row in rows:
        row["chosen"] = "none" if not others[best] else "paper"
        row["reason"] += f"; replaced: {best} predicts the held-out windows better ({scores[best]:.4f} < {mine:.4f})"
    return others[best], f"kept {best}: held-out NLL {scores[best]:.4f}, the gap-by-gap choices {mine:.4f}"

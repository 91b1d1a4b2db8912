"""``ghost-auto``: per gap, the paper's fit, the robust one or no operator, chosen by held-out NLL.

Independent mode scores every candidate fitted on the unpruned model's statistics; sequential mode
goes gap by gap, fitting each gap's candidates on the stream of the model patched upstream with the
choices made so far. Either mode then keeps its result unless no operator anywhere predicts the
held-out windows better, or the paper's fit at every gap (``ghost``, fitted as the mode fits)
predicts them significantly better. Either way the result is never worse on the held-out windows
than plain pruning.

The choice weighs its own uncertainty: a difference measured on a few hundred held-out tokens is
noisy, and a fit that wins there can lose on other text. So the simpler candidate is kept (no
operator, then the paper's fit, then the robust one) unless the held-out NLL gain of the more
complex one is significant on its paired bootstrap interval over held-out windows
(``ghosted.evaluation.intervals``); each row of ``choices()`` gives the gains and their intervals.
With fewer than ``MIN_HELDOUT_WINDOWS`` held-out windows nothing can be told apart: the row says so
and no operator is kept. The registry entry ``ghost-auto`` names ``fit_auto``; ``recover`` calls it
with its ``FitContext``.
"""

from __future__ import annotations

import time

from ghosted.calibration.collect import Gap, gap_text
from ghosted.core.progress import counted
from ghosted.evaluation.scores import WindowScores
from ghosted.operators.assembly import GapFit, assemble
from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import FitContext, assembled_result, sequential_fits
from ghosted.recovery.gap_fits import fit_ghost, fit_ghost_robust
from ghosted.recovery.heldout import (AUTO_INTERVALS, MIN_HELDOUT_WINDOWS, heldout_scores,  # noqa: F401 (re-exported)
                                      mean_nll as _mean, significant_gain, wins)
from ghosted.recovery.methods import MethodResult

AUTO_CANDIDATES = ("paper", "robust", "none")  # ghost-auto's choices per gap; "none": no operator there
SIMPLEST_FIRST = ("none", "paper", "robust")  # the order of preference: a later one must win significantly
_AUTO_FITS = {"paper": fit_ghost, "robust": fit_ghost_robust}  # the candidates with an operator
_AUTO_LABEL = {"paper": "the paper's fit", "robust": "the robust fit",
               "none": "no operator (plain pruning is best here)"}


def fit_auto(ctx: FitContext, name: str) -> MethodResult:
    """``ghost-auto``: per gap, the paper's fit, the robust one or no operator, by held-out next-token
    NLL; in sequential mode each gap's candidates are fitted on the model patched upstream."""
    entry = registry.REGISTRY[name]
    if ctx.cfg.ghost_mode == "sequential":
        return _auto_sequential(ctx, entry)
    t0 = time.perf_counter()
    fits, choices, mine, paper = _auto(ctx, name)
    fits, note = _auto_safeguard(ctx, name, fits, choices, mine, "the paper's fit everywhere", lambda: paper)
    gaps = ctx.stream_gaps
    return assembled_result(ctx, entry, fits, choices, time.perf_counter() - t0, ctx.pick(ctx.stats, gaps),
                      ctx.pick(ctx.heldout, gaps), ctx.calib_seconds, statistics=ctx.shared,
                      **({"notes": [note]} if note else {}))


def _heldout(ctx: FitContext, fits: dict[Gap, GapFit], name: str) -> WindowScores:
    """Held-out per-window NLL sums of the cut with ``fits`` at their gaps (no operator at the others)."""
    return _heldout_many(ctx, {"trial": fits}, name)["trial"]


def _heldout_many(ctx: FitContext, trials: dict[str, dict[Gap, GapFit]], name: str) -> dict[str, WindowScores]:
    """``_heldout`` of several configurations in one pass (``heldout_scores``: the layers they share run once)."""
    models = {label: assemble(ctx.model, ctx.dropped, fits, name, rule=ctx.rule) for label, fits in trials.items()}
    return heldout_scores(models, ctx.heldout_windows, ctx.cfg.calibration.batch_size)


def decide(trials: dict[str, WindowScores]) -> tuple[str, dict]:
    """(the chosen candidate, the row fields behind it): start from no operator; a more complex candidate
    replaces the pick only when its held-out NLL is lower and the paired interval of the difference
    lies wholly below zero. Fields per operator candidate c: ``gain_c`` (ΔNLL against what was kept
    before it), ``gain_c_low``/``gain_c_high``, ``gain_c_against``; ``heldout_windows``."""
    pick, fields = SIMPLEST_FIRST[0], {"heldout_windows": len(trials["none"].nll)}
    for candidate in SIMPLEST_FIRST[1:]:
        better, gain = wins(trials[candidate], trials[pick])
        fields.update({f"gain_{candidate}": _mean(trials[candidate]) - _mean(trials[pick]),
                       f"gain_{candidate}_low": gain.low if gain else None,
                       f"gain_{candidate}_high": gain.high if gain else None, f"gain_{candidate}_against": pick})
        if better:
            pick = candidate
    return pick, fields


def _gain_text(fields: dict) -> str:
    """The intervals behind a choice, in words."""
    if fields["heldout_windows"] < MIN_HELDOUT_WINDOWS:
        return (f"only {fields['heldout_windows']} held-out window(s), fewer than the {MIN_HELDOUT_WINDOWS} "
                "needed to tell the candidates apart: too little held-out text, the simplest is kept")
    parts = []
    for c in SIMPLEST_FIRST[1:]:
        low, high = fields[f"gain_{c}_low"], fields[f"gain_{c}_high"]
        verdict = "significant" if high is not None and high < 0 and fields[f"gain_{c}"] < 0 else "not significant"
        parts.append(f"{c} vs {fields[f'gain_{c}_against']} ΔNLL {fields[f'gain_{c}']:+.4f} "
                     f"[{low:+.4f}, {high:+.4f}] ({verdict})")
    return "; ".join(parts)


def _auto_choice(ctx: FitContext, name: str, gap: Gap, trials: dict[str, WindowScores], how: str = "") -> dict:
    """One row of the run's choices: the three held-out NLLs of a gap, the intervals, what was kept."""
    pick, fields = decide(trials)
    nll = {c: _mean(trials[c]) for c in AUTO_CANDIDATES}
    return {"method": name, "gap": gap_text(gap), "chosen": pick,
            **{f"nll_{c}": nll[c] for c in AUTO_CANDIDATES}, **fields,
            "reason": f"held-out NLL {nll['paper']:.4f} (paper), {nll['robust']:.4f} (robust), "
                      f"{nll['none']:.4f} (no operator) on {ctx.heldout_windows.input_ids.numel()} "
                      f"tokens{how}; {_gain_text(fields)}; chose {_AUTO_LABEL[pick]}"}


def _auto(ctx: FitContext, name: str):
    """Independent mode: every candidate fitted on the unpruned model's statistics.

    Starts from no operator anywhere, then gap by gap (the others at their current choice) keeps the
    simplest candidate that no more complex one beats significantly (``decide``). Each kept change
    lowers the held-out NLL, so the result is never worse on the held-out windows than plain pruning.
    Each configuration is scored once. Returns the fits, the rows of the choices, the held-out scores
    of the result and the paper's fit at every gap (for ``_auto_safeguard``).
    """
    gaps = ctx.stream_gaps
    options = {c: {g: fit(ctx.stats[g], ctx.heldout[g], ctx.cfg)[0] for g in gaps} for c, fit in _AUTO_FITS.items()}
    scored: dict[tuple[str, ...], WindowScores] = {}

    def held(configurations: list[tuple[str, ...]]) -> list[WindowScores]:
        todo = {"/".join(picks): {g: options[p][g] for g, p in zip(gaps, picks) if p != "none"}
                for picks in dict.fromkeys(configurations) if picks not in scored}
        if todo:  # the new configurations differ at one gap: their common layers run once
            for label, scores in _heldout_many(ctx, todo, name).items():
                scored[tuple(label.split("/"))] = scores
        return [scored[picks] for picks in configurations]

    current = ("none",) * len(gaps)
    choices = []
    for i, g in enumerate(counted(gaps, ctx.progress, "ghost-auto: choosing per gap")):
        configurations = [current[:i] + (c,) + current[i + 1:] for c in AUTO_CANDIDATES]
        trials = dict(zip(AUTO_CANDIDATES, held(configurations)))
        choices.append(_auto_choice(ctx, name, g, trials))
        current = current[:i] + (choices[-1]["chosen"],) + current[i + 1:]
    fits = {g: options[p][g] for g, p in zip(gaps, current) if p != "none"}
    return fits, choices, held([current])[0], dict(options["paper"])


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
    final = None  # held-out scores of the choices once the last gap is chosen
    for i, gap in enumerate(counted(gaps, ctx.progress, "ghost-auto: choosing per gap (sequential)")):
        t0 = time.perf_counter()
        fit_stats[gap], held_stats[gap] = ctx.stats_upstream(gap, chosen, name, sinks=True)
        t1 = time.perf_counter()
        options = {c: fit(fit_stats[gap], held_stats[gap], ctx.cfg)[0] for c, fit in _AUTO_FITS.items()}
        kept = {g: f for g, f in chosen.items() if f is not None}
        trials = _heldout_many(ctx, {c: {**kept, **({gap: options[c]} if c in options else {})}
                                     for c in AUTO_CANDIDATES}, name)
        rows.append(_auto_choice(ctx, name, gap, trials, ", fitted on the stream patched upstream"))
        pick = rows[-1]["chosen"]
        chosen[gap], final = options.get(pick), trials[pick]
        calib_seconds += t1 - t0
        solve_seconds += time.perf_counter() - t1
    fits = {g: f for g, f in chosen.items() if f is not None}
    fits, note = _auto_safeguard(ctx, name, fits, rows, final, "the paper's fit everywhere (sequential)",
                                 lambda: sequential_fits(ctx, fit_ghost, name, sinks=False).fits)
    notes = ["sequential: each gap's candidates fitted on the model patched upstream with the choices made so far"]
    return assembled_result(ctx, entry, fits, rows, solve_seconds, fit_stats, held_stats, calib_seconds,
                      notes=notes + ([note] if note else []))


def _auto_safeguard(ctx: FitContext, name: str, fits: dict[Gap, GapFit], rows: list[dict], mine: WindowScores,
                    paper_label: str, paper_fits) -> tuple[dict[Gap, GapFit], str]:
    """Keep the gap-by-gap result (held-out scores ``mine``) unless no operator anywhere predicts the
    held-out windows better, or the paper's fit at every gap (``paper_fits()``, named ``paper_label``)
    predicts them significantly better; the rows then say so.

    Why the second: each gap is decided on its own, and with many small gaps (one per removed layer) no
    single gap's gain may be significant on a few hundred held-out tokens while their sum is; the
    whole set is then put to the same test as each gap."""
    if all(row["chosen"] == "paper" for row in rows):
        return fits, ""  # the gap-by-gap result is the paper's fit everywhere already
    others = {"no operator anywhere": {}}
    if any(row["chosen"] != "none" for row in rows):
        scores = {"no operator anywhere": _heldout(ctx, {}, name)}
    else:
        scores = {"no operator anywhere": mine}  # the choices are no operator anywhere already
    if len(mine.nll) >= MIN_HELDOUT_WINDOWS:
        others[paper_label] = paper_fits()
        scores[paper_label] = _heldout(ctx, others[paper_label], name)
    better = [label for label, s in scores.items() if _replaces(label, s, mine)]
    if not better:
        return fits, ""
    best = min(better, key=lambda label: _mean(scores[label]))
    new, old = _mean(scores[best]), _mean(mine)
    for row in rows:
        row["chosen"] = "none" if not others[best] else "paper"
        row["reason"] += f"; replaced: {best} predicts the held-out windows better ({new:.4f} < {old:.4f})"
    return others[best], f"kept {best}: held-out NLL {new:.4f}, the gap-by-gap choices {old:.4f}"


def _replaces(label: str, theirs: WindowScores, mine: WindowScores) -> bool:
    """No operator anywhere replaces the choices when its held-out NLL is lower at all (never worse than
    plain pruning); the paper's fit everywhere only when it is significantly lower."""
    if _mean(theirs) >= _mean(mine):
        return False
    if label == "no operator anywhere":
        return True
    gain = significant_gain(theirs, mine)
    return gain is not None and gain.known and gain.high < 0

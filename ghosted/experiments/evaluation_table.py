"""An experiment's evaluation as a table: one typed row per model and text, and how a row is built.

``Session.evaluate`` fills it; ``run``'s report, the grid's rows and the app's tables read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from torch import nn

from ghosted.recovery import methods as registry
from ghosted.recovery.fitting import RecoveryRun


@dataclass
class EvaluationRow:
    """One model scored on one text: the columns every table and report uses."""

    method: str  # the registry's name ("dense", "none", "ghost", ...)
    label: str  # the name users read ("pruned" for "none")
    role: str  # registry.REFERENCE, BASELINE or RECOVERY
    text: str  # the evaluation text
    ppl: float | None  # None: not evaluated (a stopped run)
    nll: float | None  # mean next-token NLL (nats)
    tokens: int | None  # tokens scored
    eval_seconds: float | None
    parameters: int
    protocol: dict | None  # the windows' protocol (source, part, windows, dtype, device)
    fit: dict = field(default_factory=dict)  # a fitted model's: statistics, seconds, choices, boundary errors
    summary: dict = field(default_factory=dict)  # ppl interval, KL/top-1 to dense, paired Δppl (scores.summarize)

    def entry(self) -> dict:
        """The report's entry for this row (``run --out``'s ``results``; the grid's rows)."""
        entry = {"method": self.method, "label": self.label, "role": self.role, "ppl": self.ppl, "nll": self.nll,
                 "tokens": self.tokens, "eval_seconds": self.eval_seconds, "parameters": self.parameters,
                 "protocol": self.protocol}
        if self.ppl is None:
            entry["evaluated"] = False
        return {**entry, **self.summary, **self.fit}


@dataclass
class EvaluationTable:
    """Every model on every text: one ``EvaluationRow`` per (method, text), texts in protocol order."""

    rows: list[EvaluationRow]
    protocol: dict = field(default_factory=dict)  # the perplexity protocol (EvaluationWindows.protocol)

    @property
    def texts(self) -> list[str]:
        return list(dict.fromkeys(r.text for r in self.rows))

    def entries(self) -> list[dict]:
        """One report entry per method, on the first text; ``ppl_by_source`` when there are several."""
        texts = self.texts
        first = [r for r in self.rows if r.text == texts[0]] if texts else []
        entries = [r.entry() for r in first]
        if len(texts) > 1:  # the paper protocol: one perplexity per text
            for entry in entries:
                entry["ppl_by_source"] = {r.text: r.ppl for r in self.rows if r.method == entry["method"]}
        return entries

    def records(self) -> list[dict]:
        """One plain dict per method and text (``eval`` = the text), without the protocols: the grid's rows."""
        return [{"eval": r.text, **{k: v for k, v in r.entry().items() if k != "protocol"}} for r in self.rows]

    def frame(self) -> pd.DataFrame:
        """``records()`` as a tidy frame."""
        return pd.DataFrame(self.records())


def evaluation_row(name: str, text: str, res, model: nn.Module, recovery: RecoveryRun | None = None,
                   errors: pd.DataFrame | None = None) -> EvaluationRow:
    """One model's row: perplexity (``res`` None: not evaluated), parameters and, for a fitted model,
    its fit (statistics reused or computed, seconds, ghost-auto's choices, boundary errors)."""
    return EvaluationRow(
        method=name, label=registry.label_of(name), role=registry.role_of(name), text=text,
        ppl=res.ppl if res else None, nll=res.nll if res else None, tokens=res.scored_tokens if res else None,
        eval_seconds=round(res.seconds, 2) if res else None, parameters=sum(p.numel() for p in model.parameters()),
        protocol=res.protocol if res else None, summary=dict(res.summary) if res else {},
        fit=fit_fields(name, recovery, errors) if recovery and name in recovery.results else {})


def fit_fields(name: str, recovery: RecoveryRun, errors: pd.DataFrame) -> dict:
    """A fitted model's report fields: how its statistics came, seconds, choices, boundary errors."""
    r = recovery.results[name]
    out = {"statistics": r.statistics,  # "computed" by a calibration pass, or "reused" from the cache
           "calib_seconds": round(r.calib_seconds, 3), "solve_seconds": round(r.solve_seconds, 4)}
    chosen = [c for c in r.choices if "chosen" in c]
    if chosen:  # ghost-auto: which fit each gap got, and the held-out NLL of each candidate
        out["chosen"] = ", ".join(f"{c['gap']}: {c['chosen']}" for c in chosen)
        out["auto_heldout_nll"] = "; ".join(  # a string, like "chosen", so grid frames stay flat
            f"{c['gap']}: " + ", ".join(f"{k[4:]} {c[k]:.4f}" for k in c if k.startswith("nll_"))
            for c in chosen)
    label = registry.label_of(name)
    for split in ("fit", "heldout"):
        rows = errors[(errors.method == label) & (errors.split == split)]
        if len(rows) and rows.delta_sq.sum() > 0:  # token-weighted over gaps: total error / total ‖Δ‖²
            out[f"{split}_boundary_error"] = float(rows.error.sum() / rows.delta_sq.sum())
    return out

"""The Compare page's evaluation, typed: one row per variant, and every table and series the pages show of it.

``EvalRequest.compute`` (``workbench``) turns ``Session.evaluate``'s table and each variant's size and
latency into a ``VariantTable``. The pages read its rows and ask it for what they display
(``interval_rows``, ``size_rows``, ``frontier``, ``ppl_error_bars``), so no page shapes numbers. ``frame()``
is the flat table of the downloads (CSV, the report), ``records()`` and ``from_records`` its plain-JSON form
(the store's disk copy, read back as untrusted input: every field is checked).

Example:
    >>> table = VariantTable.from_records(session_table.records())   # one record per variant
    >>> table.row("pruned").ppl, table.row("ghost").difference("none").cell()   # 55.0, "-25.00 [-28.00, -22.00]"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from ghosted.recovery.methods import BASELINE_METHOD, REFERENCE_METHOD, TRAINED_METHODS, label_of

PRUNED = label_of(BASELINE_METHOD)  # "pruned": the plainly pruned model's label
REFERENCE_LABEL = label_of(REFERENCE_METHOD)  # "dense": the unpruned model's label
SIZE_COLUMNS = {"parameters_m": "parameters (M)", "memory_mb": "memory (MB)", "latency_ms": "latency (ms)"}
FIDELITY = ("kl", "kl_low", "kl_high", "top1", "top1_low", "top1_high")  # to the dense model (scores.summarize)
BOUNDS = ("_low", "_high", "_significant")  # the suffixes of a paired difference's fields (d_<base>...)
KNOWN = ("eval", "method", "label", "role", "ppl", "nll", "tokens", "eval_seconds", "parameters", "ppl_low",
         "ppl_high", *FIDELITY, *SIZE_COLUMNS.values())  # the fields a row types; the others are its details


def span(low, high, digits: int = 2) -> str:
    """An interval as "[low, high]"; "" when it is not known."""
    known = not any(v is None or pd.isna(v) for v in (low, high))
    return f"[{low:,.{digits}f}, {high:,.{digits}f}]" if known else ""


@dataclass(frozen=True)
class Difference:
    """A variant's paired perplexity difference from a baseline (variant − base), with its 95 % interval."""

    base: str  # the baseline's method ("none": the pruned model, "ghost")
    value: float  # Δppl
    low: float | None = None  # None: too few windows for an interval
    high: float | None = None
    significant: bool | None = None  # False: the interval holds zero ("ns"); None: too few windows to tell

    def fields(self) -> dict:
        """The flat report fields: ``d_<base>``, ``d_<base>_low``, ``d_<base>_high``, ``d_<base>_significant``."""
        name = f"d_{self.base}"
        return {name: self.value, f"{name}_low": self.low, f"{name}_high": self.high,
                f"{name}_significant": self.significant}

    def cell(self) -> str:
        """The table's cell: Δppl with its interval, "ns" where the interval holds zero."""
        mark = " ns" if self.significant is False else ""
        return f"{self.value:+,.2f} {span(self.low, self.high)}{mark}".strip()


@dataclass(frozen=True)
class VariantRow:
    """One variant (dense, pruned, each recovered model) scored on the evaluation windows."""

    method: str  # the registry's name ("dense", "none", "ghost", ...)
    label: str  # the name users read ("pruned" for "none")
    ppl: float  # perplexity
    nll: float  # mean next-token NLL (nats)
    role: str = ""  # registry.REFERENCE, BASELINE or RECOVERY
    text: str = ""  # the evaluation text
    tokens: int | None = None  # tokens scored
    eval_seconds: float | None = None  # wall time of its scoring
    parameters: int | None = None  # parameter count (None: an evaluation stored without it)
    ppl_low: float | None = None  # the perplexity's 95 % interval (None: too few windows)
    ppl_high: float | None = None
    kl: float | None = None  # mean per-token KL from dense's next-token distribution (None: not measured)
    kl_low: float | None = None
    kl_high: float | None = None
    top1: float | None = None  # share of tokens whose most likely next token is dense's (a fraction)
    top1_low: float | None = None
    top1_high: float | None = None
    differences: tuple[Difference, ...] = ()  # from each baseline scored but itself, in the summary's order
    details: dict = field(default_factory=dict)  # the fit's report fields (statistics, seconds, ghost-auto's
    # choices, boundary errors): in the downloads only, no page reads them
    parameters_m: float | None = None  # size and speed (None: not measured)
    memory_mb: float | None = None
    latency_ms: float | None = None

    def difference(self, base: str) -> Difference | None:
        """The paired difference from ``base`` (a method), None when not measured (or ``base`` itself)."""
        return next((d for d in self.differences if d.base == base), None)

    def difference_cell(self, base: str) -> str:
        """The table's cell of the difference from ``base``; "" where not measured."""
        found = self.difference(base)
        return found.cell() if found else ""

    @property
    def sized(self) -> bool:
        """Whether its size and latency were measured."""
        return any(getattr(self, name) is not None for name in SIZE_COLUMNS)

    def record(self) -> dict:
        """The flat record of ``frame()`` without the size columns (the session's ``records()`` fields)."""
        out = {"eval": self.text, "method": self.method, "label": self.label, "role": self.role, "ppl": self.ppl,
               "nll": self.nll, "tokens": self.tokens, "eval_seconds": self.eval_seconds,
               "parameters": self.parameters, "ppl_low": self.ppl_low, "ppl_high": self.ppl_high}
        if self.kl is not None:  # fidelity to dense: measured for every variant, or none
            out.update({name: getattr(self, name) for name in FIDELITY})
        for difference in self.differences:
            out.update(difference.fields())
        return {**out, **self.details}

    def size_record(self) -> dict:
        """Its size and speed, under the columns the tables show."""
        return {column: getattr(self, name) for name, column in SIZE_COLUMNS.items()}

    @classmethod
    def from_record(cls, record) -> VariantRow:
        """A row from its flat record (``record()`` and ``size_record()`` merged, or a stored frame's row:
        an absent field may be None or NaN); ValueError when a field is missing or of the wrong kind."""
        if not isinstance(record, dict):
            raise ValueError("expected a record (a mapping)")
        data = {k: _clean(k, v) for k, v in record.items()}
        for name in ("method", "label", "ppl", "nll"):
            if data.get(name) is None:
                raise ValueError(f"a variant's record lacks {name!r}")
        sizes = {name: _number(data, column) for name, column in SIZE_COLUMNS.items()}
        bases = [k[2:] for k in data if k.startswith("d_") and not k.endswith(BOUNDS)]
        return cls(method=_text(data, "method"), label=_text(data, "label"), ppl=_number(data, "ppl"),
                   nll=_number(data, "nll"), role=_text(data, "role"), text=_text(data, "eval"),
                   tokens=_whole(data, "tokens"), eval_seconds=_number(data, "eval_seconds"),
                   parameters=_whole(data, "parameters"), ppl_low=_number(data, "ppl_low"),
                   ppl_high=_number(data, "ppl_high"), **{name: _number(data, name) for name in FIDELITY},
                   differences=tuple(d for d in (_difference(data, b) for b in bases) if d is not None),
                   details={k: v for k, v in data.items()
                            if k not in KNOWN and not k.startswith("d_") and v is not None}, **sizes)


def _clean(name: str, value):
    """A record's value with NaN read as None; ValueError for anything but a number, a string or None."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    raise ValueError(f"field {name!r} holds {type(value).__name__}, not a number or a string")


def _number(data: dict, name: str) -> float | None:
    value = data.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"field {name!r} is not a number")
    return value


def _whole(data: dict, name: str) -> int | None:
    value = _number(data, name)
    if value is not None and value != int(value):
        raise ValueError(f"field {name!r} is not a whole number")
    return None if value is None else int(value)


def _text(data: dict, name: str) -> str:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"field {name!r} is not a string")
    return value or ""


def _difference(data: dict, base: str) -> Difference | None:
    """The difference from ``base`` a record holds; None where its value is absent (a stored frame's NaN)."""
    name = f"d_{base}"
    if data.get(name) is None:
        return None
    significant = data.get(f"{name}_significant")
    if significant is not None and not isinstance(significant, bool):
        raise ValueError(f"field {name + '_significant'!r} is not true, false or null")
    return Difference(base, _number(data, name), _number(data, f"{name}_low"), _number(data, f"{name}_high"),
                      significant)


@dataclass(frozen=True)
class FrontierPoint:
    """A fitted method on the recovery frontier: parameters it adds to the pruned model, its perplexity."""

    label: str  # the method's label
    method: str  # the registry's name
    added: int  # parameters over the pruned model's
    ppl: float
    trained: bool  # fitted by gradient steps, not in closed form

    @property
    def fit(self) -> str:
        """How it was fitted, in words: "trained" or "closed form"."""
        return "trained" if self.trained else "closed form"


@dataclass(frozen=True)
class VariantTable:
    """Every variant of one evaluation, dense first, then pruned, then each recovered model."""

    rows: tuple[VariantRow, ...]  # one per variant, in the evaluation's order

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.rows]

    def row(self, label: str) -> VariantRow:
        """The row of the variant labelled ``label``; KeyError when there is none."""
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(label)

    def of_method(self, method: str) -> VariantRow | None:
        """The row of ``method`` (the registry's name), None when it was not evaluated."""
        return next((r for r in self.rows if r.method == method), None)

    # ---------------------------------------------------------------------------- the downloads' forms
    def records(self) -> list[dict]:
        """One flat record per variant (its fields and its size): the plain-JSON form."""
        return [{**r.record(), **(r.size_record() if r.sized else {})} for r in self.rows]

    @classmethod
    def from_records(cls, records) -> VariantTable:
        """A table from flat records (``records()``, ``Session.evaluate``'s, or a stored frame's)."""
        if not isinstance(records, list):
            raise ValueError("expected a list of records")
        return cls(tuple(VariantRow.from_record(r) for r in records))

    def frame(self) -> pd.DataFrame:
        """The flat table of the downloads: the session's columns, then the size columns when measured."""
        frame = pd.DataFrame([r.record() for r in self.rows])
        if any(r.sized for r in self.rows):
            frame = pd.concat([frame, pd.DataFrame([r.size_record() for r in self.rows])], axis=1)
        return frame

    # ---------------------------------------------------------------------------- what the pages show
    def interval_rows(self) -> pd.DataFrame:
        """The Compare page's perplexity table: perplexity with its 95 % interval, the paired differences
        from the pruned model and from ghost ("ns": not significant), KL from dense and top-1 agreement."""
        out = pd.DataFrame({"label": self.labels, "ppl": [r.ppl for r in self.rows],
                            "95 % interval": [span(r.ppl_low, r.ppl_high) for r in self.rows],
                            f"Δ vs {PRUNED}": [r.difference_cell(BASELINE_METHOD) for r in self.rows],
                            "Δ vs ghost": [r.difference_cell("ghost") for r in self.rows]})
        if any(r.kl is not None for r in self.rows):
            out["KL from dense"] = [_or_nan(r.kl) for r in self.rows]
            out["top-1 agreement %"] = (100 * pd.Series([_or_nan(r.top1) for r in self.rows])).round(2).tolist()
        out["nll"] = [r.nll for r in self.rows]
        return out if (out["Δ vs ghost"] != "").any() else out.drop(columns="Δ vs ghost")

    def size_rows(self) -> pd.DataFrame:
        """The Compare page's size and speed table: parameters, memory, latency and scoring time."""
        return pd.DataFrame([{"label": r.label, **r.size_record(), "eval_seconds": r.eval_seconds}
                             for r in self.rows])

    def ppl_error_bars(self) -> tuple[list[float], list[float]] | None:
        """The perplexity bars' 95 % interval as (above, below) each bar (0 where unknown); None without one."""
        if all(r.ppl_low is None and r.ppl_high is None for r in self.rows):
            return None
        above = [0.0 if r.ppl_high is None else r.ppl_high - r.ppl for r in self.rows]
        below = [0.0 if r.ppl_low is None else r.ppl - r.ppl_low for r in self.rows]
        return above, below

    @property
    def has_frontier(self) -> bool:
        """Whether the frontier can be drawn: the pruned model and a fitted one, every parameter count known."""
        return (len(self.rows) >= 3 and PRUNED in self.labels
                and all(r.parameters is not None for r in self.rows))

    def frontier(self) -> list[FrontierPoint]:
        """Each fitted method's parameters added (over the pruned model) and perplexity, and how it was fitted."""
        base = self.row(PRUNED).parameters
        return [FrontierPoint(r.label, r.method, int(r.parameters - base), r.ppl, r.method in TRAINED_METHODS)
                for r in self.rows if r.label not in (REFERENCE_LABEL, PRUNED)]

    def best_on_frontier(self, trained: bool) -> FrontierPoint | None:
        """The lowest-perplexity point fitted in closed form (``trained`` False) or trained; None if none is."""
        points = [p for p in self.frontier() if p.trained == trained]
        return min(points, key=lambda p: p.ppl) if points else None


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value

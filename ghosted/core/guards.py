"""Numerical guards: the errors and warnings a fit raises when its numbers cannot be trusted.

A broken fit must never look like a result. Non-finite activations, statistics or operators stop
with a ``NonFiniteError`` (a ``ValueError``) that names the gap and the likely cause; a fit whose
normal equations float64 cannot solve reliably (fewer calibration tokens than the width, or a huge
condition number) warns with ``IllConditionedFitWarning`` and says how many tokens would be enough.

This module imports nothing heavy (``ghosted.IllConditionedFitWarning`` is re-exported from the
package root); the tensor checks live next to the data they check (``solve``, ``calibration``).
"""

from __future__ import annotations

import math
import numbers

MAX_CONDITION = 1e12  # cond(XᵀX + εI) above which a float64 solve keeps only ~4 correct digits
TOKENS_PER_WIDTH = 4  # tokens per residual-stream channel recommended for a d x d operator
FLOAT16_HINT = ("non-finite activations usually mean float16 overflow: load the model in float32 or "
                "bfloat16 (--dtype float32)")


def nonfinite_cause(dtype: str) -> str:
    """The likely cause of non-finite activations in a model computing in ``dtype``, and what to do."""
    if "float16" in dtype and "bfloat16" not in dtype:
        return f"the model runs in {dtype}, whose range ends at 65504: load it in float32 or bfloat16 (--dtype float32)"
    return (f"the model produced them in {dtype}: check its weights (a broken checkpoint or conversion) and "
            "inputs; if it was trained in bfloat16, load it in bfloat16 or float32")


class IllConditionedFitWarning(UserWarning):
    """A ghost operator fitted from too few tokens, or from normal equations float64 cannot trust."""


class NonFiniteError(ValueError):
    """NaN or inf in activations, statistics or an operator; the message names the gap and cause."""


def gap_label(start: int, end: int) -> str:
    """The removed layers [start, end), as every message writes them."""
    return f"[{start}, {end})"


def tokens_needed(width: int) -> int:
    """Calibration tokens recommended for a width x width operator (``TOKENS_PER_WIDTH`` per channel)."""
    return TOKENS_PER_WIDTH * width


def check_eps(eps: float, name: str = "eps") -> float:
    """``eps`` as a float when it is a finite number >= 0; ValueError (or TypeError) otherwise."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(eps).__name__} {eps!r}.")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (the ridge of the ghost solve), got {eps!r}; "
                         "the default is 1e-6.")
    return float(eps)


def ill_conditioned_message(start: int, end: int, width: int, tokens: int, condition: float, eps: float,
                            seq_len: int | None = None) -> str | None:
    """Why the fit of gap [start, end) cannot be trusted and what to change, or None when it can."""
    rank_deficient = tokens < width
    if not rank_deficient and condition <= MAX_CONDITION:
        return None
    needed = tokens_needed(width)
    more = f", e.g. {math.ceil(needed / seq_len)} sequences of {seq_len}" if seq_len else ""
    if rank_deficient:
        why = (f"only {tokens:,} calibration tokens for a {width}-wide stream: XᵀX has rank at most "
               f"{tokens:,} < {width}, so the {width} x {width} operator fits these tokens exactly and "
               "generalises poorly")
    else:
        why = (f"XᵀX + εI has condition number {condition:.2g} (ε = {eps:g}), beyond the "
               f"{MAX_CONDITION:.0e} float64 solves reliably")
    return (f"Ill-conditioned ghost fit at gap {gap_label(start, end)}: {why}. Use at least {needed:,} "
            f"calibration tokens ({TOKENS_PER_WIDTH} x the width{more}); a larger eps or solver='pinv' "
            "also stabilises the solve.")

"""Links that reopen an experiment: the model, layers, methods and settings as URL query parameters.

A teacher sends one link to the class; opening it restores the run (``FitRequest``) and its evaluation
(``EvalRequest``) and, since identical requests share one result, shows the results at once when they
are computed (precomputed, or asked for by someone else before). A link is untrusted input: every
parameter is checked (whole numbers in range, methods from the registry, layers within the model, texts
the deployment allows), and a bad one is refused with a ``ValueError`` naming it. Uploaded texts have no
name a link could carry, so a run on an upload gives no link.

Example:
    >>> query = to_query("bundled:smollm2-135m-instruct", fit, evaluation)
    >>> query["layers"], query["methods"]
    ('20-25', 'ghost-auto,ghost,replaceme-ls')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ghosted.service import workbench as wb
from ghosted.service.deploy import DeployConfig

INTS = {  # parameter (short, user-facing) -> (request field: the spec's name, least, most)
    "n": ("calib_seqs", 1, 4096), "len": ("seq_len", 8, 8192), "heldout": ("heldout_seqs", 0, 1024),
    "seed": ("seed", 0, 2**31 - 1), "batch": ("batch_size", 1, 256),
}
EVAL_INTS = {"tokens": ("eval_tokens", 64, 10_000_000), "window": ("eval_seq_len", 16, 32768)}
CHOICES = {  # parameter -> (request field, its values)
    "mode": ("ghost_mode", ("independent", "sequential")), "granularity": ("granularity", ("auto", "block", "layer")),
}
NAMES = ("model", "layers", "methods", "calib", *INTS, *CHOICES, "eval", *EVAL_INTS)  # every parameter


@dataclass(frozen=True)
class Link:
    """What a link asks for: the model's source, the run and (optionally) its evaluation."""

    model: str  # model source
    fit: wb.FitRequest
    evaluation: wb.EvalRequest | None


def to_query(model_source: str, fit: wb.FitRequest, evaluation: wb.EvalRequest | None = None) -> dict[str, str] | None:
    """The query parameters naming ``fit`` (and ``evaluation``); None when a text is an upload."""
    from ghosted.models.pruning import format_layers

    texts = [fit.text] + ([evaluation.text] if evaluation else [])
    if not all(isinstance(t, str) for t in texts):
        return None
    query = {"model": model_source, "layers": format_layers(list(fit.layers)), "methods": ",".join(fit.methods),
             "calib": fit.text, **{p: str(getattr(fit, f)) for p, (f, _, _) in INTS.items()},
             **{p: str(getattr(fit, f)) for p, (f, _) in CHOICES.items()}}
    if evaluation is not None:
        sizes = {p: str(getattr(evaluation, f)) for p, (f, _, _) in EVAL_INTS.items()}
        query.update({"eval": evaluation.text, **sizes})
    return query


def from_query(params: Mapping, model_key: str, n_layers: int, cfg: DeployConfig) -> Link | None:
    """The experiment a link names (None when it names no layers); ValueError for a bad parameter."""
    from ghosted.models.pruning import parse_layers
    from ghosted.recovery.fitting import METHODS
    from ghosted.recovery.methods import RECOVERY, with_role

    given = {name: _one(params, name) for name in NAMES if name in params}
    if "layers" not in given:
        return None
    try:
        layers = tuple(parse_layers(given["layers"], n_layers))
    except ValueError as err:
        raise ValueError(f"This link's layers are not valid for this model: {err}") from None
    choices = {f: _int(given, p, lo, hi) for p, (f, lo, hi) in INTS.items() if p in given}
    for name, (f, allowed) in CHOICES.items():
        if name in given:
            if given[name] not in allowed:
                raise ValueError(f"This link's {name} must be one of {', '.join(allowed)}.")
            choices[f] = given[name]
    if "methods" in given:
        methods = tuple(m for m in given["methods"].split(",") if m)
        unknown = [m for m in methods if m not in with_role(METHODS, RECOVERY)]  # plain pruning is always there
        if not methods or unknown:
            raise ValueError(f"This link names unknown methods: {', '.join(unknown) or '(none)'}.")
        choices["methods"] = methods
    for name in ("calib", "eval"):
        if name in given:
            cfg.check_text_source(given[name])
    fit = wb.FitRequest(model=model_key, layers=layers, **choices,
                        **({"text": given["calib"]} if "calib" in given else {}))
    fit.check(cfg, n_layers)
    evaluation = None
    if "tokens" in given:
        sizes = {f: _int(given, p, lo, hi) for p, (f, lo, hi) in EVAL_INTS.items() if p in given}
        evaluation = wb.EvalRequest(fit=fit, **sizes, **({"text": given["eval"]} if "eval" in given else {}))
        evaluation.check(cfg)
    return Link(given.get("model", wb.BUNDLED_MODEL), fit, evaluation)


def _one(params: Mapping, name: str) -> str:
    """A parameter's single value (a repeated parameter keeps its last value, as browsers do)."""
    value = params[name]
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else ""
    return str(value).strip()


def _int(given: dict, name: str, least: int, most: int) -> int:
    text = given[name]
    if not text.isdigit() or not least <= int(text) <= most:
        raise ValueError(f"This link's {name} must be a whole number from {least:,} to {most:,}, got {text[:20]!r}.")
    return int(text)

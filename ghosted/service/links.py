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

from ghosted.experiments.spec import offered_range, setting_choices
from ghosted.service import workbench as wb
from ghosted.service.deploy import DeployConfig

# Every parameter is the spec's flat name of its setting (the request's field, the flag, the widget's key);
# its range and choices are the spec's (``offered_range``, ``setting_choices``), declared once there.
INTS = ("calib_seqs", "seq_len", "heldout_seqs", "seed", "batch_size")  # the run's whole-number settings
EVAL_INTS = ("eval_tokens", "eval_seq_len")  # the evaluation's
CHOICES = ("ghost_mode", "granularity")
NAMES = ("model", "layers", "methods", "calib", *INTS, *CHOICES, "eval", *EVAL_INTS)  # every parameter
FORMER = {"n": "calib_seqs", "len": "seq_len", "heldout": "heldout_seqs", "batch": "batch_size", "mode": "ghost_mode",
          "tokens": "eval_tokens", "window": "eval_seq_len"}  # earlier links' short names, read as the current ones


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
             "calib": fit.text, **{name: str(getattr(fit, name)) for name in (*INTS, *CHOICES)}}
    if evaluation is not None:
        query.update({"eval": evaluation.text, **{name: str(getattr(evaluation, name)) for name in EVAL_INTS}})
    return query


def from_query(params: Mapping, model_key: str, n_layers: int, cfg: DeployConfig) -> Link | None:
    """The experiment a link names (None when it names no layers); ValueError for a bad parameter."""
    from ghosted.models.pruning import parse_layers
    from ghosted.recovery.fitting import METHODS
    from ghosted.recovery.methods import RECOVERY, with_role

    given = {FORMER.get(name, name): _one(params, name) for name in (*FORMER, *NAMES) if name in params}
    if "layers" not in given:
        return None
    try:
        layers = tuple(parse_layers(given["layers"], n_layers))
    except ValueError as err:
        raise ValueError(f"This link's layers are not valid for this model: {err}") from None
    choices = {name: _int(given, name) for name in INTS if name in given}
    for name in CHOICES:
        if name in given:
            allowed = setting_choices(name)
            if given[name] not in allowed:
                raise ValueError(f"This link's {name} must be one of {', '.join(allowed)}.")
            choices[name] = given[name]
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
    if "eval_tokens" in given:
        sizes = {name: _int(given, name) for name in EVAL_INTS if name in given}
        evaluation = wb.EvalRequest(fit=fit, **sizes, **({"text": given["eval"]} if "eval" in given else {}))
        evaluation.check(cfg)
    return Link(given.get("model", wb.BUNDLED_MODEL), fit, evaluation)


def _one(params: Mapping, name: str) -> str:
    """A parameter's single value (a repeated parameter keeps its last value, as browsers do)."""
    value = params[name]
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else ""
    return str(value).strip()


def _int(given: dict, name: str) -> int:
    least, most = offered_range(name)
    text = given[name]
    if not text.isdigit() or not least <= int(text) <= most:
        raise ValueError(f"This link's {name} must be a whole number from {least:,} to {most:,}, got {text[:20]!r}.")
    return int(text)

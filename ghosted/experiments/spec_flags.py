"""The command line of an ``ExperimentSpec``: its flags from the fields' metadata, a spec from parsed flags,
and the ``python -m ghosted run`` call that repeats a spec.

Every leaf field of the spec carries its flag in its metadata (see ``ghosted.experiments.spec``), so the
flags are generated here and a field and its flag cannot drift apart.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING

from ghosted.experiments.spec import ExperimentSpec, _called, _flat_name, _leaves


class _Recorded(argparse.Action):
    """Stores a flag's value and remembers that it was given (so that it overrides a recipe)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        given = set(getattr(namespace, "given_flags", None) or ())
        setattr(namespace, "given_flags", given | {self.dest})


def add_spec_args(parser, names: list[str] | None = None, defaults: dict | None = None,
                  required: tuple[str, ...] = (), spec_class=ExperimentSpec) -> None:
    """Add the flags of the spec's fields named ``names`` (flat names; None: all) to ``parser`` (or a
    group), in the spec's order; ``defaults`` replaces a field's default, ``required`` makes flags required."""
    defaults = defaults or {}
    for _, f in _leaves(spec_class):
        name = _flat_name(f)
        if names is not None and name not in names:
            continue
        meta = f.metadata
        default = defaults.get(name, f.default_factory() if f.default is MISSING else f.default)
        kwargs = {"help": _called(meta["help"]), "action": _Recorded, "dest": _dest(f)}
        if isinstance(default, bool):  # a switch: --trust-remote-code sets True, --no-cache sets cache False
            kwargs.update(nargs=0, const=True, default=False)
        else:
            kwargs["default"] = ",".join(default) if isinstance(default, list) else default
            if default == "" and "choices" in meta:  # a choice left out reads None (argparse shows no empty default)
                kwargs["default"] = None
            if isinstance(default, (int, float)) or f.type in ("int | None", "float | None"):
                kwargs["type"] = float if isinstance(default, float) else int
            for key in ("choices", "metavar"):
                if key in meta:
                    kwargs[key] = _called(meta[key])
        if name in required:
            kwargs["required"] = True
            kwargs.pop("default", None)
        parser.add_argument(meta["flag"], **kwargs)


def _dest(f) -> str:
    return f.metadata["flag"].lstrip("-").replace("-", "_")


def spec_from_args(args, base: ExperimentSpec | None = None, ignore: tuple[str, ...] = ()) -> ExperimentSpec:
    """The spec the parsed flags give. Without ``base``: every flag the parser has, on the defaults;
    with ``base`` (a recipe's spec): only the flags given on the command line change it. ``ignore``:
    destinations that mean something else to this command (the grid's ``--n`` is a list)."""
    given = getattr(args, "given_flags", None) or set()
    options = {}
    for _, f in _leaves(ExperimentSpec):
        dest = _dest(f)
        if dest in ignore or not hasattr(args, dest) or (base is not None and dest not in given):
            continue
        value = getattr(args, dest)
        if value is None and f.default == "":  # --protocol left out
            value = ""
        elif f.metadata.get("invert"):
            value = not value
        elif "parse" in f.metadata:
            value = f.metadata["parse"](value) if isinstance(value, str) else list(value)
        options[_flat_name(f)] = value
    _check_task_flags(options)
    return (base or ExperimentSpec()).with_options(**options)


def _check_task_flags(options: dict) -> None:
    limit, shots = options.get("task_limit"), options.get("num_fewshot", 0)
    if limit is not None and limit < 1:
        raise ValueError(f"--task-limit must be at least 1 (got {limit}); leave it out for every example.")
    if shots < 0:
        raise ValueError(f"--num-fewshot must be 0 or more (got {shots}).")


def command(spec: ExperimentSpec) -> str:
    """The ``python -m ghosted run`` call that repeats ``spec``: its model, layers and methods, and every
    other flag whose value is not the default."""
    default, given = ExperimentSpec().options(), spec.options()
    lines = ["python -m ghosted run"]
    for _, f in _leaves(ExperimentSpec):
        name = _flat_name(f)
        value = given[name]
        if value == default[name] and name not in ("model", "drop", "methods"):
            continue
        if isinstance(value, bool):  # only a changed switch is written (--no-cache, --trust-remote-code)
            lines.append(f.metadata["flag"])
        elif value is not None and value != "":
            lines.append(f"{f.metadata['flag']} {','.join(value) if isinstance(value, list) else value}")
    return " \\\n  ".join(lines)

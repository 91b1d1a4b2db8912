"""Flags shared by several subcommands (model, text, protocol, device)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_model_args(p: argparse.ArgumentParser) -> None:
    from ghosted.experiments.spec_flags import add_spec_args

    g = p.add_argument_group("model")
    add_spec_args(g, ["model", "device", "dtype", "device_map"])
    g.add_argument("--offload-folder", default=None,
                   help="with --device-map: folder for the layers that fit on no device (disk offload)")
    add_spec_args(g, ["trust_remote_code", "layerwise"])


def add_text_args(p: argparse.ArgumentParser, calib: bool = True, evaluation: bool = True) -> None:
    """The calibration and evaluation flags, from the experiment spec's fields."""
    from ghosted.experiments.spec_flags import add_spec_args

    g = p.add_argument_group("text and protocol")
    names = ["calib", "calib_seqs", "seq_len", "heldout_seqs", "seed"] if calib else []
    add_spec_args(g, names + (["eval", "eval_tokens", "eval_seq_len"] if evaluation else []) + ["batch_size"])


def add_dry_run(p: argparse.ArgumentParser) -> None:
    """``--dry-run``: validate every setting and print the plan, reading the model's config only."""
    p.add_argument("--dry-run", action="store_true",
                   help="check every setting and print the plan (model, layers, windows, methods, estimated "
                        "forward passes) without loading weights or computing anything")


def add_seeds_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--seeds K``: K calibration draws (seeds --seed .. --seed+K-1); ``what`` says what each draw redoes."""
    p.add_argument("--seeds", type=int, default=1, metavar="K",
                   help=f"redraw the calibration windows K times (seeds --seed .. --seed+K-1), {what}, and report "
                        "each method's mean perplexity and its spread over the draws")


def progress_from_args(args):
    """The progress of a command's work: tqdm bars on stderr, none with ``--quiet``; use it as
    ``with progress_from_args(args) as progress:`` so every bar is closed however the work ends."""
    from ghosted.core.progress import TqdmProgress

    return TqdmProgress(disable=getattr(args, "quiet", False))


def facts_from_args(args):
    """The model's layer count and positions from its config alone (for ``--dry-run``: never the model's code,
    even with ``--trust-remote-code``); ``args``: the parsed flags or the experiment spec (a recipe's model)."""
    from ghosted.experiments.facts import model_facts

    return model_facts(model_fields(args)["source"])


def add_task_args(p: argparse.ArgumentParser) -> None:
    """--tasks, --task-limit, --num-fewshot: zero-shot accuracy next to perplexity."""
    from ghosted.experiments.spec_flags import add_spec_args

    add_spec_args(p.add_argument_group("zero-shot tasks"), ["tasks", "task_limit", "num_fewshot"])


def add_protocol_args(p: argparse.ArgumentParser) -> None:
    """--protocol: a named perplexity protocol (ghosted.evaluation.protocols)."""
    from ghosted.experiments.spec_flags import add_spec_args

    add_spec_args(p, ["protocol"])


def load_from_args(args, offload_folder: str | None = None):
    """The model a command names, through the session's one loader (every model field; a saved recovered
    folder comes back with its operators); ``args``: the parsed flags or the experiment spec."""
    from ghosted.experiments.session import load_spec_model
    from ghosted.experiments.spec import ExperimentSpec

    model = model_fields(args)
    folder = offload_folder or getattr(args, "offload_folder", None)
    return load_spec_model(ExperimentSpec().with_options(model=model.pop("source"), **model), offload_folder=folder)


def model_fields(args) -> dict:
    """The model fields (source, device, dtype, device_map, trust_remote_code) of a spec or of parsed flags."""
    from dataclasses import asdict

    from ghosted.experiments.spec import ExperimentSpec

    if isinstance(args, ExperimentSpec):
        return asdict(args.model)
    return {"source": args.model, "device": args.device, "dtype": args.dtype, "device_map": args.device_map,
            "trust_remote_code": args.trust_remote_code, "layerwise": getattr(args, "layerwise", False)}


def write_json(path: str | None, payload: dict) -> None:
    """Write a results JSON (stamped as Ghosted's, atomically), if ``path`` is given."""
    from ghosted.core.ownership import write_results

    if not path:
        return
    write_results(path, payload)
    print(f"wrote {path}", file=sys.stderr)


def check_output_folder(path: str, overwrite: bool = True, model: str | None = None) -> Path:
    """Refuse, before the model is loaded, an output folder that cannot be used: a file, an
    unwritable place, a non-empty folder unless ``overwrite``, and (with ``model``, the --model
    argument) the model's own folder or Ghosted's cache."""
    from ghosted.operators.targets import check_target_folder, protected_folders

    return check_target_folder(path, overwrite, protected_folders(model) if model else [])

"""Flags shared by several subcommands (model, text, protocol, device)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ghosted.models.assets import BUNDLED_MODEL


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=BUNDLED_MODEL,
                   help="bundled model (default), local Hugging Face folder, local .gguf file or hub id")
    g.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps")
    g.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    g.add_argument("--device-map", default=None,
                   help="pass 'auto' to shard a model larger than one device (accelerate)")
    g.add_argument("--offload-folder", default=None,
                   help="with --device-map: folder for the layers that fit on no device (disk offload)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="run code shipped with a hub model (off by default)")


def add_text_args(p: argparse.ArgumentParser, calib: bool = True, evaluation: bool = True) -> None:
    g = p.add_argument_group("text and protocol")
    if calib:
        g.add_argument("--calib", default="bundled:news",
                       help="calibration text: bundled:news, bundled:wiki, a plain-text file (any extension, "
                            "UTF-8) or a .jsonl file, or a dataset name (wikitext-2-raw-v1, c4, ptb, "
                            "hf:NAME[:CONFIG]) when online")
        g.add_argument("--calib-seqs", type=int, default=32, help="calibration sequences (default 32)")
        g.add_argument("--seq-len", type=int, default=256, help="calibration sequence length (default 256)")
        g.add_argument("--heldout-seqs", type=int, default=8,
                       help="extra calibration windows kept out of the fit for held-out errors (default 8)")
        g.add_argument("--seed", type=int, default=0, help="which calibration windows are drawn (default 0)")
    if evaluation:
        g.add_argument("--eval", default="bundled:wiki",
                       help="evaluation text, same choices as --calib (default bundled:wiki); the same "
                            "source as --calib is split (calibration: first 80 %%, evaluation: last 20 %%), "
                            "another one is read whole, from its start")
        g.add_argument("--eval-tokens", type=int, default=16384, help="evaluation tokens (default 16384)")
        g.add_argument("--eval-seq-len", type=int, default=512, help="perplexity window (default 512)")
    g.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")


def add_dry_run(p: argparse.ArgumentParser) -> None:
    """``--dry-run``: validate every setting and print the plan, reading the model's config only."""
    p.add_argument("--dry-run", action="store_true",
                   help="check every setting and print the plan (model, layers, windows, methods, estimated "
                        "forward passes) without loading weights or computing anything")


def facts_from_args(args):
    """The model's layer count and positions from its config alone (for ``--dry-run``)."""
    from ghosted.experiments.validate import model_facts

    return model_facts(args.model, trust_remote_code=args.trust_remote_code)


def add_task_args(p: argparse.ArgumentParser) -> None:
    """--tasks, --task-limit, --num-fewshot: zero-shot accuracy next to perplexity."""
    g = p.add_argument_group("zero-shot tasks")
    g.add_argument("--tasks", default="",
                   help="comma list of tasks scored for every method: bundled-lastword (offline, the last word "
                        "of bundled Wikipedia paragraphs) and lm-evaluation-harness task names (e.g. arc_easy, "
                        "hellaswag; online, needs requirements-eval.txt). A task that cannot be loaded is skipped")
    g.add_argument("--task-limit", type=int, default=None, metavar="N",
                   help="examples per task (None: all; bundled-lastword has 500)")
    g.add_argument("--num-fewshot", type=int, default=0, metavar="K", help="few-shot examples per task (the paper: 0)")


def add_protocol_args(p: argparse.ArgumentParser) -> None:
    """--protocol: a named perplexity protocol (ghosted.evaluation.protocols)."""
    from ghosted.evaluation.protocols import PROTOCOLS

    p.add_argument("--protocol", default=None, choices=list(PROTOCOLS),
                   help="perplexity preset: " + "; ".join(f"{k}: {v.note}" for k, v in PROTOCOLS.items())
                        + ". Without it, --eval, --eval-tokens and --eval-seq-len apply")


def task_options(args) -> dict:
    """The task and protocol flags as RunConfig / GridConfig fields."""
    from ghosted.evaluation.zeroshot import parse_tasks

    if args.task_limit is not None and args.task_limit < 1:
        raise ValueError(f"--task-limit must be at least 1 (got {args.task_limit}); leave it out for every example.")
    if args.num_fewshot < 0:
        raise ValueError(f"--num-fewshot must be 0 or more (got {args.num_fewshot}).")
    return {"tasks": parse_tasks(args.tasks), "task_limit": args.task_limit, "num_fewshot": args.num_fewshot,
            "protocol": getattr(args, "protocol", None) or ""}


def load_from_args(args):
    from ghosted.operators.checkpoint import load_any  # a saved recovered folder comes back with its operators

    return load_any(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                      trust_remote_code=args.trust_remote_code,
                      offload_folder=getattr(args, "offload_folder", None))


def write_json(path: str | None, payload: dict) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}", file=sys.stderr)


def check_output_folder(path: str, overwrite: bool = True, model: str | None = None) -> Path:
    """Refuse, before the model is loaded, an output folder that cannot be used: a file, an
    unwritable place, a non-empty folder unless ``overwrite``, and (with ``model``, the --model
    argument) the model's own folder or Ghosted's cache."""
    from ghosted.operators.checkpoint import check_target_folder, protected_folders

    return check_target_folder(path, overwrite, protected_folders(model) if model else [])

"""The help texts, choices and parsers of the experiment spec's fields (``ghosted.experiments.spec``).

Computed on use from the registries they describe (methods, criteria, protocols, tasks), so a flag's help
and choices cannot drift from what the code accepts, and importing the spec loads none of them.
"""

from __future__ import annotations


def methods_help_text() -> str:
    from ghosted.recovery.methods import methods_help

    return methods_help()


def select_help() -> str:
    from ghosted.selection.criteria import alias_text

    return ("instead of --drop, let this influence criterion choose the layers (see 'python -m ghosted "
            "influence --help'), e.g. recoverability; aliases: " + alias_text() + "; prunecomp:<criterion> "
            "runs Prune&Comp's iterative prune-and-compensate loop on it")


def protocol_choices() -> list[str]:
    from ghosted.evaluation.protocols import PROTOCOLS

    return list(PROTOCOLS)


def protocol_help() -> str:
    from ghosted.evaluation.protocols import PROTOCOLS

    return ("perplexity preset: " + "; ".join(f"{k}: {v.note}" for k, v in PROTOCOLS.items())
            + ". Without it, --eval, --eval-tokens and --eval-seq-len apply")


def parse_task_list(text: str) -> list[str]:
    from ghosted.evaluation.zeroshot import parse_tasks

    return parse_tasks(text)


def comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


TEXT_CHOICES = ("bundled:news, bundled:wiki, a plain-text file (any extension, UTF-8) or a .jsonl file, or a "
                 "dataset name (wikitext-2-raw-v1, c4, ptb, hf:NAME[:CONFIG]) when online")

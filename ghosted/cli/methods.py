"""``python -m ghosted methods``: the recovery methods, from the registry in ``ghosted.recovery.methods``."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("methods", help="list the recovery methods (what each is, its kind, its paper)",
                       description="Every name --methods accepts: what it is, the kind of result it builds, its "
                                   "gaps, the statistics it needs, whether it needs held-out windows, its paper.")
    p.add_argument("--markdown", action="store_true", help="print the README's Markdown table instead")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from ghosted.recovery.methods import markdown_table, text_table

    print(markdown_table() if args.markdown else text_table())
    return 0

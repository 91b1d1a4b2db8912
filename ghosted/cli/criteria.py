"""``python -m ghosted criteria``: the layer-selection criteria, from ``ghosted.selection.criteria.CRITERIA``."""

from __future__ import annotations

COSTS = {"pass": "the shared forward pass", "heldout": "the shared pass + one over held-out windows",
         "per-layer": "one forward pass per candidate layer", "gradient": "one backward pass"}  # cost in words


def add_parser(sub) -> None:
    p = sub.add_parser("criteria", help="list the layer-selection criteria and their aliases",
                       description="Every criterion --select and `influence --metrics` accept: what it measures, "
                                   "which end of its ranking is removed, what it costs, who defined it; then the "
                                   "aliases.")
    p.set_defaults(handler=handle)


def criteria_text() -> str:
    """The CRITERIA table and the aliases as plain text."""
    from ghosted.selection.criteria import ALIASES, CRITERIA, ITERATIVE

    aliases: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        aliases.setdefault(name, []).append(alias)
    lines = []
    for c in CRITERIA.values():
        lines.append(c.name + (f" (alias: {', '.join(aliases[c.name])})" if c.name in aliases else ""))
        lines.append(f"    {c.label}")
        lines.append(f"    per {c.kind}; removes the {c.prune} values first; cost: {COSTS.get(c.cost, c.cost)}; "
                     f"from: {c.origin}")
    lines.append(f"\n{ITERATIVE}<criterion> (for --select): Prune&Comp's iterative prune-and-compensate loop "
                 "on any criterion above.")
    return "\n".join(lines)


def handle(args) -> int:
    print(criteria_text())
    return 0

"""``python -m ghosted influence``: every layer-selection criterion, written as CSV and JSON."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ghosted.cli.common import (
    add_dry_run, add_model_args, add_text_args, facts_from_args, load_from_args, progress_from_args)

if TYPE_CHECKING:
    from ghosted.experiments.spec import ExperimentSpec

INFLUENCE_FILES = ("blocks.csv", "layers.csv", "influence.json", "selections.csv")  # what influence writes
GROUPS = {"single": "every criterion of the one shared forward pass (incl. recoverability)",
          "all": "everything, incl. ppl_single and sleb (one forward pass per candidate layer) and taylor "
                 "(one backward pass)"}


def add_parser(sub) -> None:
    from ghosted.selection.criteria import CRITERIA, alias_text

    p = sub.add_parser("influence", help="score every layer and contiguous block by each selection criterion",
                       description="Compute layer-selection criteria (ShortGPT, Gromov angular distance, "
                                   "LLM-Streamline, the paper's sequence-axis cosine, Shortened-LLaMA PPL and "
                                   "Taylor+, SLEB) and the ghost recoverability score; write blocks.csv "
                                   "(metric, start, n, end, value), layers.csv (metric, layer, value), "
                                   "selections.csv and influence.json. Layers are 0-based; block (start, n) "
                                   "removes layers start..start+n-1.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    add_text_args(p, evaluation=False)
    g = p.add_argument_group("criteria")
    g.add_argument("--metrics", default="single",
                   help="comma list of criteria or groups. Groups: "
                        + "; ".join(f"{k}: {v}" for k, v in GROUPS.items())
                        + ". Criteria: " + ", ".join(CRITERIA) + ". Aliases: " + alias_text())
    g.add_argument("--n-values", default="all",
                   help="block sizes n of the block criteria, e.g. '7,11' or '5-9'; 'all' = 1..L-1")
    g.add_argument("--recoverability-n", default="auto",
                   help="block sizes for recoverability: a list, 'all' (= --n-values), or 'auto': --n-values "
                        "when given, else about 22%% and 34%% of the layers (7/32, 11/32). It stores 8·d² "
                        "float64 bytes per boundary pair it needs (SmolLM2, every n: 1.3 GB and ~6x the "
                        "Gram work of n = 7,11)")
    g.add_argument("--eps", type=float, default=1e-6, help="ridge of the ghost solve (recoverability)")
    g.add_argument("--candidate-windows", type=int, default=8,
                   help="calibration windows for ppl_single and sleb (0 = all)")
    g.add_argument("--sleb-steps", type=int, default=0,
                   help="layers SLEB removes (0 = the largest --n-values, or L/4 with 'all')")
    g.add_argument("--max-gram-gib", type=float, default=4.0,
                   help="refuse recoverability Gram blocks beyond this many GiB")
    p.add_argument("--out-dir", default="influence", help="folder for the CSV and JSON files")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files of those names in --out-dir even if Ghosted did not write them")
    add_dry_run(p)
    p.set_defaults(handler=handle)


def parse_metrics(text: str, with_heldout: bool) -> list[str]:
    """Expand groups and check names; ``recoverability_heldout`` needs held-out windows."""
    from ghosted.selection.criteria import ALIASES, CRITERIA, SINGLE_PASS, alias_text

    names: list[str] = []
    for part in filter(None, (x.strip() for x in text.split(","))):
        if part == "single":
            names += SINGLE_PASS
        elif part == "all":
            names += list(CRITERIA)
        elif part.lower() in CRITERIA or part.lower() in ALIASES:
            names.append(ALIASES.get(part.lower(), part.lower()))
        else:
            raise ValueError(f"Unknown criterion {part!r}; choose from {', '.join([*GROUPS, *CRITERIA])}, or an "
                             f"alias: {alias_text()}.")
    if not names:
        raise ValueError(f"Give at least one criterion (--metrics), e.g. single or {', '.join(CRITERIA)}.")
    if not with_heldout:
        names = [m for m in names if m != "recoverability_heldout"]
    return list(dict.fromkeys(names))


def handle(args) -> int:
    from ghosted.models.architecture import num_layers
    from ghosted.experiments.session import Session
    from ghosted.selection.rules import selections
    from ghosted.core.ownership import claim_output_dir
    from ghosted.experiments.facts import facts_of_model
    from ghosted.experiments.plans import plan_influence

    spec, metrics, n_values = check_args(args)  # every setting, before the model is loaded
    if args.dry_run:
        facts = facts_from_args(args)
        _check_model(args, n_values, facts)
        print(plan_influence(spec, metrics, args.n_values, args.out_dir, facts))
        return 0
    lm = load_from_args(args)
    _check_model(args, n_values, facts_of_model(lm.model))  # before any forward pass
    rec_n = _recoverability_n(args.recoverability_n.strip(), n_values, num_layers(lm.model))
    with progress_from_args(args) as progress:  # the session draws the spec's windows, as run draws them
        report = Session(spec, lm, progress).influence(
            metrics=metrics, n_values=n_values, recoverability_n_values=rec_n, batch_size=args.batch_size,
            eps=args.eps, candidate_windows=args.candidate_windows or None, sleb_steps=args.sleb_steps or None,
            max_gram_gib=args.max_gram_gib)
    report.meta["model"] = lm.name
    shown = report.meta["n_values"] if n_values else _typical_n(report.num_layers)
    chosen = selections(report, report.meta["n_values"])
    paths = report.save(claim_output_dir(args.out_dir))
    chosen.to_csv(paths[0].parent / "selections.csv", index=False)
    _print_summary(report, chosen[chosen.n.isin(shown)])
    for path in [*paths, paths[0].parent / "selections.csv"]:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def check_args(args) -> tuple[ExperimentSpec, list[str], list[int] | None]:
    """Every setting that needs no model: (the spec the flags give, criteria, block sizes or None for all)."""
    from ghosted.models.pruning import parse_layers
    from ghosted.experiments.spec_flags import spec_from_args
    from ghosted.experiments.validate import check_calibration, check_count, check_eps, check_out_dir

    check_out_dir(args.out_dir, overwrite=args.overwrite, model=args.model,
                  names=INFLUENCE_FILES)  # cheapest first: a bad --out-dir fails before any text is read
    spec = spec_from_args(args)
    check_calibration(spec)
    check_eps(args.eps)
    check_count("candidate_windows", args.candidate_windows, minimum=0)
    check_count("sleb_steps", args.sleb_steps, minimum=0)
    if not args.max_gram_gib > 0:
        raise ValueError(f"max_gram_gib (--max-gram-gib) must be above 0; got {args.max_gram_gib}.")
    metrics = parse_metrics(args.metrics, spec.calibration.heldout_seqs > 0)
    n_values = None if args.n_values.strip() in ("", "all") else parse_layers(args.n_values)
    _check_n_values(n_values, None)
    return spec, metrics, n_values


def _check_n_values(n_values: list[int] | None, total: int | None) -> None:
    """Block sizes 1 .. L-1."""
    from ghosted.experiments.validate import check_n

    for n in n_values or []:
        check_n(n, total, "n_values")


def _check_model(args, n_values: list[int] | None, facts) -> None:
    """Block sizes within the model's layers, windows within its positions."""
    from ghosted.experiments.validate import check_positions

    _check_n_values(n_values, facts.layers)
    check_positions(facts.max_positions, seq_len=args.seq_len)


def _recoverability_n(text: str, n_values: list[int] | None, total: int) -> list[int] | None:
    """Block sizes for recoverability from --recoverability-n (None: the same as --n-values)."""
    from ghosted.models.pruning import parse_layers

    if text == "all" or (text == "auto" and n_values):
        return None
    return _typical_n(total) if text in ("auto", "") else parse_layers(text)


def _typical_n(total: int) -> list[int]:
    """Block sizes to print when every n was computed: about 22 % and 34 % of the layers (7/32, 11/32)."""
    return sorted({max(1, round(total * 7 / 32)), max(1, round(total * 11 / 32))})


def _print_summary(report, chosen) -> None:
    meta = report.meta
    tokens = meta.get("tokens") or meta.get("candidate_tokens")
    print(f"{meta.get('model', 'model')}: {report.num_layers} layers, {tokens} calibration tokens; "
          f"seconds {meta['seconds']}")
    print(f"{'criterion':<24}{'n':>4}  layers")
    for row in chosen.itertuples():
        print(f"{row.metric:<24}{row.n:>4}  {row.layers if isinstance(row.layers, str) else '-'}")

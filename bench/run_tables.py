"""Tables of the documents rendered from the results JSON of one ``python -m ghosted run --out FILE``.

The JSON is committed as it was written (``docs/results/runs/NAME.json``); ``bench.docs`` renders each
table from it, the command that reproduces it included (from the run's own ``config``), so the
command, the protocol and the numbers cannot drift apart.
"""

from __future__ import annotations

import re

from ghosted.recovery.methods import BASELINE_METHOD, RECOVERY, REFERENCE_METHOD, label_of, role_of


def run_command(report: dict) -> str:
    """The ``python -m ghosted run`` line that made the report (its layers, methods and evaluation size)."""
    config = report["config"]
    methods = ",".join(e["method"] for e in report["results"])
    return (f"python -m ghosted run --drop {report['dropped_spec']} --methods {methods} "
            f"--eval-tokens {config['eval_tokens']}")


def protocol_text(report: dict) -> str:
    """Calibration and evaluation in words, as the run reported them."""
    cal, ev = report["protocol"]["calibration"], report["protocol"]["evaluation"]
    return (f"calibration: {cal['source']} ({cal['part']} part), {cal['n_windows']} x {cal['seq_len']} tokens, "
            f"{report['config']['heldout_seqs']} more windows held out, seed {cal['seed']}; evaluation: "
            f"{ev['source']} ({ev['part']}), {ev['scored_tokens']:,} tokens scored in {ev['n_windows']} windows "
            f"of {ev['seq_len']}, {ev['dtype']} on {ev['device']}")


def _label(entry: dict) -> str:
    if entry["method"] == BASELINE_METHOD:
        return f"{BASELINE_METHOD} ({label_of(BASELINE_METHOD)})"
    chosen = sorted(set(re.findall(r":\s*([\w-]+)", entry.get("chosen", ""))))  # "<gap>: robust, <gap>: paper"
    return f"{entry['method']} (chose {' and '.join(chosen)})" if chosen else entry["method"]


def sinks_table(report: dict) -> str:
    """README: perplexity and held-out boundary error of each method where the sink is born in the block."""
    results = {e["method"]: e for e in report["results"]}
    recovered = {m: e["ppl"] for m, e in results.items() if role_of(m) == RECOVERY}
    best = min(recovered.values())
    dense = (f"; dense perplexity on these tokens: {results[REFERENCE_METHOD]['ppl']:.1f}"
             if REFERENCE_METHOD in results else "")
    lines = [f"Measured with `{run_command(report)}` ({protocol_text(report)}{dense}):", "",
             "| method | perplexity | held-out boundary error (share of ‖Δ‖² left) |", "|---|---|---|"]
    for method, entry in results.items():
        if method == REFERENCE_METHOD:
            continue
        ppl = f"{entry['ppl']:.1f}"
        error = entry.get("heldout_boundary_error")
        lines.append(f"| {_label(entry)} | {f'**{ppl}**' if entry['ppl'] == best else ppl} | "
                     f"{'-' if error is None else f'{error:.3f}'} |")
    return "\n".join(lines)

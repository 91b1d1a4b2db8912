"""What the honest-comparison metrics cost: shared-prefix evaluation with and without them, in one run.

The bundled model with layers 20-26 removed, recovered by ``none``, ``ghost``, ``ghost-robust``,
``replaceme-ls`` and ``linearpatch-diag``, scored with the dense model on the same windows by
``shared_prefix.perplexities`` in two ways, timed in turn (round robin):

  * plain: perplexity only (no reference model named, no baselines), today's evaluation;
  * with metrics: the KL divergence from and top-1 agreement with the dense model, the per-window
    sums, the bootstrap intervals and the paired differences from ``none`` and ``ghost``.

Both ways run the same forward passes (the dense logits are in the pass anyway), so the ratio is
the price of the extra arithmetic. The perplexities of the two ways are checked to be identical.

Command: ``python -m bench.fidelity_cost [--eval-tokens 4096] [--rounds 3]``.
"""

from __future__ import annotations

import argparse

from bench._common import load_bundled, median, ratio, round_robin, session_fit, table, write_section

from ghosted.data.windows import calibration_windows, evaluation_windows
from ghosted.evaluation.shared_prefix import perplexities

METHODS = ["none", "ghost", "ghost-robust", "replaceme-ls", "linearpatch-diag"]
TARGET = 1.10  # the bound: the metrics cost at most 10 % over plain evaluation


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval-tokens", type=int, default=4096, help="evaluation tokens (bundled:wiki)")
    p.add_argument("--seq-len", type=int, default=512, help="perplexity window")
    p.add_argument("--drop", default="20-26", help="layers removed")
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds (median of ratios)")
    args = p.parse_args(argv)
    lm = load_bundled()
    calib = calibration_windows(lm.tokenizer, "bundled:news", 8, 128, 0)  # the fit quality is irrelevant here
    held = calibration_windows(lm.tokenizer, "bundled:news", 4, 128, 1)
    run = session_fit(lm, args.drop, METHODS, calib, held)
    models = {"dense": lm.model, **{name: r.model for name, r in run.results.items()}}
    windows = evaluation_windows(lm.tokenizer, "bundled:wiki", args.eval_tokens, args.seq_len)
    out = {}

    def evaluate(metrics: bool):
        options = {} if metrics else {"reference": None, "baselines": ()}
        return lambda: out.__setitem__(metrics, perplexities(models, windows, **options))
    times = round_robin({"with metrics": evaluate(True), "plain": evaluate(False)}, args.rounds, warmup=True)
    same = all(out[True][m].nll == out[False][m].nll for m in models)
    cost = ratio(times, "with metrics", "plain")
    rows = [[name, median(t), ratio(times, name, "plain")] for name, t in times.items()]
    body = (f"Bundled SmolLM2-135M without layers {args.drop}: dense + {len(METHODS)} recovered models "
            f"({', '.join(METHODS)}), {windows.input_ids.size(0)} windows x {args.seq_len} tokens of bundled:wiki, "
            f"batch 4, median of {args.rounds} round-robin rounds after a warm-up. Identical perplexities: "
            f"{'yes' if same else 'NO'}.\n\n"
            + table(["shared-prefix evaluation", "seconds (median)", "/ plain"], rows)
            + f"\n\nThe metrics (KL and top-1 agreement against the dense model, per-window sums, bootstrap "
              f"intervals, paired differences) cost **{cost:.3f} x** plain evaluation "
              f"({'within' if cost <= TARGET else 'OVER'} the {TARGET:.2f} x bound).")
    write_section("fidelity_cost", "The cost of intervals and fidelity metrics in shared-prefix evaluation",
                  argv, body)
    return times


if __name__ == "__main__":
    main()

"""Comparing 5 methods: shared-prefix evaluation against evaluating each model on its own.

The bundled model with layers 20-26 removed (a Streamline-like block), recovered by ``none``,
``ghost``, ``replaceme-ls``, ``linearpatch-diag`` and ``linearpatch-rotate``. The five models share
layers 0-18 (layer 19 carries the patches), so ``shared_prefix.perplexities`` runs those once per
batch and then five 4-layer suffixes, where the plain way runs five 23-layer models. The two ways are
timed in turn and their perplexities are checked to be identical.

Command: ``python -m bench.shared_eval [--eval-tokens 2048] [--rounds 2]``.
"""

from __future__ import annotations

import argparse

from bench._common import load_bundled, median, ratio, round_robin, session_fit, table, write_section

from ghosted.models.architecture import head_of, layer_param_count, num_layers
from ghosted.evaluation.shared_prefix import perplexities, shared_prefix_length
from ghosted.data.windows import calibration_windows, evaluation_windows

METHODS = ["none", "ghost", "replaceme-ls", "linearpatch-diag", "linearpatch-rotate"]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval-tokens", type=int, default=2048, help="evaluation tokens (bundled:wiki)")
    p.add_argument("--seq-len", type=int, default=512, help="perplexity window")
    p.add_argument("--drop", default="20-26", help="layers removed")
    p.add_argument("--rounds", type=int, default=2, help="round-robin rounds (median of ratios)")
    args = p.parse_args(argv)
    lm = load_bundled()
    calib = calibration_windows(lm.tokenizer, "bundled:news", 8, 128, 0)  # the fit quality is irrelevant here
    run = session_fit(lm, args.drop, METHODS, calib)
    models = {name: r.model for name, r in run.results.items()}
    windows = evaluation_windows(lm.tokenizer, "bundled:wiki", args.eval_tokens, args.seq_len)
    out = {}

    def evaluate(share: bool):
        return lambda: out.__setitem__(share, perplexities(models, windows, share=share))
    times = round_robin({"shared prefix": evaluate(True), "each on its own": evaluate(False)},
                        args.rounds, warmup=False)
    same = all(out[True][m].nll == out[False][m].nll for m in models)
    k = shared_prefix_length(list(models.values()))
    rows = [[name, median(t), ratio(times, name, "each on its own")] for name, t in times.items()]
    kept = num_layers(lm.model) - len(run.dropped)
    head_layers = head_of(lm.model).weight.numel() / layer_param_count(lm.model, 0)
    layers_only = (k + len(models) * (kept - k)) / (len(models) * kept)
    with_head = (k + len(models) * (kept - k + head_layers)) / (len(models) * (kept + head_layers))
    body = (f"Bundled SmolLM2-135M without layers {args.drop}, {len(models)} models ({', '.join(METHODS)}), "
            f"{windows.input_ids.size(0)} windows x {args.seq_len} tokens of bundled:wiki, batch 4, median of "
            f"{args.rounds} round-robin rounds. Shared prefix: layers 0-{k - 1} ({k} of "
            f"{num_layers(lm.model) - len(run.dropped)} kept layers). Identical perplexities: "
            f"{'yes' if same else 'NO'}.\n\n"
            + table(["evaluation", "seconds (median)", "/ each on its own"], rows)
            + f"\n\nReading: counting layers only, sharing should cost {layers_only:.2f} of separate "
              f"evaluation; but every model still runs the head (its {head_layers:.1f} layers' worth of "
              f"weights, the 49k-token vocabulary) and the loss, which puts the expectation at {with_head:.2f}. "
              "The saving grows with the depth of the shared prefix and the number of models; a drop that "
              "starts at layer 0 or 1 shares nothing and costs the same as separate evaluation.")
    write_section("shared_eval", "Shared-prefix evaluation of 5 methods against separate evaluation", argv, body)
    return times


if __name__ == "__main__":
    main()

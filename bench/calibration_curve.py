"""Calibration size: ``ghost`` and ``ghost-auto`` perplexity against calibration tokens.

The bundled model without layers 12-18, recovered on the first N tokens of the calibration text
(default bundled:wiki, whose calibration part holds about 402k tokens; windows of 128 tokens; the
smaller sets are prefixes of the larger) with the same held-out windows for every size (the last
windows of the largest draw, disjoint from every fit set). The statistics stream, so a larger set
costs forward-pass time, not memory. Every model is scored in one shared-prefix pass
(``shared_prefix.perplexities``) on the evaluation text (default bundled:news, read whole: it is not
the calibration text).

Command: ``python -m bench.calibration_curve [--drop 12-18] [--sizes 2048,...,131072] [--seq-len 128]
[--heldout 8] [--calib bundled:wiki] [--eval bundled:news] [--eval-tokens 4096] [--eval-seq-len 512]``.
"""

from __future__ import annotations

import argparse
import time

from bench._common import load_bundled, session_fit, table, write_reproduction_section

from ghosted.data.windows import TokenWindows, calibration_windows, evaluation_windows, split_calibration
from ghosted.evaluation.shared_prefix import perplexities

METHODS = ["ghost", "ghost-auto"]


def first_windows(windows: TokenWindows, n: int) -> TokenWindows:
    """The first ``n`` windows (a prefix of the calibration draw), with its protocol updated."""
    seq_len = windows.input_ids.size(1)
    return TokenWindows(windows.input_ids[:n], windows.attention_mask[:n],
                        {**windows.protocol, "n_windows": n, "tokens": n * seq_len})


def calibration_tokens(tokenizer, source: str) -> int:
    """Tokens in the calibration part of ``source`` (what bounds the largest size)."""
    from ghosted.data.sources import _part_ids

    return _part_ids(tokenizer, source, "calibration")[0].numel()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drop", default="12-18", help="layers removed")
    p.add_argument("--sizes", default="2048,4096,8192,16384,32768,65536,131072",
                   help="calibration tokens, comma list")
    p.add_argument("--seq-len", type=int, default=128, help="calibration window length")
    p.add_argument("--heldout", type=int, default=8, help="held-out windows (the same for every size)")
    p.add_argument("--calib", default="bundled:wiki", help="calibration text")
    p.add_argument("--eval", default="bundled:news", help="evaluation text")
    p.add_argument("--eval-tokens", type=int, default=4096, help="evaluation tokens scored")
    p.add_argument("--eval-seq-len", type=int, default=512, help="evaluation window length")
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    lm = load_bundled()
    counts = [max(1, s // args.seq_len) for s in sizes]
    available = calibration_tokens(lm.tokenizer, args.calib)
    if (max(counts) + args.heldout) * args.seq_len > available:
        raise SystemExit(f"{args.calib} holds {available:,} calibration tokens: choose smaller --sizes.")
    draw = calibration_windows(lm.tokenizer, args.calib, max(counts) + args.heldout, args.seq_len, 0)
    fit_all, held = split_calibration(draw, args.heldout)
    models, seconds = {}, {}
    for count in counts:
        started = time.perf_counter()
        run = session_fit(lm, args.drop, ["none", *METHODS], first_windows(fit_all, count), held)
        seconds[count] = time.perf_counter() - started
        models.setdefault("none", run.results["none"].model)
        models.update({(m, count): run.results[m].model for m in METHODS})
    windows = evaluation_windows(lm.tokenizer, args.eval, args.eval_tokens, args.eval_seq_len,
                                 calibration_source=args.calib)
    ppl = perplexities({str(k): m for k, m in models.items()}, windows)
    score = lambda key: f"{ppl[str(key)].ppl:.2f}"  # noqa: E731
    rows = [[count * args.seq_len, *[score((m, count)) for m in METHODS], f"{seconds[count]:.0f}"]
            for count in counts]
    body = (f"Bundled SmolLM2-135M without layers {args.drop}; calibration: the first N tokens of a random "
            f"draw of {args.calib} windows of {args.seq_len} (each set a prefix of the next; its calibration part "
            f"holds {available:,} tokens), the same {args.heldout} held-out windows for every size; perplexity "
            f"on {args.eval} ({'its evaluation part' if args.eval == args.calib else 'read whole'}), "
            f"{args.eval_tokens} "
            f"tokens in windows of {args.eval_seq_len}, all models in one shared-prefix pass; float32 on CPU. "
            "No recovery (`none`): "
            f"{score('none')}. \"recover s\" is the wall time of the `recover` call (both passes, every fit) "
            "on a shared 2-core machine.\n\n"
            + table(["calibration tokens", "ghost", "ghost-auto", "recover s"], rows))
    write_reproduction_section("calibration_curve", "Calibration size: perplexity against calibration tokens",
                               argv, body)
    return {k: ppl[str(k)].ppl for k in models}


if __name__ == "__main__":
    main()

"""Calibration size: ``ghost`` and ``ghost-auto`` perplexity against calibration tokens.

The bundled model without layers 12-18, recovered on the first N tokens of bundled:news (windows of
128 tokens; the smaller sets are prefixes of the larger) with the same held-out windows for every
size (the last windows of the largest draw, disjoint from every fit set). The statistics stream, so
a larger set costs forward-pass time, not memory. Every model is scored in one shared-prefix pass
(``shared_eval.perplexities``) on bundled:wiki.

Command: ``python -m bench.calibration_curve [--drop 12-18] [--sizes 2048,8192,32768,57344] [--seq-len 128]
[--heldout 8] [--eval-tokens 4096] [--eval-seq-len 512]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

if __package__ in (None, ""):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ensure_path, load_bundled, table, write_reproduction_section

ensure_path()

from ghosted.pipeline import split_calibration  # noqa: E402
from ghosted.recover import recover  # noqa: E402
from ghosted.shared_eval import perplexities  # noqa: E402
from ghosted.text import TokenWindows, calibration_windows, evaluation_windows  # noqa: E402

METHODS = ["ghost", "ghost-auto"]


def first_windows(windows: TokenWindows, n: int) -> TokenWindows:
    """The first ``n`` windows (a prefix of the calibration draw), with its protocol updated."""
    seq_len = windows.input_ids.size(1)
    return TokenWindows(windows.input_ids[:n], windows.attention_mask[:n],
                        {**windows.protocol, "n_windows": n, "tokens": n * seq_len})


def news_tokens(tokenizer) -> int:
    """Tokens in the calibration part of bundled:news (what bounds the largest size)."""
    from ghosted.text import _part_ids

    return _part_ids(tokenizer, "bundled:news", "calibration")[0].numel()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drop", default="12-18", help="layers removed")
    p.add_argument("--sizes", default="2048,8192,32768,57344", help="calibration tokens, comma list")
    p.add_argument("--seq-len", type=int, default=128, help="calibration window length")
    p.add_argument("--heldout", type=int, default=8, help="held-out windows (the same for every size)")
    p.add_argument("--eval-tokens", type=int, default=4096, help="bundled:wiki tokens scored")
    p.add_argument("--eval-seq-len", type=int, default=512, help="evaluation window length")
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    lm = load_bundled()
    counts = [max(1, s // args.seq_len) for s in sizes]
    available = news_tokens(lm.tokenizer)
    draw = calibration_windows(lm.tokenizer, "bundled:news", max(counts) + args.heldout, args.seq_len, 0)
    fit_all, held = split_calibration(draw, args.heldout)
    models, seconds = {}, {}
    for count in counts:
        started = time.perf_counter()
        run = recover(lm.model, args.drop, ["none", *METHODS], first_windows(fit_all, count), held, show_tqdm=False)
        seconds[count] = time.perf_counter() - started
        models.setdefault("none", run.results["none"].model)
        models.update({(m, count): run.results[m].model for m in METHODS})
    windows = evaluation_windows(lm.tokenizer, "bundled:wiki", args.eval_tokens, args.eval_seq_len,
                                 calibration_source="bundled:news")
    ppl = perplexities({str(k): m for k, m in models.items()}, windows, show_tqdm=False)
    score = lambda key: f"{ppl[str(key)].ppl:.2f}"  # noqa: E731
    rows = [[count * args.seq_len, *[score((m, count)) for m in METHODS], f"{seconds[count]:.0f}"]
            for count in counts]
    body = (f"Bundled SmolLM2-135M without layers {args.drop}; calibration: the first N tokens of a random "
            f"draw of bundled:news windows of {args.seq_len} (each set a prefix of the next), the same "
            f"{args.heldout} held-out windows for every size; perplexity on bundled:wiki, {args.eval_tokens} "
            f"tokens in windows of {args.eval_seq_len}, all models in one shared-prefix pass; float32 on CPU. "
            "No recovery (`none`): "
            f"{score('none')}. \"recover s\" is the wall time of the `recover` call (both passes, every fit) "
            "on a shared 2-core machine. 128k tokens do not fit: the calibration part of bundled:news holds "
            f"{available:,} tokens, so the curve stops at the largest size below that.\n\n"
            + table(["calibration tokens", "ghost", "ghost-auto", "recover s"], rows))
    write_reproduction_section("calibration_curve", "Calibration size: perplexity against calibration tokens",
                               argv, body)
    return {k: ppl[str(k)].ppl for k in models}


if __name__ == "__main__":
    main()

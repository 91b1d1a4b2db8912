"""Calibration time grows with the depth of the deepest layer it needs, not with the model's depth.

The forward pass stops right after the deepest boundary a gap needs (``capture.tap``), so a gap at
layers 3-5 (boundary 6) should cost about 6/27 of a gap at layers 20-26 (boundary 27), plus the
embedding and the statistics, which do not depend on depth. Side by side on the bundled model:
``collect_stats`` for Gap(3, 6), for Gap(20, 27), and a whole-model forward pass.

Command: ``python -m bench.depth [--windows 8] [--seq-len 256] [--rounds 3]``.
"""

from __future__ import annotations

import argparse

from bench._common import load_bundled, median, ratio, round_robin, table, write_section

from bench.calibration_speed import whole_model
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.data.windows import calibration_windows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=8, help="calibration windows")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds (median of ratios)")
    args = p.parse_args(argv)
    lm = load_bundled()
    windows = calibration_windows(lm.tokenizer, "bundled:news", args.windows, args.seq_len, 0)
    cfg = CalibrationConfig(batch_size=args.batch_size)  # every method's statistics
    shallow, deep = Gap(3, 6), Gap(20, 27)
    times = round_robin({
        "gap 3-5 (stops at 6)": lambda: collect_stats(lm.model, windows, [shallow], cfg),
        "gap 20-26 (stops at 27)": lambda: collect_stats(lm.model, windows, [deep], cfg),
        "whole model (30 layers)": lambda: whole_model(lm.model, windows, args.batch_size),
    }, args.rounds)
    deep_name, whole = "gap 20-26 (stops at 27)", "whole model (30 layers)"
    rows = [[name, median(t), ratio(times, name, deep_name), ratio(times, name, whole)] for name, t in times.items()]
    body = (f"Bundled SmolLM2-135M, {args.windows} windows x {args.seq_len} tokens, batch {args.batch_size}, "
            f"every method's statistics, median of {args.rounds} round-robin rounds.\n\n"
            + table(["calibration of", "seconds (median)", "/ gap 20-26", "/ whole model"], rows)
            + f"\n\nReading: layer count alone predicts 6/27 = {6 / 27:.3f} for the shallow gap against the "
              "deep one; the rest is the embedding and the statistics, which cost the same at any depth.")
    write_section("depth", "Calibration time against the depth of the deepest needed layer", argv, body)
    return times


if __name__ == "__main__":
    main()

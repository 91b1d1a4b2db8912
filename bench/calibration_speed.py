"""Calibration time against its limit: a plain forward pass through the same layers.

Calibration runs the model up to the deepest boundary it needs and stops; what it adds on top is
the float64 statistics. Measured side by side on the bundled model, gap [20, 27) (layers 20-26,
the Streamline-like 7-layer block), the same windows for every contender:

  * ``calibrate (ghost only)``: ``collect_stats`` with only XᵀX, XᵀΔ (what ``ghost`` needs);
  * ``calibrate (all methods)``: plus ReplaceMe's MLP sums and token reservoir, LinearPatch ratios;
  * ``forward to layer 27``: the same layers with no statistics (``capture.tap``, stops early);
  * ``whole model``: an ordinary forward pass with logits.

Command: ``python -m bench.calibration_speed [--windows 8] [--seq-len 256] [--rounds 3]``.
"""

from __future__ import annotations

import argparse

from bench._common import load_bundled, median, ratio, round_robin, table, write_section

import torch

from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.models.capture import tap
from ghosted.data.windows import calibration_windows

GHOST_ONLY = CalibrationConfig(replaceme=False, linearpatch=False, reservoir_tokens=0)  # XᵀX, XᵀΔ only


def forward_to(model, windows, boundary: int, batch_size: int) -> None:
    """A plain forward pass that stops at ``boundary`` (what calibration cannot beat)."""
    with tap(model, boundaries=[boundary]) as t:
        for start in range(0, windows.input_ids.size(0), batch_size):
            t.run(windows.input_ids[start:start + batch_size], windows.attention_mask[start:start + batch_size])


@torch.no_grad()
def whole_model(model, windows, batch_size: int) -> None:
    """An ordinary forward pass through every layer, norm and head."""
    for start in range(0, windows.input_ids.size(0), batch_size):
        model(input_ids=windows.input_ids[start:start + batch_size],
              attention_mask=windows.attention_mask[start:start + batch_size], use_cache=False)


def contenders(model, windows, gap: Gap, batch_size: int) -> dict:
    """The four things timed, in round-robin order."""
    all_cfg = CalibrationConfig(batch_size=batch_size)
    ghost_cfg = CalibrationConfig(**{**GHOST_ONLY.__dict__, "batch_size": batch_size})
    return {
        "calibrate (ghost only)": lambda: collect_stats(model, windows, [gap], ghost_cfg),
        "calibrate (all methods)": lambda: collect_stats(model, windows, [gap], all_cfg),
        f"forward to layer {gap.end}": lambda: forward_to(model, windows, gap.end, batch_size),
        "whole model": lambda: whole_model(model, windows, batch_size),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=8, help="calibration windows")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds (median of ratios)")
    args = p.parse_args(argv)
    lm = load_bundled()
    windows = calibration_windows(lm.tokenizer, "bundled:news", args.windows, args.seq_len, 0)
    gap = Gap(20, 27)
    times = round_robin(contenders(lm.model, windows, gap, args.batch_size), args.rounds)
    limit, whole = f"forward to layer {gap.end}", "whole model"
    rows = [[name, median(t), ratio(times, name, limit), ratio(times, name, whole)] for name, t in times.items()]
    body = (f"Bundled SmolLM2-135M (30 layers, d = 576, float32), gap [20, 27), {args.windows} windows x "
            f"{args.seq_len} tokens, batch {args.batch_size}, median of {args.rounds} round-robin rounds.\n\n"
            + table(["contender", "seconds (median)", f"/ forward to layer {gap.end}", "/ whole model"], rows)
            + "\n\nReading: the first ratio is calibration's overhead over the forward pass it cannot avoid "
              "(1.0 would be free statistics); the second compares it with one ordinary pass of the whole "
              "model, which calibration never needs (it stops after layer 26 and computes no logits).")
    write_section("calibration_speed", "Calibration time against a forward pass", argv, body)
    return times


if __name__ == "__main__":
    main()

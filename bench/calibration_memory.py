"""Peak memory of calibration against the calibration size (1x, 4x, 16x): it must stay flat.

Each (contender, size) runs in a fresh process that loads and warms up the model, then resets its
peak-RSS mark and reports how far resident memory rose during calibration (``measured``). Contenders:
  * ``ghosted, ghost statistics``: float64 XᵀX, XᵀΔ only; nothing grows with the token count;
  * ``ghosted, every sum``: the statistics of every closed-form method (ghost, ReplaceMe-LS,
    LinearPatch diagonal and rotated): d x d and d-sized float64 sums only;
  * ``ghosted, all methods``: plus ReplaceMe's token reservoir for the cosine fit, a uniform sample
    of at most ``reservoir_tokens`` rows (16,384 by default: up to 2 x 16,384 x d float32), so it
    grows until that cap and is flat beyond it;
  * ``official approach`` (``bench.reference_official``): every token of both boundaries stacked,
    for contrast: it grows linearly.
Base size: ``--windows`` windows of ``--seq-len`` tokens (at least one batch, so the batch shape,
and with it the activation memory of one forward pass, is the same at every size).

Command: ``python -m bench.calibration_memory [--windows 4] [--seq-len 128]``.
"""

from __future__ import annotations

import argparse

from bench._common import in_child, load_bundled, measured, table, write_section

from bench.reference_official import official_ghost_operator
from ghosted.calibration.collect import CalibrationConfig, Gap, collect_stats
from ghosted.data.windows import calibration_windows

GAP = Gap(20, 27)
SIZES = (1, 4, 16)  # multiples of the base calibration size
CONTENDERS = ("ghosted, ghost statistics", "ghosted, every sum", "ghosted, all methods", "official approach")


def contenders(model) -> dict:
    """name -> fn(windows), each returning nothing large (only the peak matters)."""
    ghost_cfg = CalibrationConfig(replaceme=False, linearpatch=False, reservoir_tokens=0)
    sums_cfg = CalibrationConfig(reservoir_tokens=0)
    all_cfg = CalibrationConfig()

    def ours(cfg):
        return lambda w: collect_stats(model, w, [GAP], cfg) and None
    return {"ghosted, ghost statistics": ours(ghost_cfg), "ghosted, every sum": ours(sums_cfg),
            "ghosted, all methods": ours(all_cfg),
            "official approach": lambda w: official_ghost_operator(model, w, GAP.start, GAP.end) is None}


def job(contender: str, n_windows: int, seq_len: int) -> float:
    """In a fresh process: peak RSS growth (MiB) of one contender on the first ``n_windows`` windows."""
    lm = load_bundled()
    windows = calibration_windows(lm.tokenizer, "bundled:news", n_windows, seq_len, 0)
    fn = contenders(lm.model)[contender]
    return measured(lambda: fn(windows))[0]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=4, help="windows at size 1x (>= the batch size, 4)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per window")
    args = p.parse_args(argv)
    peaks: dict[str, dict[int, float]] = {}
    for name in CONTENDERS:
        for size in SIZES:
            peaks.setdefault(name, {})[size] = in_child(job, name, args.windows * size, args.seq_len)
    rows = [[name, *(by_size[s] for s in SIZES), by_size[max(SIZES)] / by_size[1]] for name, by_size in peaks.items()]
    tokens = args.windows * args.seq_len
    body = (f"Bundled SmolLM2-135M, gap [20, 27), 1x = {args.windows} windows x {args.seq_len} tokens "
            f"({tokens} tokens), batch 4; peak RSS growth in MiB, one fresh process per cell.\n\n"
            + table(["contender", *(f"{s}x ({s * tokens} tokens)" for s in SIZES), "16x / 1x"], rows)
            + "\n\nReading: a ratio of 1 is flat. Ghost statistics hold the activations of one batch plus "
              "d x d float64 sums, whatever the size; so do the sums of every closed-form method (ghost, "
              "ReplaceMe-LS, LinearPatch). With all methods, ReplaceMe-cosine's token reservoir "
              "grows with the tokens seen up to its cap (16,384 rows of m and Δ + m in float32: 72 MiB at "
              "d = 576; it grows by concatenation, so its peak is briefly twice that), then stays flat. "
              "The official approach keeps every token of both boundaries, and float64 copies of them.")
    write_section("calibration_memory", "Peak memory of calibration against calibration size", argv, body)
    return peaks


if __name__ == "__main__":
    main()

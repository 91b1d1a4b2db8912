"""Low-rank ghost: perplexity against rank, from one calibration.

The bundled model without layers 12-18, recovered by ``ghost-lowrank`` at ranks 8, 16, 32, 64, 128,
d/2 and d (plus ``none`` and the full ``ghost`` for reference), all fitted on the same statistics:
the first ``recover`` call computes them into a temporary statistics cache and every other rank
reuses them (one calibration pass). Every model is scored in one shared-prefix pass
(``shared_prefix.perplexities``). "parameters added" counts the operator's parameters: 2·d·R per gap
for a rank-R ghost, d² for ``ghost``. At R = d the low-rank optimum is the full ghost fit.

Command: ``python -m bench.rank_curve [--drop 12-18] [--calib-seqs 32] [--seq-len 128] [--heldout 8]
[--eval-tokens 4096] [--eval-seq-len 512]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench._common import load_bundled, session_fit, table, write_reproduction_section

from ghosted.data.windows import calibration_windows, evaluation_windows, split_calibration
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.calibration.cache import StatsCache


def curve_ranks(dim: int) -> list[int]:
    """8, 16, 32, 64, 128, d/2, d (those below d, in order, without repeats)."""
    return sorted({r for r in (8, 16, 32, 64, 128, dim // 2, dim) if 0 < r <= dim})


def parameters_added(model, pruned) -> int:
    """Parameters ``model`` holds beyond the pruned model (its operators)."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return count(model) - count(pruned)


def fit_curve(lm, drop: str, fit, held, ranks: list[int]) -> dict:
    """{label: recovered model} for none, ghost and every rank, from one statistics pass."""
    folder = Path(tempfile.mkdtemp(prefix="ghosted-rank-curve-"))
    try:
        cache = StatsCache(folder)
        base = session_fit(lm, drop, ["none", "ghost"], fit, held, cache=cache)
        models = {"none": base.results["none"].model, "ghost": base.results["ghost"].model}
        for rank in ranks:
            run = session_fit(lm, drop, ["ghost-lowrank"], fit, held, cache=cache, rank=rank)
            assert run.statistics == {"calibration": "reused", "held-out": "reused"}, run.statistics
            models[f"rank {rank}"] = run.results["ghost-lowrank"].model
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return models


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drop", default="12-18", help="layers removed")
    p.add_argument("--calib-seqs", type=int, default=32, help="calibration windows fitted")
    p.add_argument("--heldout", type=int, default=8, help="held-out calibration windows")
    p.add_argument("--seq-len", type=int, default=128, help="calibration window length")
    p.add_argument("--eval-tokens", type=int, default=4096, help="bundled:wiki tokens scored")
    p.add_argument("--eval-seq-len", type=int, default=512, help="evaluation window length")
    args = p.parse_args(argv)
    started = time.perf_counter()
    lm = load_bundled()
    dim = lm.model.config.hidden_size
    calib = calibration_windows(lm.tokenizer, "bundled:news", args.calib_seqs + args.heldout, args.seq_len, 0)
    fit, held = split_calibration(calib, args.heldout)
    models = fit_curve(lm, args.drop, fit, held, curve_ranks(dim))
    windows = evaluation_windows(lm.tokenizer, "bundled:wiki", args.eval_tokens, args.eval_seq_len,
                                 calibration_source="bundled:news")
    ppl = perplexities(models, windows)
    pruned = models["none"]
    rows = [[label, parameters_added(m, pruned), f"{ppl[label].ppl:.2f}"] for label, m in models.items()]
    body = (f"Bundled SmolLM2-135M (d = {dim}) without layers {args.drop}, one operator for the gap; "
            f"calibration {args.calib_seqs} x {args.seq_len} tokens of bundled:news plus {args.heldout} "
            f"held-out windows, computed once and reused by every rank (statistics cache); perplexity on "
            f"bundled:wiki, {args.eval_tokens} tokens in windows of {args.eval_seq_len}, every model in one "
            f"shared-prefix pass; float32 on CPU; {time.perf_counter() - started:.0f} s in all.\n\n"
            + table(["model", "parameters added", "perplexity"], rows)
            + "\n\nReading: `rank R` is the best rank-R M of W = I + M under the ghost's least-squares "
              "objective (reduced-rank regression), stored as two factors, 2·d·R parameters; at R = d it is "
              "the ghost fit itself (d² parameters would be stored densely; the factors hold 2·d²). A rank below d "
              "can score better than the full fit: truncating M drops "
              "the directions least supported by the calibration text, a regularisation that helps when "
              "calibration (news) and evaluation (wiki) differ.")
    write_reproduction_section("rank_curve", "Low-rank ghost: perplexity against rank", argv, body)
    return {label: ppl[label].ppl for label in models}


if __name__ == "__main__":
    main()

"""The cost model's estimates against measured peaks: each request's estimated memory beside the rise of
resident memory while it runs, on a real-shaped random model and on the bundled model.

    python -m bench.cost            # writes docs/results/bench/cost.json and its section of docs/BENCHMARKS.md
    python -m bench.cost --quick    # the random model only (seconds), printed, nothing written

Each measurement runs in a fresh process (``in_child``), whose C library maps and unmaps every large block
on its own, so the peak of resident memory follows the tensors alive; the weights are loaded before the
mark is reset (they are shared by every job and not part of a job's estimate).
"""

from __future__ import annotations

import argparse
import sys

from bench._common import in_child, measured, save_section

SIZES = {  # request size -> (eval_tokens, eval_seq_len, fit seq_len)
    "small": (1024, 128, 64), "medium": (2048, 512, 128), "large": (4096, 1024, 256)}
MARGIN_MIB = 48  # the estimate may sit this far below a measured peak (interpreter, allocator slack)


def map_large_blocks() -> None:
    """In this process, map and unmap every block of 128 KiB and more on its own (as ``in_child`` sets up a
    child), so that resident memory follows the tensors alive and a measured peak means something."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 131072)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 131072)  # M_TRIM_THRESHOLD


def real_shaped(layers: int = 4, width: int = 256, vocab: int = 32000):
    """A random Llama with a real vocabulary (its logits cost what a real model's do) and the character
    tokenizer of the tiny tests, as a LoadedModel."""
    import torch
    import transformers as tf

    from ghosted.models.loading import LoadedModel
    from tests.tiny import CharTokenizer

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=2 * width + width // 2,
                            max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = tf.AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    return LoadedModel(model, CharTokenizer(), "real-shaped", "folder", "cpu", "float32", 0.0)


def requests(size: str, layers: int):
    """The fit and the evaluation of one request size, dropping the second half of the layers but the last."""
    from ghosted.service import workbench as wb

    tokens, window, seq_len = SIZES[size]
    fit = wb.FitRequest(layers=tuple(range(layers // 2, layers - 1)), calib_seqs=8, seq_len=seq_len,
                        heldout_seqs=2, methods=("ghost",))
    return fit, wb.EvalRequest(fit=fit, eval_tokens=tokens, eval_seq_len=window)


def measure(model: str, size: str) -> dict:
    """In a child: the estimated and the measured peak (MiB) of a fit and of an evaluation of ``size``."""
    import torch

    from ghosted.service.cost import Shape, estimate

    torch.set_num_threads(1)
    lm = real_shaped() if model == "real-shaped" else _bundled()
    shape = Shape.of(lm.model)
    fit, evaluation = requests(size, shape.layers)
    with torch.no_grad():  # page the weights in first: a memory-mapped checkpoint is read on first use
        lm.model(input_ids=torch.tensor([[1, 2, 3]]))
    fit_peak, _, fitted = measured(lambda: fit.compute(lm))
    eval_peak, _, _ = measured(lambda: evaluation.compute(lm, fitted))
    return {"model": model, "size": size, "fit": (estimate(fit, shape).bytes / 2**20, fit_peak),
            "evaluate": (estimate(evaluation, shape, refit=False).bytes / 2**20, eval_peak)}


def measure_evaluation(window: int, windows: int, batch: int) -> tuple[float, float]:
    """In a child: (estimated, measured peak) MiB of an evaluation of ``windows`` windows of ``window`` tokens,
    ``batch`` at a time, on the random model of a real vocabulary (a fresh process: no other thread's memory)."""
    import dataclasses

    import torch

    from ghosted.service import workbench as wb
    from ghosted.service.cost import Shape, estimate

    torch.set_num_threads(1)
    lm = real_shaped()
    fit = wb.FitRequest(model="real", layers=(2,), calib_seqs=4, seq_len=64, heldout_seqs=2, methods=("ghost",),
                        batch_size=batch)
    fitted = fit.compute(lm)
    request = wb.EvalRequest(fit=dataclasses.replace(fit, batch_size=batch), eval_tokens=window * windows,
                             eval_seq_len=window)
    peak, _, _ = measured(lambda: request.compute(lm, fitted))
    return estimate(request, Shape.of(lm.model), refit=False).bytes / 2**20, peak


def _bundled():
    from ghosted.models.assets import BUNDLED_MODEL
    from ghosted.operators.checkpoint import load_any

    return load_any(BUNDLED_MODEL, dtype="float32", device="cpu")


def budgets() -> str:
    """docs/DEPLOY.md's table of the per-job and per-visitor budgets of each restricted deployment (from
    ``ghosted.service.deploy``), with the estimates of the pages' defaults and of refused requests on the
    bundled model's shape (``ghosted.service.cost``), so the page says what a visitor can and cannot cause."""
    from ghosted.service import workbench as wb
    from ghosted.service.cost import Shape, estimate
    from ghosted.service.deploy import CLASSROOM, DEMO

    rows = ["| deployment | per job: memory | per job: compute | per visitor: memory | per visitor: jobs | "
            "prompts x characters | 2 workers at the job budget |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cfg in (DEMO, CLASSROOM):
        rows.append(f"| {cfg.name} | {cfg.max_job_gb:g} GB | {cfg.max_job_tflop:g} TFLOP | {cfg.max_visitor_gb:g} GB | "
                    f"{cfg.max_visitor_jobs} | {cfg.max_prompts} x {cfg.max_prompt_chars:,} | "
                    f"{2 * cfg.max_job_gb:g} GB |")
    shape = Shape(layers=30, width=576, ffn=1536, vocab=49152, heads=9, kv_width=192, positions=8192)  # SmolLM2
    fit = wb.FitRequest(layers=tuple(range(20, 26)))
    cases = [("the Influence page's default report", wb.InfluenceRequest()),
             ("the Recover page's default run (6 layers, 3 methods)", fit),
             ("the Compare page's default evaluation (4,096 tokens in 512)", wb.EvalRequest(fit=fit)),
             ("8,192 evaluation tokens in windows of 512", wb.EvalRequest(fit=fit, eval_tokens=8192)),
             ("8,192 evaluation tokens in windows of 2,048", wb.EvalRequest(fit=fit, eval_tokens=8192,
                                                                             eval_seq_len=2048)),
             ("14 gaps, sequential, 11 methods", wb.FitRequest(layers=tuple(range(0, 28, 2)), ghost_mode="sequential",
                                                               methods=tuple(f"m{i}" for i in range(11))))]
    rows += ["", "| request on the bundled model | estimated memory | estimated compute |", "|---|---:|---:|"]
    for what, request in cases:
        cost = estimate(request, shape)
        rows.append(f"| {what} | {cost.gb:,.2f} GB | {cost.tflop:,.1f} TFLOP |")
    return "\n".join(rows)


def table(rows: list[dict]) -> str:
    lines = ["| model | request size | job | estimate (MiB) | measured peak (MiB) | estimate / measured |",
             "|---|---|---|---:|---:|---:|"]
    for row in rows:
        tokens, window, seq_len = SIZES[row["size"]]
        for job in ("fit", "evaluate"):
            est, peak = row[job]
            what = f"{job} ({'8+2 windows x ' + str(seq_len) if job == 'fit' else f'{tokens} tokens in {window}'})"
            lines.append(f"| {row['model']} | {row['size']} | {what} | {est:,.0f} | {peak:,.0f} | "
                         f"{est / max(peak, 1):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the random model only, printed, nothing written")
    args = parser.parse_args(argv)
    models = ["real-shaped"] if args.quick else ["real-shaped", "bundled"]
    rows = [in_child(measure, model, size) for model in models for size in SIZES]
    body = (f"{table(rows)}\n\nEstimates from `ghosted.service.cost.estimate` (the weights, shared by every job, "
            f"are not counted); measured: the rise of resident memory over the job in a fresh process. The "
            f"estimate may sit at most {MARGIN_MIB} MiB below the measure (tests/unit/service/test_cost.py).")
    if args.quick:
        print(body)
        return
    save_section("bench", "cost", "Cost model: estimated against measured peak memory", argv, body)


if __name__ == "__main__":
    main(sys.argv[1:])

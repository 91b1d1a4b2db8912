"""Peak memory and time of one experiment on a model read whole, layer by layer, or offloaded to disk.

The benchmark writes a random-init Llama of a real shape to a temporary folder (safetensors shards with an
index, shard by shard, never the whole model in memory; 32 layers x 1024, ffn 4096, vocabulary 32,000 in
float32 is 2.4 GB by default), then runs the same experiment three ways, each in a fresh process:

  * ``whole model``: ``from_pretrained`` into memory, as ``ghosted run`` does;
  * ``layer-wise``: ``LazyModel`` (``--layerwise``): each decoder layer read from the shards while it runs;
  * ``disk offload``: accelerate's ``device_map`` with every decoder layer on ``disk`` and an offload folder
    (``--device-map`` with ``--offload-folder``), which moves each layer in again for every batch.

The experiment: calibration statistics of one gap (ghost sums) and the perplexity, KL and top-1 of the dense
and the pruned model, on ``--windows`` windows of ``--seq-len`` random tokens. Peak memory is the resident
set's growth above the imports (loading included); time is wall-clock, loading included, with the shards in
the page cache (they were just written and are read once before the first contender). The disk's read
speed (``O_DIRECT``, past the page cache, where the file system allows it) stands beside them.

Command: ``python -m bench.layerwise [--layers 32 --hidden 1024 --ffn 4096 --vocab 32000] [--windows 4]``
(``--layers 4 --hidden 256 --ffn 1024 --vocab 4096`` for a run of seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench._common import ROOT, in_child, measured, table, write_section

CONTENDERS = ("whole model", "layer-wise", "disk offload")
SHARD_BYTES = 512 * 2**20  # shards of at most this size, as hub checkpoints are cut


def write_random_llama(folder: Path, layers: int, hidden: int, ffn: int, vocab: int, seed: int = 0) -> int:
    """A random-init Llama checkpoint in ``folder`` (config, shards, index); returns its bytes of weights.

    Tensors are made and written one shard at a time (float32, normal(0, 0.02), norms 1)."""
    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    heads = max(1, hidden // 64)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=4096, tie_word_embeddings=False)
    with init_empty_weights():
        skeleton = AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    weight_map, shard, size, total, files = {}, {}, 0, 0, []

    def flush():
        nonlocal shard, size
        if shard:
            name = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            files.append(name)
            weight_map.update(dict.fromkeys(shard, name))
            shard, size = {}, 0

    for name, param in skeleton.named_parameters():
        nbytes = param.numel() * 4
        if size + nbytes > SHARD_BYTES:
            flush()
        is_norm = name.endswith("norm.weight")
        shard[name] = torch.ones(param.shape) if is_norm else torch.randn(param.shape, generator=gen) * 0.02
        size, total = size + nbytes, total + nbytes
    flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def read_speed(folder: Path) -> tuple[float, float]:
    """(MB/s reading the shards through the page cache, MB/s with O_DIRECT past it; nan if not allowed)."""
    files = sorted(folder.glob("*.safetensors"))
    started, total = time.perf_counter(), 0
    for file in files:
        with file.open("rb") as handle:
            while chunk := handle.read(64 * 2**20):
                total += len(chunk)
    cached = total / 1e6 / (time.perf_counter() - started)
    try:
        fd = os.open(files[0], os.O_RDONLY | os.O_DIRECT)
    except (OSError, AttributeError):
        return cached, math.nan
    buffer, total = mmap.mmap(-1, 16 * 2**20), 0  # page-aligned, as O_DIRECT requires
    started = time.perf_counter()
    try:
        while (n := os.readv(fd, [buffer])) > 0:
            total += n
    except OSError:
        return cached, math.nan
    finally:
        os.close(fd)
    return cached, total / 1e6 / (time.perf_counter() - started)


def _experiment(model, windows, gap, batch: int) -> dict:
    from ghosted.calibration.collect import CalibrationConfig, collect_stats
    from ghosted.evaluation.shared_prefix import perplexities
    from ghosted.models.pruning import prune

    cfg = CalibrationConfig(batch_size=batch, replaceme=False, linearpatch=False, reservoir_tokens=0)
    stats = collect_stats(model, windows, [gap], cfg)[gap]
    scored = perplexities({"dense": model, "none": prune(model, gap.layers)}, windows, batch_size=batch)
    return {"xtd_trace": float(stats.xtd.trace()), "ppl_dense": scored["dense"].ppl, "ppl_none": scored["none"].ppl,
            "kl_none": scored["none"].summary["kl"]}


def job(contender: str, folder: str, windows: int, seq_len: int, batch: int, gap: tuple[int, int]) -> dict:
    """In a fresh process: (peak RSS growth MiB, seconds, the experiment's numbers) of one contender."""
    import torch
    from transformers import AutoModelForCausalLM

    from ghosted.calibration.collect import Gap
    from ghosted.data.windows import TokenWindows
    from ghosted.models.lazy import LazyModel

    import transformers.models.llama.modeling_llama  # noqa: F401 (imported before the measurement, by every contender)

    import ghosted.evaluation.shared_prefix  # noqa: F401

    torch.set_grad_enabled(False)
    config = json.loads((Path(folder) / "config.json").read_text())
    ids = torch.randint(3, config["vocab_size"], (windows, seq_len), generator=torch.Generator().manual_seed(0))
    data = TokenWindows(ids, torch.ones_like(ids), {"source": "random", "n_windows": windows, "seq_len": seq_len})
    offload = tempfile.mkdtemp(prefix="ghosted-offload-")
    extra = {}

    def run():
        if contender == "layer-wise":
            lazy = LazyModel(folder)
            out = _experiment(lazy.model, data, Gap(*gap), batch)
            extra.update(read_gb=lazy.bytes_read / 1e9)
            return out
        if contender == "whole model":
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        else:
            device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu",
                          **{f"model.layers.{i}": "disk" for i in range(config["num_hidden_layers"])}}
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, device_map=device_map,
                                                         offload_folder=offload)
        model.eval()
        return _experiment(model, data, Gap(*gap), batch)

    try:
        peak, seconds, numbers = measured(run)
    finally:
        shutil.rmtree(offload, ignore_errors=True)
    return {"peak_mib": peak, "seconds": seconds, **numbers, **extra}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--windows", type=int, default=4, help="evaluation and calibration windows")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three contenders in turn")
    p.add_argument("--folder", default=None, help="where to write the checkpoint (default: a temporary folder, "
                                                  "removed at the end)")
    args = p.parse_args(argv)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="ghosted-layerwise-"))
    try:
        nbytes = write_random_llama(folder, args.layers, args.hidden, args.ffn, args.vocab)
        cached, direct = read_speed(folder)
        gap = (args.layers // 2, args.layers // 2 + max(1, args.layers // 8))
        rounds = [{name: in_child(job, name, str(folder), args.windows, args.seq_len, args.batch_size, gap)
                   for name in CONTENDERS} for _ in range(args.rounds)]  # in turn: load drift hits each alike
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    results = {name: {**rounds[0][name], **{key: statistics.median(r[name][key] for r in rounds)
                                            for key in ("peak_mib", "seconds")}} for name in CONTENDERS}
    for name in CONTENDERS:  # same-round ratios, their median
        for key in ("peak_mib", "seconds"):
            results[name][f"{key}_ratio"] = statistics.median(r[name][key] / r["whole model"][key] for r in rounds)
    rows = [[name, r["peak_mib"], r["peak_mib_ratio"], r["seconds"], r["seconds_ratio"],
             f"{r['ppl_dense']:.4f}", f"{r['ppl_none']:.4f}"] for name, r in results.items()]
    lw = results["layer-wise"]
    body = (f"Random-init Llama, {args.layers} layers x {args.hidden}, ffn {args.ffn}, vocabulary {args.vocab}, "
            f"float32: {nbytes / 1e9:.2f} GB of weights in safetensors shards. Experiment: ghost statistics of gap "
            f"[{gap[0]}, {gap[1]}) and perplexity + KL of dense and pruned on {args.windows} windows x "
            f"{args.seq_len} random tokens, batch {args.batch_size}; loading included; one fresh process per "
            f"contender and round, {args.rounds} rounds in turn, medians (ratios: the median of same-round ratios); "
            "shards in the page cache.\n\n"
            + table(["contender", "peak RSS above imports (MiB)", "x whole", "seconds", "x whole", "ppl dense",
                     "ppl pruned"], rows)
            + f"\n\nRead speed of the shards: {cached:,.0f} MB/s through the page cache, "
            + (f"{direct:,.0f} MB/s from the disk (O_DIRECT)" if math.isfinite(direct) else
               "O_DIRECT not allowed on this file system")
            + f". The layer-wise run read {lw['read_gb']:.2f} GB ({lw['read_gb'] / nbytes * 1e9:.1f} times the "
              "weights: calibration stops after the gap, perplexity reads every layer once for both variants; "
              "safetensors maps the shards, so the pages are read while the layer runs).\n\n"
              "Reading: layer-wise holds one decoder layer, the embedding or the head, the streams of the "
              "windows and the statistics; the whole model holds every weight. Disk offload holds little too "
              "but reads every offloaded layer again for each batch of each pass. The perplexities agree to the "
              "digits shown: one experiment, three ways to hold the weights.")
    write_section("layerwise", "Layer-wise execution against the whole model and disk offload", argv, body)
    numbers = {"layers": args.layers, "hidden": args.hidden, "ffn": args.ffn, "vocab": args.vocab,
               "windows": args.windows, "seq_len": args.seq_len, "batch": args.batch_size, "weights_bytes": nbytes,
               "read_mb_s": {"page_cache": cached, "disk": direct if math.isfinite(direct) else None},
               "predicted_peak_bytes": predicted_peak(args), "contenders": results}
    NUMBERS.write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    from ghosted.core.docblocks import markers, write_block

    write_block(SCALE_DOC, *markers("scale:layerwise"), scale_block(numbers))
    return results


NUMBERS = ROOT / "docs" / "results" / "layerwise.json"  # the measured figures docs/SCALE.md's plan is computed from
SCALE_DOC = ROOT / "docs" / "SCALE.md"
GIB = 2**30
SHAPES = {  # name -> (layers, d, ffn, vocabulary, kv width): the configs of the released checkpoints
    "Llama-3.1-8B": (32, 4096, 14336, 128256, 1024),
    "Llama-3.1-70B": (80, 8192, 28672, 128256, 1024),
}


def _peak(layer: int, outer: int, streams: int, stats: int, logits: int) -> int:
    """What a layer-wise pass holds at its peak: one layer, the embedding or the head, the streams, the sums."""
    return layer + outer + streams + stats + logits


def predicted_peak(args) -> int:
    """The peak the formula gives for this run's perplexity pass (two variants), float32."""
    from ghosted.evaluation.layerwise import LOGITS_BUDGET, _COPIES
    from ghosted.models.memory_plan import batch_stream_bytes

    heads = max(1, args.hidden // 64)
    kv = max(1, heads // 2) * 64
    layer = 4 * (2 * args.hidden * args.hidden + 2 * args.hidden * kv + 3 * args.hidden * args.ffn)
    streams = batch_stream_bytes(args.batch_size, args.seq_len, args.hidden, torch_float32(), 2)
    streams *= -(-args.windows // args.batch_size)
    logits = min(LOGITS_BUDGET, args.batch_size * args.seq_len * args.vocab * 4 * _COPIES)
    return _peak(layer, 4 * args.vocab * args.hidden, streams, 0, logits)


def torch_float32():
    import torch

    return torch.float32


def scale_block(numbers: dict) -> str:
    """docs/SCALE.md's layer-wise plan: the measured run, then 8B and 70B on paper from the same formula."""
    from ghosted.evaluation.layerwise import LOGITS_BUDGET
    from ghosted.models.memory_plan import batch_stream_bytes

    import torch

    runs = numbers["contenders"]
    measured_mib, predicted_mib = runs["layer-wise"]["peak_mib"], numbers["predicted_peak_bytes"] / 2**20
    disk = numbers["read_mb_s"]["disk"] or numbers["read_mb_s"]["page_cache"]
    rows, peaks = [], {}
    for name, (layers, d, ffn, vocab, kv) in SHAPES.items():
        layer = 2 * (2 * d * d + 2 * d * kv + 3 * d * ffn)  # bfloat16
        outer = 2 * vocab * d
        read = layers * layer + 2 * outer
        stream = batch_stream_bytes(1, 2048, d, torch.bfloat16, 0)  # one (1, 2048, d) stream
        calib = _peak(layer, outer, 32 * stream * 5, 3 * d * d * 8, 0)  # x, y, X kept, output; XᵀX, XᵀΔ, ΔᵀΔ
        evaluation = _peak(layer, outer, 32 * stream * 4, 0, LOGITS_BUDGET)  # dense, pruned, ghost + output
        peaks[name] = (calib, evaluation)
        rows.append([name, f"{layer / GIB:.2f}", f"{outer / GIB:.2f}", f"{calib / GIB:.1f}", f"{evaluation / GIB:.1f}",
                     f"{read / 1e9:.0f}", f"{read / 1e6 / disk:,.0f}"])
    whole = runs["whole model"]
    worst = max(peaks["Llama-3.1-70B"]) / 1e9
    fits = (f"At its peak a 70B run holds {worst:.1f} GB: it fits one 24 GB GPU." if worst < 24 else
            f"At its peak a 70B run holds {worst:.1f} GB: more than one 24 GB GPU, so use fewer windows per group.")
    return (f"Measured (`python -m bench.layerwise`, docs/results/layerwise.json): a {numbers['layers']}-layer "
            f"random-init Llama of width {numbers['hidden']} ({numbers['weights_bytes'] / 1e9:.2f} GB float32) ran "
            f"layer by layer in {measured_mib:,.0f} MiB above the imports against {whole['peak_mib']:,.0f} MiB whole "
            f"({runs['layer-wise']['peak_mib_ratio']:.2f} x), in {runs['layer-wise']['seconds_ratio']:.2f} x "
            f"the whole model's time (disk offload: {runs['disk offload']['seconds_ratio']:.2f} x); the formula "
            f"below gives {predicted_mib:,.0f} MiB for that run "
            f"(measured / formula = {measured_mib / predicted_mib:.2f}). "
            f"Disk read speed there: {disk:,.0f} MB/s.\n\n"
            "On paper, bfloat16, calibration of one gap on 32 windows x 2048 tokens (batch 1) and perplexity of "
            "three variants (dense, pruned, ghost) on 32 windows x 2048:\n\n"
            + table(["model", "one layer (GiB)", "embedding or head (GiB)", "calibration peak (GiB)",
                     "perplexity peak (GiB)", "read per pass (GB)", f"seconds to read a pass at {disk:,.0f} MB/s"],
                    rows)
            + "\n\nPeak = one layer + the embedding or the head + the streams of every window at the current "
              "layer (per variant whose stream differs, the stream kept at an open gap, and the output being built) "
              "+ the float64 sums (3 d x d per gap) + the logits of one chunk of positions "
              f"({LOGITS_BUDGET / 2**20:.0f} MiB). {fits} Past the stream budget the windows go through in groups, "
              "each reading the layers again (`--dry-run` prints the plan); reading time is the disk's alone, the "
              "compute of the layers comes on top of it.")


if __name__ == "__main__":
    main()

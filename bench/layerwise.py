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
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ensure_path, in_child, measured, table, write_section

ensure_path()

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
    p.add_argument("--folder", default=None, help="where to write the checkpoint (default: a temporary folder, "
                                                  "removed at the end)")
    args = p.parse_args(argv)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="ghosted-layerwise-"))
    try:
        nbytes = write_random_llama(folder, args.layers, args.hidden, args.ffn, args.vocab)
        cached, direct = read_speed(folder)
        gap = (args.layers // 2, args.layers // 2 + max(1, args.layers // 8))
        results = {name: in_child(job, name, str(folder), args.windows, args.seq_len, args.batch_size, gap)
                   for name in CONTENDERS}
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    whole = results["whole model"]
    rows = [[name, r["peak_mib"], r["peak_mib"] / whole["peak_mib"], r["seconds"], r["seconds"] / whole["seconds"],
             f"{r['ppl_dense']:.4f}", f"{r['ppl_none']:.4f}"] for name, r in results.items()]
    lw = results["layer-wise"]
    body = (f"Random-init Llama, {args.layers} layers x {args.hidden}, ffn {args.ffn}, vocabulary {args.vocab}, "
            f"float32: {nbytes / 1e9:.2f} GB of weights in safetensors shards. Experiment: ghost statistics of gap "
            f"[{gap[0]}, {gap[1]}) and perplexity + KL of dense and pruned on {args.windows} windows x "
            f"{args.seq_len} random tokens, batch {args.batch_size}; loading included; one fresh process per "
            "contender, shards in the page cache.\n\n"
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
    return results


if __name__ == "__main__":
    main()

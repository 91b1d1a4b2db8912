"""How much a layer-wise pass holds and reads, before anything is loaded: the budget and the plan.

A pass holds one decoder layer, the embedding or the head, the statistics, and the streams of its windows at
the current layer (one per variant whose stream still differs, plus the stream entering each open gap). When
those streams would exceed the budget, the windows go through in groups, each group reading the layers again.
``plan`` reads only the checkpoint's headers (``lazy.Checkpoint``) and says, per pass: bytes read, groups,
the peak expected, and the time reading takes at the disk speed given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

BUDGET_SHARE = 0.5  # of the memory free on the device when the pass starts, for the streams of its windows
_ITEM = {torch.float32: 4, torch.float64: 8, torch.bfloat16: 2, torch.float16: 2}


def free_memory(device: torch.device | str) -> int:
    """Bytes free on ``device`` now (CUDA: the driver's count; CPU: MemAvailable, else 4 GiB)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30


def stream_budget(device: torch.device | str) -> int:
    """The default budget for a pass's streams: a share of the device's free memory."""
    return int(free_memory(device) * BUDGET_SHARE)


def batch_stream_bytes(batch: int, seq_len: int, hidden: int, dtype: torch.dtype, streams: int) -> int:
    """Bytes of ``streams`` streams (B, T, d) of one batch, plus one for the layer's output being built."""
    return batch * seq_len * hidden * _ITEM.get(dtype, 4) * (streams + 1)


def groups(n_batches: int, per_batch: int, budget: int) -> list[range]:
    """Consecutive groups of batch indices whose streams fit ``budget`` (at least one batch per group)."""
    size = max(1, budget // max(per_batch, 1))
    return [range(start, min(start + size, n_batches)) for start in range(0, n_batches, size)]


@dataclass
class PassPlan:
    """One kind of pass over the layers: what it reads and holds."""

    what: str  # "calibration", "perplexity x3", ...
    windows: int
    groups: int  # each group reads the layers again
    bytes_read: int  # per pass, all groups
    peak_bytes: int  # the largest layer, the embedding or head, the streams of one group, the logits chunk

    def line(self, read_mb_s: float | None) -> str:
        eta = f", reading ~{self.bytes_read / 1e6 / read_mb_s:,.0f} s at {read_mb_s:,.0f} MB/s" if read_mb_s else ""
        return (f"{self.what}: {self.windows} windows in {self.groups} group(s), up to "
                f"{self.bytes_read / 1e9:.2f} GB read, peak ~{self.peak_bytes / 2**30:.2f} GiB{eta}")


def layer_sizes(folder: str | Path, layers: int) -> tuple[list[int], int, int]:
    """(bytes of each decoder layer, of the largest other tensor group (embedding or head), of everything) as
    stored, from the checkpoint's headers; a tensor belongs to layer i when its name has ``.i.`` after "layers"
    or "h" (every family of ``architecture.SPECS``)."""
    import re

    from ghosted.models.lazy import Checkpoint, _bytes

    checkpoint = Checkpoint(folder)
    per_layer, other = [0] * layers, {}
    pattern = re.compile(r"\.(?:layers|h)\.(\d+)\.")
    for name, (_, shape, dtype) in checkpoint.entries.items():
        found = pattern.search(name)
        if found and int(found.group(1)) < layers:
            per_layer[int(found.group(1))] += _bytes(shape, dtype)
        else:
            other[name] = _bytes(shape, dtype)
    return per_layer, max(other.values(), default=0), checkpoint.nbytes


def plan(folder: str | Path, layers: int, hidden: int, passes: list[tuple[str, int, int, int]], batch: int,
         dtype: torch.dtype, budget: int, logits_bytes: int, stored_item: int = 4) -> list[PassPlan]:
    """One ``PassPlan`` per ``(what, windows, seq_len, streams)`` of ``passes``; sizes in ``dtype``."""
    per_layer, outer, total = layer_sizes(folder, layers)
    scale = _ITEM.get(dtype, 4) / stored_item
    out = []
    for what, windows, seq_len, streams in passes:
        per_batch = batch_stream_bytes(batch, seq_len, hidden, dtype, streams)
        n_groups = len(groups(-(-windows // batch), per_batch, budget))
        held = min(-(-windows // batch), max(1, budget // max(per_batch, 1))) * per_batch
        peak = int((max(per_layer, default=0) + outer) * scale) + held + logits_bytes
        out.append(PassPlan(what, windows, n_groups, int(total * scale) * n_groups, peak))
    return out


def checkpoint_folder(source: str) -> tuple[Path | None, str]:
    """(the local safetensors folder a layer-wise run of ``source`` reads, or None with the reason)."""
    import os

    from ghosted.models.assets import bundled_gguf_path, cache_dir, file_sha256
    from ghosted.models.loading import source_kind

    kind = source_kind(source)
    if kind == "hub":
        return None, (f"{source} is a hub id: its shards are downloaded on the first load, then read layer by "
                      "layer; the plan needs their headers (download the folder and pass it to see it)")
    if kind == "folder":
        return Path(os.path.expanduser(source)), ""
    gguf = bundled_gguf_path() if kind == "bundled" else Path(os.path.expanduser(source))
    if gguf.is_dir():
        gguf = sorted(gguf.glob("*.gguf"))[0]
    folder = cache_dir() / "models" / file_sha256(gguf)[:16]
    if (folder / "config.json").exists():
        return folder, ""
    return None, ("a GGUF's quantised blocks cannot be read one layer at a time: it is converted once to a "
                  "safetensors folder (whole, in memory) on the first load, and that folder is read layer by layer")


def describe(source: str, layers: int, hidden: int, passes: list[tuple[str, int, int, int]], batch: int,
             dtype: torch.dtype, device: str, logits_bytes: int) -> list[str]:
    """The memory plan's lines for ``--dry-run``: per pass, what it reads and holds (headers read only)."""
    folder, why = checkpoint_folder(source)
    if folder is None:
        return [f"layer-wise memory plan: not available yet: {why}"]
    budget = stream_budget(device)
    per_layer, outer, total = layer_sizes(folder, layers)
    lines = [f"layer-wise: {layers} layers of up to {max(per_layer, default=0) / 2**20:,.0f} MiB, embedding or head "
             f"{outer / 2**20:,.0f} MiB, {total / 1e9:.2f} GB in all (as stored); streams budget "
             f"{budget / 2**30:.1f} GiB (half the free memory of {device})"]
    lines += ["  " + p.line(1000.0) for p in plan(folder, layers, hidden, passes, batch, dtype, budget, logits_bytes)]
    return lines

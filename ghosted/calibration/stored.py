"""Calibration statistics as stored files: ``BoundaryStats`` of every gap as named tensors and scalar
metadata, and back; the sink detector's state, so a pass read from disk leaves it as the pass would.

``ghosted.calibration.cache`` writes the tensors to safetensors and the metadata to JSON.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from ghosted.calibration.collect import Gap
from ghosted.calibration.stats import BoundaryStats, TokenReservoir

_SCALARS = ("start", "end", "dim", "n_tokens", "n_samples")  # BoundaryStats fields kept in the JSON


def flatten(stats: dict[Gap, BoundaryStats]) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors by name ('start-end/field', '.../sink/field', '.../reservoir/m') and scalar metadata."""
    tensors, meta = {}, {}
    for gap, s in stats.items():
        prefix = f"{gap.start}-{gap.end}"
        meta[prefix] = _flatten_one(s, prefix, tensors)
        if s.sink is not None:
            meta[prefix]["sink"] = _flatten_one(s.sink, prefix + "/sink", tensors)
        if s.replaceme_samples is not None:
            r = s.replaceme_samples
            tensors[prefix + "/reservoir/m"] = r.m.detach().cpu().contiguous()
            tensors[prefix + "/reservoir/target"] = r.target.detach().cpu().contiguous()
            meta[prefix]["reservoir"] = {"capacity": r.capacity, "seen": r.seen}
        meta[prefix]["device"] = str(s.xtx.device)
    return tensors, meta


def _flatten_one(s: BoundaryStats, prefix: str, tensors: dict) -> dict:
    for f in fields(s):
        value = getattr(s, f.name)
        if isinstance(value, torch.Tensor):
            tensors[f"{prefix}/{f.name}"] = value.detach().cpu().contiguous()
    return {name: getattr(s, name) for name in _SCALARS}


def unflatten(tensors: dict[str, torch.Tensor], meta: dict, device_of) -> dict[Gap, BoundaryStats]:
    """Inverse of ``flatten``: every gap's statistics, each on ``device_of(its saved device)``."""
    out = {}
    for prefix, info in meta.items():
        start, end = (int(x) for x in prefix.split("-"))
        stats = _unflatten_one(tensors, prefix, info)
        if "sink" in info:
            stats.sink = _unflatten_one(tensors, prefix + "/sink", info["sink"])
        if "reservoir" in info:
            r = info["reservoir"]
            stats.replaceme_samples = TokenReservoir(
                capacity=r["capacity"], m=tensors[prefix + "/reservoir/m"],
                target=tensors[prefix + "/reservoir/target"], seen=r["seen"])
        out[Gap(start, end)] = stats.to(device_of(info.get("device", "cpu")))
    return out


def _unflatten_one(tensors: dict, prefix: str, info: dict) -> BoundaryStats:
    tensor_fields = {f.name: tensors[f"{prefix}/{f.name}"] for f in fields(BoundaryStats)
                     if f"{prefix}/{f.name}" in tensors}
    return BoundaryStats(**{name: info[name] for name in _SCALARS}, **tensor_fields)


def device_or_cpu(name: str) -> torch.device:
    """The device the statistics were on, if this machine has it; the CPU otherwise."""
    device = torch.device(name)
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        return torch.device("cpu")
    return device


def sink_state(detector) -> dict | None:
    """What the sink detector learned in a pass (its frozen norm threshold, what it flagged), as JSON."""
    if detector is None:
        return None
    return {"norm_threshold": detector.rule.norm_threshold, "flagged": detector.flagged,
            "tokens": detector.tokens, "position_counts": {str(k): v for k, v in detector.position_counts.items()}}


def restore_detector(detector, state: dict | None) -> None:
    """Leave ``detector`` as the pass would have: the frozen norm threshold and what it flagged."""
    if detector is None or state is None:
        return
    detector.rule.norm_threshold = state["norm_threshold"]
    detector.flagged, detector.tokens = state["flagged"], state["tokens"]
    detector.position_counts = {int(k): v for k, v in state["position_counts"].items()}

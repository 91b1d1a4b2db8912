"""LLM-Streamline's trained replacement (ICLR 2025): a lightweight block trained to bridge a gap.

The removed block [s, e) is replaced by a small network f trained with MSE so that f(stream
entering s) ≈ stream entering e, on the calibration windows. Two networks, as in its paper:

  * ``streamline-ffn``: a pre-norm SwiGLU block h + down(silu(gate(n)) * up(n)), n = RMSNorm(h),
    of the model's width and MLP size (``operators.FFNOperator``), trained from a fresh seeded
    initialisation whose output projection is zero (so training starts from plain pruning). It
    sits at the gap as a stream operator and is saved as a module with its weights.
  * ``streamline-layer``: a copy of the FIRST removed layer (as LLM-Streamline's code initialises
    its replacement layer from the first layer of the pruned block), trained the same way and put
    in the layer list at the gap: the result is a plain checkpoint with one more layer than the
    pruned model (the copy carries the original index of the layer it was initialised from).

Training follows LLM-Streamline's recipe: AdamW, a linear warm-up over the first 1 % of steps then
a cosine decay to ``min_lr``, gradient-norm clipping at 5, seeded shuffling, and the weights of
the epoch with the lowest held-out loss (or the last epoch without held-out windows). Memory is
bounded: the boundary pairs (X entering s, Y entering e) are captured once into a CPU buffer of at
most ``max_tokens`` tokens (a seeded subset of windows beyond that); each gap is trained on the
dense model's streams (independent mode), one gap at a time. The base model is never changed: the
layer copy owns new tensors.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ghosted.models.architecture import hidden_of, layers_of, num_layers
from ghosted.calibration.collect import Gap, gap_text
from ghosted.models.capture import StopForward, input_device, tap
from ghosted.core.progress import Progress, for_stage
from ghosted.operators.modules import FFNOperator
from ghosted.models.pruning import build_variant


@dataclass
class StreamlineConfig:
    """Training settings of the trained replacements (LLM-Streamline's recipe, sized for a CPU)."""

    epochs: int = 10  # passes over the captured pairs (its code: 1-5 over 10^5 windows; ours are few)
    lr: float = 1e-3  # peak AdamW learning rate (its code: 2e-4 for 10^5 windows of 2048 tokens)
    min_lr: float = 1e-4  # end of the cosine decay
    weight_decay: float = 1e-3  # AdamW weight decay (its code: 1e-3)
    warmup: float = 0.01  # share of steps with a linear warm-up (its code: 1 %)
    clip: float = 5.0  # gradient-norm clipping (its code: 5)
    batch_windows: int = 4  # windows per step
    max_tokens: int = 32768  # cap on the captured calibration tokens (bounded memory)
    ffn_hidden: int | None = None  # FFN width; None: the model's intermediate_size (or 4·d)
    seed: int = 0  # initialisation, window subset and shuffling


@dataclass
class Pairs:
    """Captured boundary pairs of whole windows, float32 on CPU."""

    ids: torch.Tensor  # (N, T) token ids (the layer replacement needs positions and the mask)
    mask: torch.Tensor  # (N, T) valid tokens
    x: torch.Tensor  # (N, T, d) stream entering s
    y: torch.Tensor  # (N, T, d) stream entering e


@dataclass
class TrainReport:
    """What one gap's training did."""

    gap: Gap
    losses: list[float]  # mean training MSE per epoch
    initial_loss: float  # training MSE before the first step
    heldout_error: float | None  # held-out Σ‖f(X) − Y‖² / Σ‖X − Y‖² (1 = no recovery)
    heldout_error_initial: float | None  # the same before training
    source_layer: int | None = None  # streamline-layer: the layer the copy was initialised from

    def row(self, method: str) -> dict:
        return {"method": method, "gap": gap_text(self.gap),
                "initial_loss": self.initial_loss, "final_loss": self.losses[-1] if self.losses else None,
                "epochs": len(self.losses), "heldout_relative_error": self.heldout_error,
                "heldout_relative_error_before": self.heldout_error_initial,
                "source_layer": self.source_layer}


def capture_pairs(model: nn.Module, windows, gap: Gap, max_tokens: int, seed: int, batch_size: int = 4) -> Pairs:
    """X and Y of ``gap`` for (a seeded subset of at most ``max_tokens`` tokens of) ``windows``."""
    ids, mask = windows.input_ids, getattr(windows, "attention_mask", None)
    mask = torch.ones_like(ids) if mask is None else mask
    keep = max(1, min(ids.size(0), max_tokens // max(ids.size(1), 1)))
    if keep < ids.size(0):
        chosen = torch.randperm(ids.size(0), generator=torch.Generator().manual_seed(seed))[:keep].sort().values
        ids, mask = ids[chosen], mask[chosen]
    xs, ys = [], []
    with tap(model, boundaries=[gap.start, gap.end]) as handle:
        for start in range(0, ids.size(0), batch_size):
            got = handle.run(ids[start:start + batch_size], mask[start:start + batch_size])
            xs.append(got.resid[gap.start].float().cpu())
            ys.append(got.resid[gap.end].float().cpu())
    return Pairs(ids, mask.bool(), torch.cat(xs), torch.cat(ys))


def _lr_factor(step: int, total: int, cfg: StreamlineConfig) -> float:
    """Linear warm-up, then cosine from lr to min_lr (a multiplier of lr)."""
    warm = max(1, int(total * cfg.warmup))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _masked_sq(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over valid tokens and channels of (pred − target)², on pred's device."""
    target, mask = target.to(pred.device), mask.to(pred.device)
    return ((pred.float() - target) ** 2).sum(-1)[mask].sum()


def train_block(block: nn.Module, apply: Callable, pairs: Pairs, heldout: Pairs | None, cfg: StreamlineConfig,
                gap: Gap, progress: Progress | None = None) -> TrainReport:
    """Train ``block`` (through ``apply(ids, mask, x) -> prediction``) to map X to Y with MSE."""
    params = list(block.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    n = pairs.x.size(0)
    steps_per_epoch = -(-n // cfg.batch_windows)
    total = steps_per_epoch * cfg.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, total, cfg))
    gen = torch.Generator().manual_seed(cfg.seed)
    initial = _mse(apply, pairs, cfg.batch_windows)
    held_before = None if heldout is None else _relative_error(apply, heldout, cfg.batch_windows)
    best = (held_before if held_before is not None else math.inf, _state(block))
    losses, step = [], 0
    report_step = for_stage(progress, f"training {gap}")
    block.train()
    for _epoch in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        total_sq, total_count = 0.0, 0
        for batch in order.split(cfg.batch_windows):
            mask = pairs.mask[batch]
            count = int(mask.sum()) * pairs.x.size(-1)
            with torch.enable_grad():
                sq = _masked_sq(apply(pairs.ids[batch], mask, pairs.x[batch]), pairs.y[batch], mask)
                (sq / max(count, 1)).backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            total_sq, total_count = total_sq + float(sq.detach()), total_count + count
            step += 1
            report_step(step, total)
        losses.append(total_sq / max(total_count, 1))
        if heldout is not None:
            err = _relative_error(apply, heldout, cfg.batch_windows)
            if err < best[0]:
                best = (err, _state(block))
    block.eval()
    if heldout is not None:
        block.load_state_dict(best[1])
    for p in params:
        p.requires_grad_(False)
    held_after = None if heldout is None else _relative_error(apply, heldout, cfg.batch_windows)
    return TrainReport(gap, losses, initial, held_after, held_before)


def _state(block: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in block.state_dict().items()}


@torch.no_grad()
def _mse(apply: Callable, pairs: Pairs, batch: int) -> float:
    sq, count = 0.0, 0
    for start in range(0, pairs.x.size(0), batch):
        sl = slice(start, start + batch)
        sq += float(_masked_sq(apply(pairs.ids[sl], pairs.mask[sl], pairs.x[sl]), pairs.y[sl], pairs.mask[sl]))
        count += int(pairs.mask[sl].sum()) * pairs.x.size(-1)
    return sq / max(count, 1)


@torch.no_grad()
def _relative_error(apply: Callable, pairs: Pairs, batch: int) -> float:
    """Σ‖f(X) − Y‖² / Σ‖X − Y‖² over valid held-out tokens (1 = no recovery)."""
    sq, base = 0.0, 0.0
    for start in range(0, pairs.x.size(0), batch):
        sl = slice(start, start + batch)
        mask = pairs.mask[sl]
        sq += float(_masked_sq(apply(pairs.ids[sl], mask, pairs.x[sl]), pairs.y[sl], mask))
        base += float(_masked_sq(pairs.x[sl], pairs.y[sl], mask))
    return sq / base if base > 0 else float("nan")


# ------------------------------------------------------------------------------------- FFN block
def ffn_width(model: nn.Module) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(getattr(config, "intermediate_size", None) or getattr(config, "ffn_dim", None)
               or 4 * config.hidden_size)


def train_ffn(model: nn.Module, gap: Gap, pairs: Pairs, heldout: Pairs | None, cfg: StreamlineConfig,
              method: str = "streamline-ffn", progress: Progress | None = None) -> tuple[FFNOperator, TrainReport]:
    """A fresh FFN block for ``gap`` trained on ``pairs``."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    eps = float(getattr(config, "rms_norm_eps", None) or 1e-6)
    block = FFNOperator(pairs.x.size(-1), cfg.ffn_hidden or ffn_width(model), eps, (gap.start, gap.end),
                        method, seed=cfg.seed).to(_device_of(layers_of(model)[gap.start]))
    device = block.down.weight.device
    report = train_block(block, lambda ids, mask, x: block(x.to(device)), pairs, heldout, cfg, gap, progress)
    return block, report


# ---------------------------------------------------------------------------------- layer copy
def train_layer(model: nn.Module, gap: Gap, pairs: Pairs, heldout: Pairs | None, cfg: StreamlineConfig,
                progress: Progress | None = None) -> tuple[nn.Module, TrainReport]:
    """A copy of layer ``gap.start`` (new tensors) trained on ``pairs``."""
    with layer_copy(model, gap.start) as (layer, apply):
        report = train_block(layer, apply, pairs, heldout, cfg, gap, progress)
    report.source_layer = gap.start
    return layer, report


@contextmanager
def layer_copy(model: nn.Module, source: int):
    """A copy of layer ``source`` (new tensors: the base layer is never changed) and ``apply(ids, mask, x)
    -> its output``, run as a 1-layer model so that its attention gets the right mask and positions; X
    (B, T, d) is substituted at its input. The hooks are removed on exit; the copy is kept."""
    layer = copy.deepcopy(layers_of(model)[source])
    view = build_variant(model, [source])
    layers_of(view)[0] = layer
    _set_layer_idx(layer, 0)
    current = {}

    def substitute(module, args, kwargs):
        x = current["x"]
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    def stop(module, args, output):
        current["out"] = hidden_of(output)
        raise StopForward

    def apply(ids, mask, x):
        device = input_device(view)
        current["x"] = x.to(device, next(layer.parameters()).dtype)
        try:
            view(input_ids=ids.to(device), attention_mask=mask.long().to(device), use_cache=False)
        except StopForward:
            pass
        return current.pop("out").float()

    handles = [layer.register_forward_pre_hook(substitute, with_kwargs=True), layer.register_forward_hook(stop)]
    try:
        yield layer, apply
    finally:
        for handle in handles:
            handle.remove()


def _device_of(module: nn.Module) -> torch.device:
    """Where ``module`` computes (its first real parameter; CPU for an offloaded one)."""
    return next((p.device for p in module.parameters() if p.device.type != "meta"), torch.device("cpu"))


def _set_layer_idx(layer: nn.Module, index: int) -> None:
    for module in layer.modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            module.layer_idx = index


def with_layers(model: nn.Module, dropped: list[int], trained: dict[Gap, nn.Module]) -> nn.Module:
    """The pruned model with each trained layer copy standing in the layer list at its gap."""
    keep = sorted({i for i in range(num_layers(model)) if i not in set(dropped)} | {g.start for g in trained})
    new = build_variant(model, keep)
    layers = layers_of(new)
    for gap, layer in trained.items():
        position = keep.index(gap.start)
        _set_layer_idx(layer, position)
        layers[position] = layer
    return new

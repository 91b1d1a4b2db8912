"""Criteria that run the model itself: removal perplexity, Taylor+, and SLEB's greedy search.

- Shortened-LLaMA (PPL): calibration perplexity of the model without one layer, for every layer.
- Shortened-LLaMA (Taylor+): one backward pass of the LM loss; a layer's score is Σ|W·∂L/∂W| over its
  weights (norm weights included). Gradients flow into a private copy of every parameter (same
  storage, new tensor objects), so the given model's ``requires_grad`` and ``.grad`` never change.
- SLEB: remove, step by step, the layer whose removal gives the lowest calibration NLL; the first and
  the last layer still alive are never candidates (as in SLEB's code).
Every removed layer is skipped exactly as ``ghosted.models.pruning.build_variant`` removes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ghosted.models.architecture import layers_of, num_layers, spec_for
from ghosted.models.capture import input_device
from ghosted.core.progress import Progress, counted
from ghosted.evaluation.perplexity import perplexity
from ghosted.models.pruning import build_variant, shallow_clone
from ghosted.data.windows import TokenWindows


def _nll(model: nn.Module, windows, batch_size: int) -> float:
    """Mean next-token NLL (nats) of ``model`` on ``windows``."""
    return perplexity(model, windows, batch_size=batch_size).nll


def removal_nll(model: nn.Module, windows, batch_size: int = 4,
                progress: Progress | None = None) -> tuple[float, dict[int, float]]:
    """(dense NLL, {layer: NLL of the model without that one layer}) on ``windows``.

    Example:
        >>> dense, without = removal_nll(model, calib)
        >>> min(without, key=without.get)      # the layer whose removal hurts least
    """
    total = num_layers(model)
    dense = _nll(model, windows, batch_size)
    scores = {}
    for layer in counted(range(total), progress, "ppl_single"):
        keep = [i for i in range(total) if i != layer]
        scores[layer] = _nll(build_variant(model, keep), windows, batch_size)
    return dense, scores


def sleb_order(model: nn.Module, windows, steps: int, batch_size: int = 4,
               progress: Progress | None = None) -> list[tuple[int, float]]:
    """SLEB's greedy removal: [(layer removed at step k, NLL after that step), ...] for ``steps`` steps.

    Example:
        >>> [layer for layer, _ in sleb_order(model, calib, steps=7)]   # SLEB's 7 layers, in order
    """
    total = num_layers(model)
    if not 1 <= steps <= total - 2:
        raise ValueError(f"SLEB can remove 1..{total - 2} layers of this {total}-layer model "
                         f"(the first and last alive layers stay); got {steps}.")
    alive, order = list(range(total)), []
    for _step in counted(range(steps), progress, "sleb"):
        trials = {}
        for candidate in alive[1:-1]:
            trials[candidate] = _nll(build_variant(model, [i for i in alive if i != candidate]),
                                     windows, batch_size)
        chosen = min(trials, key=trials.get)  # ties: the lower index (dict order)
        alive.remove(chosen)
        order.append((chosen, trials[chosen]))
    return order


def gradient_view(model: nn.Module, trainable: Callable[[str], bool]) -> nn.Module:
    """A private copy of ``model``'s module tree whose parameters are new tensors on the same storage.

    Parameters whose qualified name passes ``trainable`` require grad; the rest do not. Tied
    parameters stay tied. Nothing reachable from ``model`` is changed.
    """
    memo: dict[int, object] = {}

    def copy(module: nn.Module, prefix: str) -> nn.Module:
        if id(module) in memo:
            return memo[id(module)]
        clone = shallow_clone(module)
        memo[id(module)] = clone
        for name, child in module._modules.items():
            if child is not None:
                clone._modules[name] = copy(child, f"{prefix}{name}.")
        for name, param in module._parameters.items():
            if param is not None:
                if id(param) not in memo:
                    memo[id(param)] = nn.Parameter(param.detach(), requires_grad=trainable(prefix + name))
                clone._parameters[name] = memo[id(param)]
        return clone

    return copy(model, "")


def _loss_sum(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed next-token NLL of a (B, T) batch as a differentiable scalar (padding targets skipped)."""
    device = input_device(model)
    ids, mask = ids.to(device), mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (B, T, V)
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(),
                          reduction="none")  # (B·(T-1),)
    return (nll * mask[:, 1:].flatten().to(nll.dtype)).sum()


def taylor_scores(model: nn.Module, windows, batch_size: int = 4) -> dict[int, float]:
    """Shortened-LLaMA's Taylor score per layer: Σ over its weights of Σ|W·∂L/∂W| (float64).

    L is the mean next-token NLL over every valid target token of ``windows`` (gradients of the
    batches add up to the gradient of that mean). Only parameters named ``*weight`` count, as in
    Shortened-LLaMA (norm weights included; biases and embeddings excluded).

    Example:
        >>> scores = taylor_scores(model, calib)
        >>> sorted(scores, key=scores.get)[:7]        # the 7 least important layers
    """
    stack = spec_for(model).stack
    layer_prefix = f"{stack}.{spec_for(model).layers}." if stack else f"{spec_for(model).layers}."
    view = gradient_view(model, lambda name: name.startswith(layer_prefix) and name.endswith("weight"))
    ids, mask = windows.input_ids, windows.attention_mask
    scored = int(mask[:, 1:].sum())
    with torch.enable_grad():
        for start in range(0, ids.shape[0], batch_size):
            batch = slice(start, start + batch_size)
            (_loss_sum(view, ids[batch], mask[batch]) / max(scored, 1)).backward()
    scores = {}
    for layer, module in enumerate(layers_of(view)):
        total = torch.zeros((), dtype=torch.float64)
        for param in module.parameters():
            if param.grad is not None:
                total += (param.detach().double() * param.grad.double()).abs().sum().cpu()
        scores[layer] = float(total)
    return scores


def removal_criteria(model: nn.Module, windows, metrics: list[str], batch_size: int, candidate_windows: int | None,
                     sleb_steps: int, progress: Progress | None = None) -> tuple[list[tuple], dict]:
    """Layer rows (metric, layer, value) of "ppl_single", "taylor" and "sleb" (those in ``metrics``), and
    facts for the report (dense calibration perplexity, candidate tokens, seconds per criterion).

    ppl_single and sleb run on the first ``candidate_windows`` windows (None: all), taylor on all.
    SLEB's layers get their removal step (NaN if never removed) and, as "sleb_ppl", the calibration
    perplexity after that step.
    """
    rows, info, seconds = [], {}, {}
    few = windows if candidate_windows is None else first_windows(windows, candidate_windows)
    if "ppl_single" in metrics:
        clock = time.perf_counter()
        dense, without = removal_nll(model, few, batch_size, progress)
        rows += [("ppl_single", layer, math.exp(nll)) for layer, nll in without.items()]
        info["dense_calibration_ppl"] = math.exp(dense)
        seconds["ppl_single"] = round(time.perf_counter() - clock, 3)
    if "taylor" in metrics:
        clock = time.perf_counter()
        rows += [("taylor", layer, score) for layer, score in taylor_scores(model, windows, batch_size).items()]
        seconds["taylor"] = round(time.perf_counter() - clock, 3)
    if "sleb" in metrics:
        clock = time.perf_counter()
        total = num_layers(model)
        order = sleb_order(model, few, min(sleb_steps, total - 2), batch_size, progress)
        step_of = {layer: k + 1 for k, (layer, _) in enumerate(order)}
        rows += [("sleb", layer, float(step_of.get(layer, math.nan))) for layer in range(total)]
        rows += [("sleb_ppl", layer, math.exp(nll)) for layer, nll in order]
        seconds["sleb"] = round(time.perf_counter() - clock, 3)
    if {"ppl_single", "sleb"} & set(metrics):
        info["candidate_tokens"] = int(few.attention_mask.sum())
    return rows, {**info, "seconds": seconds}


def first_windows(windows, count: int) -> TokenWindows:
    """The first ``count`` windows, with the protocol's window count updated."""
    proto = {**getattr(windows, "protocol", {}), "n_windows": min(count, windows.input_ids.shape[0])}
    return TokenWindows(windows.input_ids[:count], windows.attention_mask[:count], proto)

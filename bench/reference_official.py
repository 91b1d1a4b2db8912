"""The ghost fit as the paper's released code does it, re-implemented from its description.

A baseline for the benchmarks, not part of the library. The approach, step by step:
  1. the *unpruned* model runs every calibration sequence, one at a time (batch 1), through
     **every** layer, the final norm and the head (nothing stops the pass early);
  2. forward pre-hooks on layers ``start`` and ``end`` copy the residual stream entering them to the
     CPU as float32 and append it to two lists: every token of every sequence is kept;
  3. after the pass the lists are concatenated into X_pre and X_post (N x d), cast to float64,
     Δ = X_post − X_pre, and M = solve(XᵀX + εI, XᵀΔ) with an absolute ε = 1e-6;
  4. W = I + M, stored as float32.
The released code also keeps a deep copy of the whole model as the "teacher" it reads from
(``teacher_copy=True`` adds that copy). Memory therefore grows with N·d: two float32 stacks, then
float64 copies of X_pre, X_post and Δ. Ghosted instead streams float64 XᵀX and XᵀΔ (``collect_stats``)
and stops the pass after the deepest boundary it needs.

Hooks go on a private view (``build_variant``) so the caller's model is left untouched, as everywhere.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ghosted.models.architecture import layers_of, num_layers
from ghosted.models.pruning import build_variant


class _Recorder:
    """Float32 CPU copies of the stream entering one layer, appended per forward pass."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []  # each (T, d) float32

    def hook(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]  # (1, T, d)
        self.rows.append(hidden.detach().reshape(-1, hidden.shape[-1]).float().cpu().clone())

    def stacked(self) -> torch.Tensor:
        return torch.cat(self.rows)  # (N, d) float32


@torch.no_grad()
def collect_boundaries(model: nn.Module, windows, start: int, end: int, teacher_copy: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(X_pre, X_post): float32 (N, d) stacks of every token entering layers ``start`` and ``end``."""
    if not 0 <= start < end < num_layers(model):
        raise ValueError(f"Need 0 <= start < end < {num_layers(model)} (a hook on the layer after the gap).")
    teacher = copy.deepcopy(model) if teacher_copy else model
    view = build_variant(teacher, list(range(num_layers(teacher))), clone=[start, end])
    pre, post = _Recorder(), _Recorder()
    handles = [layers_of(view)[start].register_forward_pre_hook(pre.hook, with_kwargs=True),
               layers_of(view)[end].register_forward_pre_hook(post.hook, with_kwargs=True)]
    try:
        for row in range(windows.input_ids.size(0)):  # batch size 1, the whole model every time
            view(input_ids=windows.input_ids[row:row + 1], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return pre.stacked(), post.stacked()


def solve_from_activations(x_pre: torch.Tensor, x_post: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """W = I + M with (XᵀX + εI)M = XᵀΔ, everything cast to float64 first (returns float64 (d, d))."""
    x = x_pre.double()  # (N, d)
    delta = x_post.double() - x  # (N, d)
    eye = torch.eye(x.shape[1], dtype=torch.float64)  # (d, d)
    m = torch.linalg.solve(x.T @ x + eps * eye, x.T @ delta)  # (d, d)
    return eye + m


def official_ghost_operator(model: nn.Module, windows, start: int, end: int, eps: float = 1e-6,
                            teacher_copy: bool = False) -> torch.Tensor:
    """The ghost operator for removed layers [start, end), fitted the released code's way (float64 W)."""
    x_pre, x_post = collect_boundaries(model, windows, start, end, teacher_copy=teacher_copy)
    return solve_from_activations(x_pre, x_post, eps)


def stack_bytes(tokens: int, dim: int) -> int:
    """Bytes the approach holds at its peak: two float32 stacks (plus the cat copy) and float64 X, Y, Δ."""
    return tokens * dim * (2 * 4 + 2 * 4 + 3 * 8)

"""Recovery operators beyond a dense d x d map: a low-rank correction and a trained FFN block.

Both act on the residual stream like ``sites.StreamOperator`` (h -> f(h), attached by the same
hooks at the same sites), and both know how to save and rebuild themselves, so ``ghosted.operators.checkpoint``
stores them next to the dense operators without knowing their insides:

  * ``kind``: the name written in the operator file;
  * ``saved_entry()``: JSON-ready shape fields; ``saved_tensors()``: the tensors to store;
  * ``from_saved(entry, tensors, context)``: the module again, with identical outputs (``context``:
    the model's shared sink context, for operators that map sink tokens apart).

``SAVED_KINDS`` maps each kind to its class.
"""

from __future__ import annotations

import torch
from torch import nn


class LowRankOperator(nn.Module):
    """h -> h + (h·U)·V: W = I + U·V with U (d, R) and V (R, d), 2·d·R parameters instead of d².

    Computed in float32 and returned in the stream's dtype, like ``StreamOperator``.
    """

    kind = "lowrank"

    def __init__(self, left: torch.Tensor, right: torch.Tensor, boundary: tuple[int, int] = (-1, -1),
                 method: str = ""):
        super().__init__()
        if left.shape[1] != right.shape[0] or left.shape[0] != right.shape[1]:
            raise ValueError(f"Low-rank factors do not match: U {tuple(left.shape)}, V {tuple(right.shape)}.")
        self.left = nn.Parameter(left.detach().float().clone(), requires_grad=False)  # (d, R)
        self.right = nn.Parameter(right.detach().float().clone(), requires_grad=False)  # (R, d)
        self.boundary = tuple(boundary)  # original (start, end) of the gap this operator bridges
        self.method = method

    @property
    def rank(self) -> int:
        return int(self.left.shape[1])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.left.device != hidden.device:  # device_map: follow the stream once, not per call
            self.left.data, self.right.data = self.left.data.to(hidden.device), self.right.data.to(hidden.device)
        x = hidden.float()  # (B, T, d)
        return (x + (x @ self.left) @ self.right).to(hidden.dtype)  # (B, T, d)

    def dense(self) -> torch.Tensor:
        """The equivalent d x d W = I + U·V in float64 (for diagnostics)."""
        eye = torch.eye(self.left.shape[0], dtype=torch.float64, device=self.left.device)
        return eye + self.left.double() @ self.right.double()

    def saved_entry(self) -> dict:
        return {"dim": int(self.left.shape[0]), "rank": self.rank}

    def saved_tensors(self) -> dict[str, torch.Tensor]:
        return {"left": self.left.detach().float().cpu().contiguous(),
                "right": self.right.detach().float().cpu().contiguous()}

    @classmethod
    def from_saved(cls, entry: dict, tensors: dict[str, torch.Tensor], context=None) -> LowRankOperator:
        return cls(tensors["left"], tensors["right"], tuple(entry["boundary"]), entry["method"])

    def extra_repr(self) -> str:
        return f"dim={self.left.shape[0]}, rank={self.rank}, boundary={self.boundary}, method={self.method!r}"


class RobustLowRankOperator(LowRankOperator):
    """h -> h + (h·U)·V for ordinary tokens; sink tokens get their own map (``ghost-lowrank-robust``).

    The sinks are found and mapped exactly as by ``sites.RobustStreamOperator`` (shared context).
    """

    kind = "robust-lowrank"

    def __init__(self, left, right, sink_map, context, boundary=(-1, -1), method: str = ""):
        super().__init__(left, right, boundary, method)
        self.sink_constant = nn.Parameter(sink_map.constant.detach().float().clone(), requires_grad=False)  # (d,)
        linear = sink_map.linear
        self.sink_linear = None if linear is None else nn.Parameter(
            linear.detach().float().clone(), requires_grad=False)  # (d, d)
        self.context = context

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from ghosted.operators.sites import RobustStreamOperator

        return RobustStreamOperator.replace_sinks(self, hidden, super().forward(hidden))

    def sink_mask(self, hidden: torch.Tensor):
        from ghosted.operators.sites import RobustStreamOperator

        return RobustStreamOperator.sink_mask(self, hidden)

    def saved_entry(self) -> dict:
        from dataclasses import asdict

        return {**super().saved_entry(), "sink_rule": asdict(self.context.rule)}

    def saved_tensors(self) -> dict[str, torch.Tensor]:
        sinks = {"sink_constant": self.sink_constant}
        if self.sink_linear is not None:
            sinks["sink_linear"] = self.sink_linear
        return {**super().saved_tensors(), **{k: v.detach().float().cpu().contiguous() for k, v in sinks.items()}}

    @classmethod
    def from_saved(cls, entry: dict, tensors: dict[str, torch.Tensor], context=None) -> RobustLowRankOperator:
        from ghosted.calibration.sinks import SinkMap

        sink_map = SinkMap(constant=tensors["sink_constant"], linear=tensors.get("sink_linear"))
        return cls(tensors["left"], tensors["right"], sink_map, context, tuple(entry["boundary"]), entry["method"])


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, in float32 (the norm of Llama-like blocks)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # (d,)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class FFNOperator(nn.Module):
    """h -> h + down(silu(gate(n)) * up(n)), n = RMSNorm(h): a pre-norm SwiGLU block with a residual.

    LLM-Streamline's lightweight FFN replacement (its ``LlamaMLPBlock``), in float32, returned in the
    stream's dtype. ``down`` starts at zero, so an untrained block is the identity (no recovery).
    """

    kind = "ffn"

    def __init__(self, dim: int, hidden: int, eps: float = 1e-6, boundary: tuple[int, int] = (-1, -1),
                 method: str = "", seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.norm = RMSNorm(dim, eps)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        with torch.no_grad():
            for linear in (self.gate, self.up):  # HF's default initialiser range, seeded
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen) * 0.02)
            self.down.weight.zero_()
        self.boundary = tuple(boundary)  # original (start, end) of the gap this block bridges
        self.method = method

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.down.weight.device != hidden.device:
            self.to(hidden.device)
        x = hidden.float()  # (B, T, d)
        n = self.norm(x)  # (B, T, d)
        return (x + self.down(nn.functional.silu(self.gate(n)) * self.up(n))).to(hidden.dtype)

    def saved_entry(self) -> dict:
        return {"dim": int(self.down.weight.shape[0]), "hidden": int(self.down.weight.shape[1]),
                "eps": float(self.norm.eps)}

    def saved_tensors(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().float().cpu().contiguous() for name, t in self.state_dict().items()}

    @classmethod
    def from_saved(cls, entry: dict, tensors: dict[str, torch.Tensor], context=None) -> FFNOperator:
        op = cls(entry["dim"], entry["hidden"], entry["eps"], tuple(entry["boundary"]), entry["method"])
        op.load_state_dict(tensors)
        op.requires_grad_(False)
        return op

    def extra_repr(self) -> str:
        return f"boundary={self.boundary}, method={self.method!r}"


SAVED_KINDS: dict[str, type[nn.Module]] = {
    cls.kind: cls for cls in (LowRankOperator, RobustLowRankOperator, FFNOperator)}

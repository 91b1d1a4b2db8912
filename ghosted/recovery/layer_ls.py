"""``layer-ls``: a replacement layer per removed block, solved in closed form (no gradient step).

Like ``streamline-layer``, each contiguous removed block [s, e) is replaced by a copy of its first
layer s; unlike it, nothing is trained. The copy keeps its attention and its MLP's input projections,
and only its output projection D (``down_proj``, d x f) is solved, by ridge least squares, so that
the layer's output matches the dense model's stream entering e:

    h = x + attn(x)                  the copy's stream before its MLP (x: the stream entering s)
    u = act(gate(n(h))) * up(n(h))   the f gated hidden units, the features (f = d_ff)
    t = y − h                        what the MLP branch must add (y: the dense stream entering e)
    Dᵀ = (UᵀU + λI)⁻¹ (UᵀT + λ D₀ᵀ)  ridge towards the copied D₀ (λ → ∞: the copy as it is)

from float64 statistics UᵀU (f x f), UᵀT (f x d) and ‖T‖² streamed over the calibration windows (and
the same on the held-out windows), one batch at a time. λ = α · tr(UᵀU)/f, with α chosen from
``RIDGES`` (and the copy as it is) by the held-out error ‖U Dᵀ − T‖² on the held-out windows.

The blocks are fitted in order, each on the stream of the model already patched upstream with the
layers solved so far (x), against the dense stream (y): a scattered selection's errors do not add up.
Last, the whole cut is compared with ``ghost`` on the held-out windows by next-token NLL, with
``ghost-auto``'s significance rule (``ghosted.recovery.heldout``): the replacement layers are kept only
when they predict the held-out windows significantly better; otherwise the result is ``ghost``'s, and
its choices say so. Memory: the f x f float64 moments per block (14336² · 8 B = 1.6 GB for
Llama-3.1-8B), one block at a time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from ghosted.calibration.collect import Gap, gap_text
from ghosted.core.progress import Progress, counted
from ghosted.models.architecture import get_path, layers_of, spec_for
from ghosted.models.capture import tap
from ghosted.operators.assembly import assemble
from ghosted.recovery.streamline import layer_copy, with_layers

RIDGES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # α of λ = α · tr(UᵀU)/f, chosen on held-out windows
COPY = math.inf  # the choice "the copied layer as it is" (λ → ∞)


@dataclass
class LayerMoments:
    """Float64 sums over valid tokens of one block's features u (f) and targets t = y − h (d)."""

    uu: torch.Tensor  # (f, f) Σ uᵀu
    ut: torch.Tensor  # (f, d) Σ uᵀt
    tt: float  # Σ ‖t‖²
    base: float  # Σ ‖x − y‖²: the error with no recovery
    tokens: int

    def error(self, a: torch.Tensor) -> float:
        """Σ ‖u·a − t‖² for the output projection's transpose ``a`` (f, d)."""
        return float(self.tt - 2 * (a * self.ut).sum() + (a * (self.uu @ a)).sum())


def check_layers(model: nn.Module) -> nn.Linear:
    """The output projection of the first layer's MLP, an ``nn.Linear`` without bias whose output is the
    MLP branch added to the stream; a ValueError saying why otherwise."""
    spec = spec_for(model)
    family = spec.family
    if spec.mlp_branch != "mlp" or spec.mlp_out_linear is None:
        raise ValueError(f"layer-ls solves the output projection of an MLP whose output is added to the stream; "
                         f"{family} layers normalise the MLP output after it ({spec.mlp_branch}), so its least "
                         "squares would not be the layer's. Use ghost-auto or streamline-layer.")
    linear = get_path(layers_of(model)[0], spec.mlp_out_linear)
    if type(linear) is not nn.Linear or linear.bias is not None:
        raise ValueError(f"layer-ls solves a bias-free nn.Linear output projection; {family}'s "
                         f"{spec.mlp_out_linear} is a {type(linear).__name__}"
                         f"{' with a bias' if type(linear) is nn.Linear else ''}. Use ghost-auto or streamline-layer.")
    return linear


@torch.no_grad()
def layer_moments(dense: nn.Module, patched: nn.Module, position: int, windows, gap: Gap, layer: nn.Module,
                  apply, batch_size: int, progress: Progress | None = None, label: str = "") -> LayerMoments:
    """The moments of ``layer`` (a copy run by ``apply``) on ``windows``: x is the stream entering position
    ``position`` of ``patched`` (the model patched upstream), y the dense stream entering ``gap.end``."""
    spec = spec_for(dense)
    down = get_path(layer, spec.mlp_out_linear)
    mlp = get_path(layer, spec.mlp_branch)
    seen = {}
    handles = [down.register_forward_pre_hook(lambda m, args: seen.__setitem__("u", args[0])),
               mlp.register_forward_hook(lambda m, args, out: seen.__setitem__("m", out))]
    ids = windows.input_ids
    masks = getattr(windows, "attention_mask", None)
    masks = torch.ones_like(ids) if masks is None else masks
    f, d = down.weight.shape[1], down.weight.shape[0]
    device = down.weight.device
    uu = torch.zeros(f, f, dtype=torch.float64, device=device)
    ut = torch.zeros(f, d, dtype=torch.float64, device=device)
    tt = base = 0.0
    tokens = 0
    try:
        with tap(dense, boundaries=[gap.end]) as target, tap(patched, boundaries=[position]) as source:
            for start in counted(range(0, ids.size(0), batch_size), progress, label or f"layer-ls: block {gap}"):
                batch, mask = ids[start:start + batch_size], masks[start:start + batch_size]
                y = target.run(batch, mask).resid[gap.end].to(device, torch.float64)  # (B, T, d)
                x = source.run(batch, mask).resid[position]  # (B, T, d)
                out = apply(batch, mask, x).to(device, torch.float64)  # (B, T, d)
                keep = mask.to(device).bool()
                u = seen.pop("u").to(torch.float64)[keep]  # (N, f)
                h = (out - seen.pop("m").to(torch.float64))[keep]  # (N, d): the stream before the MLP
                t = y[keep] - h  # (N, d)
                uu += u.T @ u
                ut += u.T @ t
                tt += float((t * t).sum())
                base += float(((x.to(device, torch.float64)[keep] - y[keep]) ** 2).sum())
                tokens += int(keep.sum())
    finally:
        for handle in handles:
            handle.remove()
    return LayerMoments(uu, ut, tt, base, tokens)


def solve_projection(fit: LayerMoments, heldout: LayerMoments, start: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The output projection's transpose (f, d) with the ridge chosen on ``heldout``, and what was chosen.

    ``start`` (f, d) is the copied projection's transpose, what a large ridge shrinks towards."""
    start = start.to(fit.uu)
    values, vectors = torch.linalg.eigh(fit.uu)  # UᵀU = V S Vᵀ, once for every ridge
    values = values.clamp_min(0)
    scale = float(values.mean()) or 1.0
    rotated = vectors.T @ fit.ut  # (f, d)
    shrink = vectors.T @ start  # (f, d)
    trials = {COPY: start}
    for alpha in RIDGES:
        lam = alpha * scale
        trials[alpha] = vectors @ ((rotated + lam * shrink) / (values + lam)[:, None])  # (f, d)
    errors = {alpha: heldout.error(a) for alpha, a in trials.items()}
    finite = {alpha: e for alpha, e in errors.items() if math.isfinite(e)}
    alpha = min(finite, key=finite.get) if finite else COPY
    details = {"ridge": None if alpha == COPY else alpha * scale, "relative_ridge": None if alpha == COPY else alpha,
               "kept_copy": alpha == COPY, "fit_relative_error": fit.error(trials[alpha]) / fit.base,
               "heldout_relative_error": errors[alpha] / heldout.base,
               "heldout_relative_error_copy": errors[COPY] / heldout.base, "tokens": fit.tokens}
    return trials[alpha], details


def solve_layers(ctx) -> tuple[dict[Gap, nn.Module], list[dict]]:
    """Every block's replacement layer, in order, each fitted on the stream patched upstream."""
    check_layers(ctx.model)
    spec = spec_for(ctx.model)
    batch = ctx.cfg.calibration.batch_size
    solved: dict[Gap, nn.Module] = {}
    rows = []
    for gap in ctx.block_gaps:
        upstream = [i for g in solved for i in g.layers]
        patched = with_layers(ctx.model, upstream, dict(solved)) if solved else ctx.model
        position = list(patched.ghosted_layers).index(gap.start)
        with layer_copy(ctx.model, gap.start) as (layer, apply):
            fit = layer_moments(ctx.model, patched, position, ctx.calib_windows, gap, layer, apply, batch,
                                ctx.progress, f"layer-ls: moments of block {gap}")
            held = layer_moments(ctx.model, patched, position, ctx.heldout_windows, gap, layer, apply, batch,
                                 ctx.progress, f"layer-ls: held-out moments of block {gap}")
        down = get_path(layer, spec.mlp_out_linear)
        a, details = solve_projection(fit, held, down.weight.T.double())
        with torch.no_grad():
            down.weight.copy_(a.T.to(down.weight))  # (d, f)
        layer.requires_grad_(False)
        solved[gap] = layer
        rows.append({"gap": gap_text(gap), "source_layer": gap.start, **details})
    return solved, rows


@dataclass
class Verdict:
    """The solved layers against another fit of the same cut, on the held-out windows."""

    model: nn.Module  # the pruned model with the solved layers in place
    layers: dict  # Gap -> its solved layer
    rows: list[dict]  # per block: the ridge chosen and the boundary errors
    better: bool  # the solved layers predict the held-out windows significantly better
    text: str  # the comparison in words, for the choices and the notes

    @property
    def parameters(self) -> int:
        return sum(p.numel() for layer in self.layers.values() for p in layer.parameters())


def against(ctx, other: nn.Module, label: str) -> Verdict:
    """Solve every block's layer and compare the result with ``other`` (called ``label``) by next-token NLL
    on the held-out windows, with ``ghost-auto``'s rule (``ghosted.recovery.heldout.wins``)."""
    from ghosted.recovery.heldout import heldout_scores, mean_nll, wins

    layers, rows = solve_layers(ctx)
    model = with_layers(ctx.model, ctx.dropped, layers)
    scores = heldout_scores({"layers": model, "other": other}, ctx.heldout_windows, ctx.cfg.calibration.batch_size)
    better, gain = wins(scores["layers"], scores["other"])
    mine, theirs = mean_nll(scores["layers"]), mean_nll(scores["other"])
    interval = "no interval (too few held-out windows)" if gain is None else f"[{gain.low:+.4f}, {gain.high:+.4f}]"
    text = (f"held-out NLL {mine:.4f} (solved layers) vs {theirs:.4f} ({label}), ΔNLL {mine - theirs:+.4f} "
            f"{interval}: " + ("kept the solved layers" if better
                               else f"kept {label} (the solved layers are not significantly better)"))
    for row in rows:
        row.update(nll_layers=mine, **{f"nll_{label.replace(' ', '_')}": theirs})
    return Verdict(model, layers, rows, better, text)


def fit_layer_ls(ctx, name: str):
    """``layer-ls``: the solved replacement layers, unless they do not predict the held-out windows
    significantly better than ``ghost``; the choices say which and why."""
    from ghosted.recovery import methods as registry
    from ghosted.recovery.gap_fits import fit_ghost
    from ghosted.recovery.methods import MethodResult

    started = time.perf_counter()
    ghost = _ghost_fits(ctx, name, fit_ghost)
    ghost_model = assemble(ctx.model, ctx.dropped, ghost, name, ctx.cfg.fold, ctx.rule)
    verdict = against(ctx, ghost_model, "ghost")
    for row in verdict.rows:
        row.update(method=name, chosen="layers" if verdict.better else "ghost", reason=verdict.text)
    seconds = time.perf_counter() - started
    if verdict.better:
        notes = [f"one solved layer per removed block ({len(verdict.layers)}: {verdict.parameters} parameters "
                 f"back); {verdict.text}"]
        return MethodResult(name, verdict.model, "layer", {}, {}, None, seconds, ctx.calib_seconds,
                            choices=verdict.rows, notes=notes)
    gaps = ctx.stream_gaps
    return MethodResult(name, ghost_model, registry.RESULT_KINDS[registry.STREAM],
                        {g: f.stream for g, f in ghost.items()},
                        ctx.pick(ctx.stats, gaps), ctx.pick(ctx.heldout, gaps), seconds, ctx.calib_seconds,
                        fits=ghost, choices=verdict.rows, notes=[verdict.text])


def _ghost_fits(ctx, name: str, fit_ghost) -> dict:
    """``ghost``'s fit of every stream gap, as the mode fits it (sequential: on the stream patched upstream)."""
    if ctx.cfg.ghost_mode == "sequential":
        from ghosted.recovery.fitting import sequential_fits

        return sequential_fits(ctx, fit_ghost, name, sinks=False).fits
    return {g: fit_ghost(ctx.stats[g], None, ctx.cfg)[0] for g in ctx.stream_gaps}

"""The method registry: every recovery method Ghosted knows, what it is and where it comes from.

One entry per name. ``ghosted.recovery.fitting.recover`` dispatches from it (each entry names its fit function
and says which statistics and held-out windows it needs), and ``ghosted.recovery.fitting.METHODS``, the CLI's
``--methods`` help, the app's method help, ``python -m ghosted methods`` and the README's method
table all read it. Adding a method is one entry here and one fit function:

  * ``scope="gap"``: ``fit(stats, heldout, cfg) -> (GapFit, details)`` for one gap, from its calibration
    statistics (and held-out ones, or None); ``details`` (a dict, maybe empty) becomes a row of the
    run's ``choices()``. ``recover`` fits every gap, assembles the model and, in sequential mode when
    the entry says ``sequential=True``, fits each gap on the stream of the model patched upstream.
  * ``scope="run"``: ``fit(ctx, name) -> MethodResult`` for methods that need the model or the windows
    themselves (``ghosted.recovery.fitting.FitContext`` holds everything gathered once).

The table names each fit as "module:function", imported on first use, so this module imports nothing
heavy and no module it names imports back into a cycle (an entry may also hold the function itself).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotations of MethodResult only: the registry imports nothing heavy
    import torch
    from torch import nn

    from ghosted.calibration.collect import Gap
    from ghosted.calibration.stats import BoundaryStats
    from ghosted.operators.assembly import GapFit

# Kinds of result a method produces.
STREAM = "stream operator"  # W applied to the residual stream at the gap (a module in the checkpoint)
BRANCH = "folded branch"  # a map on the MLP output of the layer before the gap, folded into its weights
WEIGHTS = "folded weights"  # scales fused into existing weights: a plain checkpoint, no operator
TRAINED = "trained module"  # a replacement trained by gradient descent on the calibration windows
LAYER = "solved layer"  # a copy of a removed layer put back, its output projection solved in closed form
NONE = "none"  # no recovery (or no pruning)

# Roles: what a method's model is in a comparison (tables, charts and the best-recovery rule read them).
REFERENCE = "reference"  # the unpruned model every other is measured against
BASELINE = "baseline"  # plain pruning: what a recovery has to beat
RECOVERY = "recovery"  # a method that fits something in place of the removed layers


@dataclass(frozen=True)
class Paper:
    """Where a method comes from."""

    citation: str  # short: "ReplaceMe (Shopkhoev et al., 2025)"
    arxiv: str = ""  # arXiv id, "" if none


@dataclass(frozen=True)
class Method:
    """One recovery method, as the user chooses it by name."""

    name: str  # what --methods and the API take
    summary: str  # one line for --help and the app
    description: str  # the README's "what it is"
    paper: Paper | None  # None: Ghosted's own, or no method at all
    kind: str  # RESULT_KINDS: "stream", "branch", "folded", "trained", "layer" or "none"
    gaps: str  # gap granularity: "per --granularity" (auto, block or layer), "per block" (contiguous) or "-"
    statistics: str  # what the calibration pass collects for it
    heldout: str  # held-out calibration windows: "required", "used if given" or "no"
    fit: str | Callable = ""  # its fit function, or its "module:function" (see above); "" when nothing is fitted
    scope: str = "gap"  # "gap": one fit per gap from its statistics; "run": one fit of the whole cut
    uses_sinks: bool = False  # needs the sink tokens' statistics apart (SinkDetector during calibration)
    sequential: bool = False  # honours --ghost-mode sequential; False: fitted independently, said in its notes
    reservoir: bool = False  # needs a reservoir of captured MLP outputs (not only second moments)
    conditioning: bool = False  # its ghost solve warns when ill-conditioned (too few tokens for d)
    role: str = RECOVERY  # REFERENCE (the unpruned model), BASELINE (plain pruning) or RECOVERY
    closed_form: bool = True  # fitted in closed form from statistics; False: by gradient steps (trained)
    label: str = ""  # the name shown to users in tables and charts ("" : the name itself)
    check: str | Callable = ""  # ``check(model)`` raising a ValueError for a model it cannot fit, run before any
    # calibration pass (or its "module:function"); "" : every supported architecture

    @property
    def display(self) -> str:
        """The label users read (``pruned`` for ``none``), the name when the entry has none."""
        return self.label or self.name


GHOSTED = Paper("Ghosted Layers", "2605.15491")
REPLACEME = Paper("ReplaceMe (Shopkhoev et al., 2025)", "2505.02819")
LINEARPATCH = Paper("LinearPatch (Chen et al., 2025)", "2505.24680")
PRUNECOMP = Paper("Prune&Comp", "2507.18212")
STREAMLINE = Paper("LLM-Streamline (Chen et al., 2024)", "2403.19135")

GRAM = "XᵀX, XᵀΔ"
GRAM_SINK = "XᵀX, XᵀΔ, ΔᵀΔ with the sink tokens apart"

REGISTRY: dict[str, Method] = {m.name: m for m in [
    Method("dense", "the unpruned model", "the unpruned model", None, NONE, "-", "none", "no", role=REFERENCE),
    Method("none", "the pruned model, no recovery", "the pruned model, no recovery", None, NONE, "-", "none", "no",
           fit="ghosted.recovery.fitting:fit_none", scope="run", sequential=True, role=BASELINE, label="pruned"),
    Method("ghost", "the paper's map W = I + M, least squares on every token",
           "the paper's method exactly: W = I + M, (XᵀX + εI)M = XᵀΔ, ε = 1e-6, float64, applied after the last "
           "kept layer (`--solver pinv` for the exact minimum-norm solution)",
           GHOSTED, STREAM, "per --granularity", GRAM, "no",
           fit="ghosted.recovery.gap_fits:fit_ghost", sequential=True, conditioning=True),
    Method("ghost-robust", "W on the non-sink tokens, the sink tokens mapped apart",
           "W fitted on non-sink tokens, ridge chosen on held-out calibration tokens; sink tokens (the first token "
           "of each sequence) get their own map (constant by default, affine optional)",
           GHOSTED, STREAM, "per --granularity", GRAM_SINK, "used if given",
           fit="ghosted.recovery.gap_fits:fit_ghost_robust", uses_sinks=True, sequential=True, conditioning=True),
    Method("ghost-auto", "per gap, ghost, ghost-robust or no operator, whichever predicts held-out windows better",
           "per gap, `ghost`, `ghost-robust` or no operator (plain pruning at that gap), whichever gives the lower "
           "next-token NLL on held-out calibration windows, so never worse than no recovery on those windows; "
           "reports what it chose, the three NLLs and why (with `--ghost-mode sequential`, gap by gap on the stream "
           "patched upstream with the choices made so far). How it compares with `ghost` on the reproduction grid: "
           "see below",
           GHOSTED, STREAM, "per --granularity", GRAM_SINK, "required",
           fit="ghosted.recovery.auto:fit_auto", scope="run", uses_sinks=True, sequential=True, conditioning=True),
    Method("linearpatch-diag", "LinearPatch: per-channel scaling",
           "LinearPatch's per-channel ratio of mean absolute activations",
           LINEARPATCH, STREAM, "per --granularity", "mean |activation| per channel", "no",
           fit="ghosted.recovery.gap_fits:fit_linearpatch_diag"),
    Method("linearpatch-rotate", "LinearPatch: per-channel scaling in a Hadamard basis",
           "LinearPatch's per-channel ratio of mean absolute activations in a Hadamard basis (also for widths "
           "such as 576 = 36·16)",
           LINEARPATCH, STREAM, "per --granularity", "mean |activation| per channel, rotated", "no",
           fit="ghosted.recovery.gap_fits:fit_linearpatch_rotate"),
    Method("ghost-lowrank", "the best rank-R correction M = U·V under the paper's objective (R = d/4)",
           "the best rank-R correction M = U·V under the paper's objective (reduced-rank regression, closed form "
           "from the same statistics), stored as two factors: 2·d·R parameters instead of d² (`--rank R`, "
           "default d/4; R = d is `ghost`)",
           GHOSTED, STREAM, "per --granularity", GRAM, "no",
           fit="ghosted.recovery.frontier:fit_lowrank"),
    Method("ghost-lowrank-robust", "ghost-lowrank on the non-sink tokens, the sink tokens mapped apart",
           "`ghost-lowrank` fitted on the non-sink tokens, the sinks mapped apart, like `ghost-robust`",
           GHOSTED, STREAM, "per --granularity", GRAM_SINK, "used if given",
           fit="ghosted.recovery.frontier:fit_lowrank_robust", uses_sinks=True),
    Method("replaceme-ls", "ReplaceMe: a map on the MLP output of the layer before the gap, folded into its weights",
           "ReplaceMe: least-squares map on the MLP output of layer s−1, folded into its `down_proj` (a plain "
           "checkpoint)",
           REPLACEME, BRANCH, "per block", "MLP-branch moments", "no",
           fit="ghosted.recovery.gap_fits:fit_replaceme_ls"),
    Method("replaceme-ls-robust", "replaceme-ls with the sink tokens mapped apart",
           "the same with the sink split, for a fair comparison",
           REPLACEME, BRANCH, "per block", "MLP-branch moments, sink tokens apart", "no",
           fit="ghosted.recovery.gap_fits:fit_replaceme_ls_robust", uses_sinks=True),
    Method("replaceme-cos", "ReplaceMe's cosine objective (needs millions of tokens; near no recovery on few)",
           "ReplaceMe's cosine objective, Adam from the identity, on a bounded token reservoir",
           REPLACEME, BRANCH, "per block", "a reservoir of MLP outputs and targets", "no",
           fit="ghosted.recovery.gap_fits:fit_replaceme_cos", reservoir=True, closed_form=False),
    Method("prunecomp", "Prune&Comp: a magnitude scale fused into the weights before the cut (a plain checkpoint)",
           "Prune&Comp: one magnitude scale per contiguous block, measured on the model already compensated "
           "upstream (channel mean of mean\\|stream entering e\\| / mean\\|stream entering s\\| per window) fused "
           "into the embeddings and every output projection before the cut: a plain checkpoint, no operator. "
           "`--select prunecomp:<criterion>` runs its iterative prune-and-compensate loop on top of any criterion",
           PRUNECOMP, WEIGHTS, "per block", "mean |stream| per channel, one pass per block", "no",
           fit="ghosted.recovery.frontier:fit_prunecomp", scope="run"),
    Method("layer-ls", "a copy of each block's first removed layer, its down-projection solved by least squares",
           "a copy of each removed block's first layer put back (as `streamline-layer`), trained by nothing: its "
           "attention and MLP input projections kept, its MLP down-projection solved by ridge least squares "
           "against the dense stream at the block's end (d_ff-wide float64 statistics, ridge chosen on held-out "
           "windows, blocks fitted in order on the stream patched upstream); kept only when it predicts the "
           "held-out windows significantly better than `ghost` (next-token NLL, `ghost-auto`'s rule), otherwise "
           "the result is `ghost`'s. Llama-like layers (a bias-free `down_proj` added to the stream)",
           GHOSTED, LAYER, "per block", "UᵀU (d_ff x d_ff), UᵀT, ‖T‖² of the copied layer's MLP, float64", "required",
           fit="ghosted.recovery.layer_ls:fit_layer_ls", scope="run", sequential=True,
           check="ghosted.recovery.layer_ls:check_layers"),
    Method("streamline-ffn", "LLM-Streamline: a small FFN block trained with MSE to replace each removed block",
           "LLM-Streamline's *trained* replacement: a pre-norm SwiGLU block (fresh, output zero-initialised) "
           "trained with MSE from the stream entering the block to the stream leaving it, one per contiguous "
           "block (AdamW, warm-up + cosine, seeded, on at most 32k captured calibration tokens), saved as a module "
           "with its weights",
           STREAMLINE, TRAINED, "per block", "captured stream pairs (≤ 32k tokens)", "used if given",
           fit="ghosted.recovery.frontier:fit_streamline_ffn", scope="run", closed_form=False),
    Method("streamline-layer", "LLM-Streamline: a copy of the first removed layer trained with MSE",
           "LLM-Streamline's *trained* replacement: a copy of the first removed layer, trained like "
           "`streamline-ffn`, saved as a plain checkpoint with one more layer",
           STREAMLINE, TRAINED, "per block", "captured stream pairs (≤ 32k tokens)", "used if given",
           fit="ghosted.recovery.frontier:fit_streamline_layer", scope="run", closed_form=False),
]}
DEFAULT = "ghost-auto"  # the default recovery of run, export, ghosted.fit and the app
REFERENCE_METHOD = next(n for n, m in REGISTRY.items() if m.role == REFERENCE)  # "dense": the unpruned model
BASELINE_METHOD = next(n for n, m in REGISTRY.items() if m.role == BASELINE)  # "none": plain pruning
TRAINED_METHODS = tuple(n for n, m in REGISTRY.items() if not m.closed_form)  # fitted by gradient steps
FITTED = tuple(name for name, m in REGISTRY.items() if m.fit)  # what recover() fits: ghosted.recovery.fitting.METHODS
# MethodResult.kind of each kind of method
RESULT_KINDS = {STREAM: "stream", BRANCH: "branch", WEIGHTS: "folded", TRAINED: "trained", LAYER: "layer",
                NONE: "none"}


def fit_function(method: Method) -> Callable:
    """The fit function of ``method``: ``method.fit`` itself, or the one it names, imported on first use."""
    if not method.fit:
        raise ValueError(f"{method.name!r} is not fitted (it is the unpruned model); choose from {', '.join(FITTED)}.")
    return method.fit if callable(method.fit) else _resolve(method.fit)


def check_model(method: Method, model) -> None:
    """Raise ``method``'s ValueError when it cannot fit ``model`` (nothing when it has no check)."""
    if method.check:
        (method.check if callable(method.check) else _resolve(method.check))(model)


def refusals(names, model) -> dict[str, str]:
    """name -> why, for the methods among ``names`` that cannot fit ``model`` (their check's message)."""
    out = {}
    for name in (n for n in names if n in REGISTRY):
        try:
            check_model(REGISTRY[name], model)
        except ValueError as err:
            out[name] = str(err)
    return out


@cache
def _resolve(dotted: str) -> Callable:
    module, _, function = dotted.partition(":")
    return getattr(importlib.import_module(module), function)


def role_of(name: str) -> str:
    """The role of method ``name`` (REFERENCE, BASELINE or RECOVERY); a name outside the registry
    (a model the user added to a comparison) counts as a recovery."""
    return REGISTRY[name].role if name in REGISTRY else RECOVERY


def label_of(name: str) -> str:
    """The label users read for method ``name`` (``pruned`` for ``none``); other names as they are."""
    return REGISTRY[name].display if name in REGISTRY else name


def with_role(names, *roles: str) -> list[str]:
    """The names among ``names`` whose role is one of ``roles``, in their order."""
    return [n for n in names if role_of(n) in roles]


def needing_heldout(methods) -> list[str]:
    """The methods among ``methods`` that cannot run without held-out calibration windows."""
    required = names_where(heldout="required")
    return [m for m in methods if m in required]


def names_where(**flags) -> tuple[str, ...]:
    """The names of the fitted methods whose fields equal ``flags`` (``names_where(uses_sinks=True)``)."""
    return tuple(name for name in FITTED if all(getattr(REGISTRY[name], k) == v for k, v in flags.items()))


def names_of(*kinds: str) -> tuple[str, ...]:
    """The names of the methods of these kinds, in table order."""
    return tuple(name for name, m in REGISTRY.items() if m.kind in kinds)


def paper_text(method: Method) -> str:
    """"ReplaceMe (Shopkhoev et al., 2025), arXiv 2505.02819", or "-" for no paper."""
    if method.paper is None:
        return "-"
    return method.paper.citation + (f", arXiv {method.paper.arxiv}" if method.paper.arxiv else "")


def help_text(names=None) -> str:
    """"name: summary. name: summary. ..." for the app's method help (every method, or those in ``names``)."""
    wanted = set(REGISTRY if names is None else names)
    return " ".join(f"{m.name}: {m.summary}." for m in REGISTRY.values() if m.name in wanted)


def methods_help() -> str:
    """The CLI's --methods help: every name, where to read about them, and the default."""
    return (f"comma list from: {', '.join(REGISTRY)} ('python -m ghosted methods' describes each; "
            f"{DEFAULT}, the default: {REGISTRY[DEFAULT].summary})")


README_START, README_END = "<!-- methods:start -->", "<!-- methods:end -->"


def markdown_table() -> str:
    """The README's method table (between the markers ``README_START`` and ``README_END``)."""
    rows = ["| name | what it is | kind | gaps | held-out windows | paper |", "|---|---|---|---|---|---|"]
    for m in REGISTRY.values():
        name = f"`{m.name}`" + (" (**default**)" if m.name == DEFAULT else "")
        rows.append(f"| {name} | {m.description} | {m.kind} | {m.gaps} | {m.heldout} | {paper_text(m)} |")
    return "\n".join(rows)


def update_readme(path="README.md") -> bool:
    """Write ``markdown_table()`` between the markers of ``path``; True if the file changed."""
    from ghosted.core.docblocks import write_block

    return write_block(path, README_START, README_END, markdown_table())


def text_table() -> str:
    """The registry as plain text for ``python -m ghosted methods``."""
    lines = []
    for m in REGISTRY.values():
        lines.append(f"{m.name}{' (default)' if m.name == DEFAULT else ''}")
        lines.append(f"    {m.summary}")
        lines.append(f"    kind: {m.kind}; gaps: {m.gaps}; statistics: {m.statistics}; held-out windows: {m.heldout}")
        lines.append(f"    paper: {paper_text(m)}")
    return "\n".join(lines)


@dataclass
class MethodResult:
    """One recovered model and what produced it: what every fit function returns."""

    method: str
    model: nn.Module
    kind: str  # "stream", "branch" or "none"
    operators: dict[Gap, torch.Tensor]  # float64 W (stream) or T (branch) per gap
    stats: dict[Gap, BoundaryStats]  # the statistics it was fitted on
    heldout: dict[Gap, BoundaryStats] | None
    solve_seconds: float
    calib_seconds: float
    notes: list[str] = field(default_factory=list)
    fits: dict[Gap, GapFit] = field(default_factory=dict)  # full description incl. sink maps
    choices: list[dict] = field(default_factory=list)  # what auto / ridge selection chose and why
    statistics: str = "computed"  # "reused": its calibration statistics came from the cache, no forward pass

"""Layer influence: every published layer-selection criterion, plus ghost recoverability.

Conventions: layers are 0-based; boundary b is the residual stream entering layer b, and boundary L
is the last layer's output *before* the final norm (never Hugging Face's normed last hidden state).
A block (start, n) removes layers start .. start+n-1; its similarity criteria compare boundaries
``start`` and ``end = start + n``.

All similarity criteria and the recoverability score come from ONE forward pass over the calibration
windows (``ghosted.selection.sums``); padding never counts. Criteria that run the model once per
candidate layer (removal perplexity, SLEB) or need a backward pass (Taylor+) live in
``ghosted.selection.removal``. Choosing layers from a report is ``ghosted.selection.rules.select``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from ghosted.selection import removal
from ghosted.models.architecture import hidden_size, num_layers
from ghosted.models.capture import tap
from ghosted.core.progress import Progress, counted
from ghosted.selection.sums import (GramSums, SimilaritySums, TokenWeightedSums, gram_bytes, recoverability,
                                    stack_boundaries)


@dataclass(frozen=True)
class Criterion:
    """What one criterion measures, and which end of its ranking is removed first."""

    name: str
    kind: str  # "block": one value per contiguous (start, n); "layer": one value per layer
    prune: str  # "highest" or "lowest": the values that mark layers to remove
    cost: str  # "pass" (the shared forward pass), "heldout" (+ a pass over held-out windows),
    # "per-layer" (one forward pass per candidate layer) or "gradient" (one backward pass)
    label: str  # what the value is, in words
    origin: str  # who defined it


CRITERIA: dict[str, Criterion] = {c.name: c for c in [
    Criterion("streamline_cosine", "block", "highest", "pass",
              "mean per-token cosine (hidden axis) between the inputs of layers start and start+n",
              "LLM-Streamline"),
    Criterion("angular_all", "block", "lowest", "pass",
              "mean over all tokens of the angular distance arccos(cos)/π between the inputs of layers "
              "start and start+n", "Gromov et al., every token"),
    Criterion("angular_last", "block", "lowest", "pass",
              "mean over sequences of arccos(cos)/π between the inputs of layers start and start+n on "
              "the last non-padding token", "Gromov et al. (as published)"),
    Criterion("seqcos_streamline", "block", "highest", "pass",
              "SEQUENCE-AXIS cosine (torch.cosine_similarity default dim=1 on (B, T, d): along the "
              "sequence per channel, mean over channels and sequences) between the inputs of layers "
              "start and start+n; starts 1..L-n-1 only", "the paper's official code, Streamline rule"),
    Criterion("recoverability", "block", "lowest", "pass",
              "ghost boundary error ‖X·M − Δ‖²/‖Δ‖² left after the ghost operator, on the calibration "
              "tokens (X = input of start, Δ = input of start+n − X); tokens weigh by ‖δ_t‖², so a block "
              "whose Δ is mostly a few attention-sink tokens looks recoverable: choose with "
              "recoverability_token", "Ghosted"),
    Criterion("recoverability_token", "block", "lowest", "pass",
              "mean over tokens of ‖x_t·M − δ_t‖²/‖y_t‖² after the ghost operator M (y = input of "
              "start+n): every token counts equally, so attention-sink tokens whose huge Δ dominates "
              "‖Δ‖² cannot make a block look recoverable", "Ghosted"),
    Criterion("recoverability_heldout", "block", "lowest", "heldout",
              "ghost boundary error ‖X·M − Δ‖²/‖Δ‖² on held-out windows, M fitted on the calibration "
              "tokens", "Ghosted"),
    Criterion("block_influence", "layer", "lowest", "pass",
              "Block Influence 1 − mean per-token cosine between the layer's input and output", "ShortGPT"),
    Criterion("seqcos_shortgpt", "layer", "highest", "pass",
              "SEQUENCE-AXIS cosine between the layer's input and output; the last layer is never "
              "chosen", "the paper's official code, ShortGPT rule"),
    Criterion("ppl_single", "layer", "lowest", "per-layer",
              "calibration perplexity of the model without this one layer", "Shortened-LLaMA (PPL)"),
    Criterion("taylor", "layer", "lowest", "gradient",
              "Taylor score Σ|W·∂L/∂W| over the layer's weights; layers 0-3 and the last two are never "
              "chosen (the '+')", "Shortened-LLaMA (Taylor+)"),
    Criterion("sleb", "layer", "lowest", "per-layer",
              "step at which SLEB's greedy search removes the layer (lowest calibration NLL at each "
              "step; the first and last alive layers stay)", "SLEB"),
]}
SINGLE_PASS = [name for name, c in CRITERIA.items() if c.cost in ("pass", "heldout")]
# The names people use for the criteria (papers, README). streamline and shortgpt are the paper's
# selections as its released code computes them (sequence-axis cosine), as in the reproduction grid.
ALIASES = {
    "streamline": "seqcos_streamline",
    "shortgpt": "seqcos_shortgpt",
    "bi": "block_influence",
    "angular": "angular_last",
    "ppl": "ppl_single",
    "taylor+": "taylor",
}


ITERATIVE = "prunecomp:"  # prefix of a selection rule: Prune&Comp's prune-and-compensate loop on a criterion


def resolve_criterion(name: str, iterative: bool = False) -> str:
    """The criterion a name or alias stands for (``"shortgpt"`` -> ``"seqcos_shortgpt"``); ValueError if unknown.

    ``iterative``: also accept ``"prunecomp:<criterion>"`` (a selection rule, not a one-pass criterion).
    """
    if not isinstance(name, str):
        raise TypeError(f"A criterion is a name such as 'recoverability', not {type(name).__name__}.")
    key = name.strip().lower()
    if iterative and key.startswith(ITERATIVE):
        return ITERATIVE + resolve_criterion(key[len(ITERATIVE):])
    if key in CRITERIA or key in ALIASES:
        return ALIASES.get(key, key)
    raise ValueError(f"Unknown criterion {name!r}; choose from {', '.join(CRITERIA)}, or an alias: "
                     f"{alias_text()}.")


def alias_text() -> str:
    """The aliases in words, for --help and error messages: "streamline = seqcos_streamline, ..."."""
    return ", ".join(f"{alias} = {name}" for alias, name in ALIASES.items())
_SIMILARITY_BLOCKS = {"streamline_cosine": "cosine", "angular_all": "angular",
                      "angular_last": "angular_last", "seqcos_streamline": "sequence_cosine"}
# Criteria that need Gram blocks: their memory and time grow with recoverability_n_values.
RECOVERABILITY = {"recoverability", "recoverability_heldout", "recoverability_token"}


@dataclass
class InfluenceConfig:
    """Which criteria to compute, and on how much text."""

    metrics: list[str] = field(default_factory=lambda: list(SINGLE_PASS))  # names in CRITERIA
    n_values: list[int] | None = None  # block sizes n for block criteria; None: every n in 1..L-1
    recoverability_n_values: list[int] | None = None  # block sizes for recoverability only (its
    # memory and time grow with them); None: the same as n_values
    batch_size: int = 4  # windows per forward pass; memory grows with it, the sums do not
    eps: float = 1e-6  # ridge of the ghost solve (as ``recover``)
    solver: str = "solve"  # ghost solver, "solve" or "pinv" (as ``recover``)
    candidate_windows: int | None = 8  # windows for ppl_single and sleb (one pass per candidate);
    # None: all. Shortened-LLaMA scores on 10 × 128 tokens, SLEB on a few 2048-token windows
    sleb_steps: int | None = None  # layers SLEB removes; None: the largest n in n_values (or L // 4)
    max_gram_gib: float = 4.0  # refuse recoverability Gram blocks beyond this (restrict the n values);
    # SmolLM2, every n: 1.3 GB for recoverability, 5.0 GB with recoverability_token


@dataclass
class InfluenceReport:
    """Criterion values as tidy frames: ``blocks`` (metric, start, n, end, value) and
    ``layers`` (metric, layer, value), plus ``meta`` (protocol, timings, memory)."""

    blocks: pd.DataFrame
    layers: pd.DataFrame
    num_layers: int
    meta: dict = field(default_factory=dict)

    def matrix(self, metric: str) -> pd.DataFrame:
        """A block criterion as a (start × n) table (NaN where start + n > L)."""
        rows = self.blocks[self.blocks.metric == metric]
        if rows.empty:
            raise KeyError(f"no block values for {metric!r}; present: {sorted(set(self.blocks.metric))}")
        return rows.pivot(index="start", columns="n", values="value")

    def layer_values(self, metric: str) -> pd.Series:
        """A layer criterion as a Series indexed by layer."""
        rows = self.layers[self.layers.metric == metric]
        if rows.empty:
            raise KeyError(f"no layer values for {metric!r}; present: {sorted(set(self.layers.metric))}")
        return rows.set_index("layer")["value"]

    @property
    def metrics(self) -> list[str]:
        return sorted(set(self.blocks.metric) | set(self.layers.metric))

    def to_dict(self) -> dict:
        """JSON-ready: meta, the criteria's definitions, and both frames as records (NaN -> null)."""
        return {"meta": self.meta, "num_layers": self.num_layers,
                "criteria": {m: asdict(CRITERIA[m]) for m in self.metrics if m in CRITERIA},
                "blocks": _records(self.blocks), "layers": _records(self.layers)}

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write blocks.csv, layers.csv and influence.json into ``out_dir``; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "blocks.csv", out / "layers.csv", out / "influence.json"]
        self.blocks.to_csv(paths[0], index=False)
        self.layers.to_csv(paths[1], index=False)
        paths[2].write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return paths


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def resolve_n_values(n_values, total: int) -> list[int]:
    """Validated, sorted block sizes (1 <= n <= L-1); None means all of them."""
    values = sorted(set(range(1, total) if n_values is None else (int(n) for n in n_values)))
    bad = [n for n in values if not 1 <= n <= total - 1]
    if bad or not values:
        raise ValueError(f"Block sizes must be in 1..{total - 1} for this {total}-layer model; got {bad or values}.")
    return values


def block_list(n_values: list[int], total: int) -> list[tuple[int, int]]:
    """Every (start, end) with end - start in n_values and end <= L."""
    return [(start, start + n) for n in n_values for start in range(total - n + 1)]


def influence(model: nn.Module, windows, config: InfluenceConfig | None = None, heldout=None,
              progress: Progress | None = None) -> InfluenceReport:
    """Every requested criterion on ``windows`` (a ``TokenWindows``); ``model`` is never changed.

    Example:
        >>> report = influence(model, calibration_windows(tok, "bundled:news", 32, 256),
        ...                    InfluenceConfig(n_values=[7, 11]), heldout=held)
        >>> report.matrix("recoverability")            # start × n, lower recovers better
        >>> select(report, "recoverability", 7)        # ([20, ..., 26], "why")
    """
    cfg = config or InfluenceConfig()
    total = num_layers(model)
    _check_metrics(cfg.metrics, heldout)
    n_values = resolve_n_values(cfg.n_values, total)
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    block_rows, layer_rows, meta = [], [], {}
    if any(CRITERIA[m].cost in ("pass", "heldout") for m in cfg.metrics):
        b, lay, info = _single_pass_criteria(model, windows, heldout, cfg, n_values, seconds, progress)
        block_rows += b
        layer_rows += lay
        meta.update(info)
    wanted = [m for m in cfg.metrics if CRITERIA[m].cost in ("per-layer", "gradient")]
    if wanted:
        steps = cfg.sleb_steps or (max(n_values) if cfg.n_values else max(1, total // 4))
        rows, info = removal.removal_criteria(model, windows, wanted, cfg.batch_size, cfg.candidate_windows, steps,
                                              progress)
        layer_rows += rows
        seconds.update(info.pop("seconds"))
        meta.update(info)
    meta.update(layers=total, hidden_size=hidden_size(model), n_values=n_values, metrics=list(cfg.metrics),
                protocol=dict(getattr(windows, "protocol", {})), config=asdict(cfg), seconds=seconds,
                total_seconds=round(time.perf_counter() - started, 3))
    blocks = pd.DataFrame(block_rows, columns=["metric", "start", "n", "end", "value"])
    layers = pd.DataFrame(layer_rows, columns=["metric", "layer", "value"])
    return InfluenceReport(blocks=blocks, layers=layers, num_layers=total, meta=meta)


def _check_metrics(metrics: list[str], heldout) -> None:
    unknown = [m for m in metrics if m not in CRITERIA]
    if unknown:
        raise ValueError(f"Unknown criteria {unknown}; choose from {', '.join(CRITERIA)}.")
    if "recoverability_heldout" in metrics and heldout is None:
        raise ValueError("recoverability_heldout needs held-out windows (heldout=...).")


def _single_pass_criteria(model, windows, heldout, cfg: InfluenceConfig, n_values, seconds, progress
                          ) -> tuple[list, list, dict]:
    """Block and layer rows of every requested one-pass criterion, and what the pass saw."""
    total, dim = num_layers(model), hidden_size(model)
    wanted = set(cfg.metrics)
    rec_n = n_values if cfg.recoverability_n_values is None else resolve_n_values(cfg.recoverability_n_values, total)
    blocks = block_list(rec_n, total) if wanted & RECOVERABILITY else []
    weighted = "recoverability_token" in wanted
    needed = gram_bytes(blocks, dim) + (TokenWeightedSums.bytes_for(blocks, dim) if weighted else 0)
    _check_gram_budget(needed, rec_n, cfg.max_gram_gib)
    clock = time.perf_counter()
    sims, grams, token_sums = _stream(model, windows, total, dim, blocks, bool(wanted - RECOVERABILITY),
                                      cfg.batch_size, "calibration pass", progress, weighted)
    seconds["single_pass"] = round(time.perf_counter() - clock, 3)
    held_grams = None
    if "recoverability_heldout" in wanted:
        clock = time.perf_counter()
        _, held_grams, _ = _stream(model, heldout, total, dim, blocks, False, cfg.batch_size, "held-out pass",
                                   progress)
        seconds["heldout_pass"] = round(time.perf_counter() - clock, 3)
    block_rows, layer_rows = _similarity_rows(sims, wanted, n_values, total) if sims else ([], [])
    if grams is not None:
        clock = time.perf_counter()
        scores = recoverability(grams, held_grams, blocks, eps=cfg.eps, solver=cfg.solver, weighted=token_sums)
        seconds["recoverability_solve"] = round(time.perf_counter() - clock, 3)
        for metric in ("recoverability", "recoverability_heldout", "recoverability_token"):
            if metric in wanted:
                block_rows += [(metric, s, e - s, e, v[metric]) for (s, e), v in scores.items()]
    info = {"tokens": (sims or grams).tokens, "sequences": sims.sequences if sims else None,
            "gram_bytes": needed, "heldout_tokens": held_grams.tokens if held_grams else None,
            "recoverability_n_values": rec_n if blocks else []}
    return block_rows, layer_rows, info


def _check_gram_budget(needed: int, rec_n: list[int], max_gib: float) -> None:
    if needed > max_gib * 2**30:
        raise ValueError(f"Recoverability for n in {rec_n} needs {needed / 2**30:.1f} GiB of float64 "
                         f"Gram blocks (8·d² bytes per boundary pair), over max_gram_gib={max_gib}. Restrict "
                         f"n_values or recoverability_n_values (e.g. [7, 11]) or raise the limit.")


def _similarity_rows(sims: SimilaritySums, wanted: set[str], n_values, total: int) -> tuple[list, list]:
    """Block rows (metric, start, n, end, value) and layer rows (metric, layer, value) from the sums."""
    means = {k: v.cpu() for k, v in sims.means().items()}  # (K, K) each
    block_rows, layer_rows = [], []
    for metric, key in _SIMILARITY_BLOCKS.items():
        if metric in wanted:
            block_rows += [(metric, s, e - s, e, float(means[key][s, e])) for s, e in block_list(n_values, total)]
    if "block_influence" in wanted:
        layer_rows += [("block_influence", i, 1.0 - float(means["cosine"][i, i + 1])) for i in range(total)]
    if "seqcos_shortgpt" in wanted:
        layer_rows += [("seqcos_shortgpt", i, float(means["sequence_cosine"][i, i + 1])) for i in range(total)]
    return block_rows, layer_rows


def _stream(model, windows, total: int, dim: int, blocks, similar: bool, batch_size: int, label: str,
            progress, weighted: bool = False
            ) -> tuple[SimilaritySums | None, GramSums | None, TokenWeightedSums | None]:
    """One pass capturing boundaries 0..L; adds every batch to the similarity and Gram sums."""
    ids = windows.input_ids
    mask = windows.attention_mask if windows.attention_mask is not None else torch.ones_like(ids)
    sims = grams = token_sums = None
    with tap(model, boundaries=range(total + 1)) as handle:
        for start in counted(range(0, ids.shape[0], batch_size), progress, label):
            got = handle.run(ids[start:start + batch_size], mask[start:start + batch_size])
            device = got.resid[0].device
            stack = stack_boundaries(got.resid, total + 1, device)  # (B, T, K, d)
            valid = mask[start:start + batch_size].to(device).bool()  # (B, T)
            if similar:
                sims = sims or SimilaritySums(total + 1, device)
                sims.add(stack, valid)
            if blocks:
                grams = grams or GramSums(blocks, total + 1, dim, device)
                grams.add(stack, valid)
            if blocks and weighted:
                token_sums = token_sums or TokenWeightedSums(blocks, dim, device)
                token_sums.add(stack, valid)
    return sims, grams, token_sums

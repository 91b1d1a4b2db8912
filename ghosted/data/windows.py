"""Token windows: the batches cut from a source's tokens for calibration and perplexity evaluation.

Calibration draws ``n_seqs`` random, non-overlapping windows from the calibration part of a source
(``ghosted.data.sources``); evaluation reads consecutive windows from its evaluation part, so every run
scores the same text. ``split_calibration`` holds the last windows of a calibration draw out of the fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ghosted.data.sources import HubSpec, TextSource, _part_ids, describe_source, resolve_source


@dataclass
class TokenWindows:
    """A batch of token windows plus the protocol that produced them (for reports)."""

    input_ids: torch.Tensor  # (N, T) long
    attention_mask: torch.Tensor  # (N, T) long, all ones
    protocol: dict = field(default_factory=dict)  # source, part, n_windows, seq_len, ...


def bos_token_id(tokenizer) -> int | None:
    """The BOS id if the tokenizer normally prepends it (encode("a")[0] == bos), else None."""
    bos = tokenizer.bos_token_id
    ids = tokenizer.encode("a") if bos is not None else []
    return bos if len(ids) > 0 and ids[0] == bos else None


def _windows(chunks: torch.Tensor, bos: int | None, protocol: dict) -> TokenWindows:
    """Prepend BOS if needed and fill in the shared protocol fields."""
    if bos is not None:
        col = torch.full((chunks.shape[0], 1), bos, dtype=torch.long)  # (N, 1)
        chunks = torch.cat([col, chunks], dim=1)  # (N, T)
    n, t = chunks.shape
    protocol.update(n_windows=n, seq_len=t, tokens=n * t, scored_tokens=n * (t - 1),
                    bos="prepended" if bos is not None else "none")
    return TokenWindows(chunks.contiguous(), torch.ones_like(chunks), protocol)


def _prepare(tokenizer, source, part: str, count: int, seq_len: int
             ) -> tuple[torch.Tensor, str, str, int | None, int]:
    """Validate sizes; return (part ids (L,), split, source name, BOS id, text tokens/window)."""
    if count < 1 or seq_len < 2:
        raise ValueError(f"Window count must be >= 1 and seq_len >= 2 (got {count}, {seq_len}).")
    ids, split, name = _part_ids(tokenizer, source, part)
    bos = bos_token_id(tokenizer)
    return ids, split, name, bos, seq_len - (bos is not None)


def calibration_windows(tokenizer, source: str | os.PathLike | TextSource = "bundled:news",
                        n_seqs: int = 32, seq_len: int = 256, seed: int = 0) -> TokenWindows:
    """n_seqs random, non-overlapping windows of seq_len tokens from the calibration part.

    The part is tokenised once (documents joined by blank lines, no special tokens); windows
    are aligned slots after a random offset, picked by a torch.Generator seeded with `seed`,
    so the same seed always gives the same batch.
    """
    ids, split, name, bos, width = _prepare(tokenizer, source, "calibration", n_seqs, seq_len)
    available, slots = ids.numel(), ids.numel() // width
    if slots < n_seqs:
        raise ValueError(f"{describe_source(source, 'calibration')} has {available} tokens: "
                         f"{n_seqs} windows of {seq_len} need {n_seqs * width}. Lower n_seqs "
                         f"(at most {slots} at this seq_len) or seq_len, or use a longer source.")
    gen = torch.Generator().manual_seed(seed)
    offset = int(torch.randint(0, available - slots * width + 1, (1,), generator=gen))
    grid = ids[offset:offset + slots * width].view(slots, width)  # (slots, width)
    chunks = grid[torch.randperm(slots, generator=gen)[:n_seqs]]  # (n_seqs, width)
    return _windows(chunks, bos, dict(source=name, part=split, seed=seed,
                                      available_tokens=available, sampling="random windows"))


def evaluation_part(source: str | os.PathLike | TextSource, calibration_source=None) -> str:
    """Which part of ``source`` evaluation reads: "evaluation" (its last 20 %) when calibration reads
    the same source, or when the calibration source is not known (None); "whole" for a separate local
    source. Hub datasets always use their own evaluation split."""
    if calibration_source is None:
        return "evaluation"
    ev = resolve_source(source)
    if isinstance(ev, HubSpec):
        return "evaluation"
    cal = resolve_source(calibration_source)
    same = isinstance(cal, TextSource) and (cal.name == ev.name or cal.fingerprint == ev.fingerprint)
    return "evaluation" if same else "whole"


def evaluation_windows(tokenizer, source: str | os.PathLike | TextSource = "bundled:wiki",
                       n_tokens: int = 16384, seq_len: int = 512,
                       calibration_source: str | os.PathLike | TextSource | None = None) -> TokenWindows:
    """floor(n_tokens / seq_len) consecutive non-overlapping windows from the evaluation part.

    Windows start at the first token of the part ``evaluation_part`` names: the last 20 % of the
    documents when ``calibration_source`` is the same source (or None), the whole source from its
    start when calibration reads another one, or the hub's test/validation split; so every run
    scores exactly the same text, and the protocol's ``part`` says which.
    """
    part = evaluation_part(source, calibration_source)
    ids, split, name, bos, width = _prepare(tokenizer, source, part, n_tokens, seq_len)
    n_windows, available = max(1, n_tokens // seq_len), ids.numel()
    if available < n_windows * width:
        fix = (f"n_tokens (at most {(available // width) * seq_len})" if available >= width
               else f"seq_len (at most {available + (bos is not None)})")
        raise ValueError(f"{describe_source(source, part)} has {available} tokens: "
                         f"{n_windows} windows of {seq_len} need {n_windows * width}. Lower "
                         f"{fix}, or use a longer source.")
    chunks = ids[: n_windows * width].view(n_windows, width).clone()  # (n_windows, width), not a view of the cache
    return _windows(chunks, bos, dict(source=name, part=split, available_tokens=available,
                                      sampling="consecutive non-overlapping"))


def capped_evaluation_windows(tokenizer, source: str, n_tokens: int, seq_len: int,
                              calibration_source: str | None = None) -> TokenWindows:
    """``evaluation_windows``, with ``n_tokens`` lowered to what the source's evaluation part holds
    (the whole source when calibration reads another one)."""
    probe = evaluation_windows(tokenizer, source, seq_len, seq_len, calibration_source)
    width = probe.input_ids.size(1) - (probe.protocol.get("bos") == "prepended")
    most = (probe.protocol["available_tokens"] // width) * seq_len
    return evaluation_windows(tokenizer, source, min(n_tokens, most), seq_len, calibration_source)


def split_calibration(windows: TokenWindows, heldout: int) -> tuple[TokenWindows, TokenWindows | None]:
    """The first windows fit, the last ``heldout`` are kept for held-out errors (disjoint slots)."""
    if heldout <= 0:
        return windows, None
    n = windows.input_ids.size(0) - heldout
    proto = dict(windows.protocol)

    def part(sl, name, count):
        return TokenWindows(windows.input_ids[sl], windows.attention_mask[sl],
                            {**proto, "n_windows": count, "role": name,
                             "tokens": count * windows.input_ids.size(1),
                             "scored_tokens": count * (windows.input_ids.size(1) - 1)})
    return part(slice(0, n), "fit", n), part(slice(n, None), "held-out", heldout)

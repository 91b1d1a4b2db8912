"""Named perplexity protocols: which evaluation texts, window length and token count a number is for.

Why: a perplexity means something only next to its protocol, and comparing with the paper needs
the paper's: WikiText-2 (test), PTB (validation) and C4 (validation), whole splits, 2048-token
windows. Offline, the default is the bundled Wikipedia sample in 512-token windows.

  * ``paper``: the three hub texts of the paper's tables (``ghosted.data.sources.HUB_SHORTCUTS``), each
    scored whole in 2048-token windows; a text that cannot be loaded (offline) is skipped with one
    line, and when none can, the run stops with one message that says to use ``bundled``.
  * ``bundled``: ``bundled:wiki``'s evaluation part in 512-token windows (``eval_tokens`` of it).
  * no name: the evaluation text, tokens and window given one by one; reported as ``bundled`` when
    they equal that preset's text and window, else as ``custom``.

Example:
    >>> proto = resolve_protocol("paper", "bundled:wiki", 16384, 512)
    >>> windows, skipped = protocol_windows(tokenizer, proto)   # {source: TokenWindows}, {source: why}
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ghosted.core.progress import Say
from ghosted.data.sources import SourceUnavailableError
from ghosted.data.windows import TokenWindows, evaluation_windows


@dataclass(frozen=True)
class EvalProtocol:
    """Evaluation texts and windows of a perplexity protocol."""

    name: str  # "paper", "bundled" or "custom"
    sources: tuple[str, ...]  # evaluation texts, first one is the headline perplexity
    seq_len: int  # window length in tokens
    tokens: int | None  # tokens per text; None: the whole evaluation split
    note: str = ""  # one line for reports


PROTOCOLS = {
    "paper": EvalProtocol("paper", ("wikitext-2-raw-v1", "ptb", "c4"), 2048, None,
                          "the paper's tables: WikiText-2 test, PTB validation, C4 validation, whole splits, "
                          "2048-token windows (online)"),
    "bundled": EvalProtocol("bundled", ("bundled:wiki",), 512, 16384,
                            "offline default: the bundled Wikipedia sample's evaluation part, 512-token windows"),
}


def resolve_protocol(name: str, source: str, tokens: int, seq_len: int) -> EvalProtocol:
    """The preset ``name`` (``tokens`` sets the bundled preset's size), or the single text given."""
    if name:
        if name not in PROTOCOLS:
            raise ValueError(f"Unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)}.")
        preset = PROTOCOLS[name]
        return preset if preset.tokens is None else EvalProtocol(preset.name, preset.sources, preset.seq_len,
                                                                   tokens, preset.note)
    bundled = PROTOCOLS["bundled"]
    same = (source,) == bundled.sources and seq_len == bundled.seq_len
    return EvalProtocol("bundled" if same else "custom", (source,), seq_len, tokens,
                        bundled.note if same else f"{source}, {seq_len}-token windows")


def protocol_windows(tokenizer, protocol: EvalProtocol, say: Say | None = None,
                     calibration_source: str | None = None) -> tuple[dict[str, TokenWindows], dict[str, str]]:
    """({source: windows} of every text that loads, {source: why not} for the others).

    A text that is also the calibration source is read from its evaluation part (its last 20 %);
    any other text is read whole, from its start.

    A preset's unloadable text is skipped with one line; if no text loads, one error says why.
    A single text given by the user fails as it always did (its own error).
    """
    if protocol.name not in PROTOCOLS or len(protocol.sources) == 1:
        return {protocol.sources[0]: _windows(tokenizer, protocol.sources[0], protocol, calibration_source)}, {}
    windows, skipped = {}, {}
    for source in protocol.sources:
        try:
            windows[source] = _windows(tokenizer, source, protocol, calibration_source)
        except SourceUnavailableError as err:
            skipped[source] = str(err).split(". ")[0]
            (say or _to_stderr)(f"protocol {protocol.name}: skipping {source}: {skipped[source]}")
    if not windows:
        raise SourceUnavailableError(
            f"The {protocol.name} protocol needs {', '.join(protocol.sources)} from the Hugging Face hub and "
            f"none could be loaded (offline?). Offline, use --protocol bundled.")
    return windows, skipped


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _windows(tokenizer, source: str, protocol: EvalProtocol, calibration_source: str | None) -> TokenWindows:
    if protocol.tokens is not None:
        return evaluation_windows(tokenizer, source, protocol.tokens, protocol.seq_len, calibration_source)
    from ghosted.data.windows import capped_evaluation_windows  # the whole split, in whole windows

    return capped_evaluation_windows(tokenizer, source, 1 << 40, protocol.seq_len, calibration_source)


def describe_protocol(protocol: EvalProtocol, skipped: dict[str, str] | None = None) -> dict:
    """The protocol as a report field: name, texts, window, tokens and what was skipped."""
    return {"name": protocol.name, "sources": list(protocol.sources), "seq_len": protocol.seq_len,
            "tokens": "whole split" if protocol.tokens is None else protocol.tokens, "note": protocol.note,
            "skipped": dict(skipped or {})}

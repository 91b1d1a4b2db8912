"""Text sources for calibration and perplexity evaluation: reading them, splitting them, tokenising a part.

Sources (one string each): "bundled:news" (Lee news corpus from gensim's wheel; default
calibration source), "bundled:wiki" (gensim's Wikipedia sample, markup stripped; default
evaluation source), a local plain-text file (documents split by blank lines, else one per
line) or ".jsonl" ("text" field per line) file, in-memory text (TextSource.from_string, app uploads),
and "hf:NAME[:CONFIG]" or the shortcuts "wikitext-2-raw-v1", "c4", "ptb" (optional `datasets`).

The token windows cut from a source are ``ghosted.data.windows``.

Calibration and evaluation never share text. When both read the same non-hub source, it is split at
a document boundary: calibration gets the first 80 % of its documents (file order), evaluation the
last 20 %. A separate evaluation source is read whole, from its start (the protocol's ``part`` is
then "whole"). Local files are read by content whatever their extension (UTF-8, byte-order mark
dropped); only ``.jsonl`` is parsed as JSON lines. Hub datasets use their own splits, as pruning
papers do: calibration reads "train", evaluation WikiText-2 raw "test", PTB text-only "validation"
or C4 en "validation".
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import torch

from ghosted.data import bundled as wiki

CALIBRATION_FRACTION = 0.8  # first 80 % of documents calibrate, the last 20 % evaluate
PARTS = ("calibration", "evaluation", "whole")  # "whole": a separate evaluation source, from its start
_BUNDLED = {  # name -> human label; files and cleaning live in ghosted.data.bundled
    "bundled:news": "Lee news corpus (gensim)",
    "bundled:wiki": "Wikipedia sample (gensim enwiki dump, cleaned)",
}
_TOKEN_CACHE: dict[tuple, tuple[torch.Tensor, str]] = {}  # (tok, source, part) -> (ids, split)


class SourceUnavailableError(RuntimeError):
    """A source exists in principle but cannot be read here (missing package, offline)."""


@dataclass(frozen=True)
class HubSpec:
    """How to read one Hugging Face dataset and split it like the pruning literature."""

    path: str  # dataset repo id, e.g. "wikitext"
    config: str | None = None  # dataset config, e.g. "wikitext-2-raw-v1"
    text_field: str = "text"  # column holding the text
    eval_splits: tuple[str, ...] = ("test", "validation")  # first split that loads wins
    joiner: str = "\n\n"  # how rows are joined before tokenising (PTB/C4 papers use " ")
    streaming: bool = False  # stream instead of downloading the whole split (C4)
    max_docs: int | None = None  # rows read per split (None: all)

    @property
    def name(self) -> str:  # "hf:NAME[:CONFIG]", as a user would type it
        return f"hf:{self.path}" + (f":{self.config}" if self.config else "")


HUB_SHORTCUTS = {
    "wikitext-2-raw-v1": HubSpec("wikitext", "wikitext-2-raw-v1", eval_splits=("test",)),
    "ptb": HubSpec("ptb_text_only", "penn_treebank", "sentence", ("validation",), " "),
    "c4": HubSpec("allenai/c4", "en", eval_splits=("validation",), joiner=" ",
                  streaming=True, max_docs=1100),
}


@dataclass(frozen=True)
class TextSource:
    """An ordered list of documents with a name; split 80/20 into calibration/evaluation."""

    name: str  # what the user called it: "bundled:news", a file name, an upload name
    documents: tuple[str, ...]  # non-empty, stripped documents in file order
    label: str = ""  # human description; defaults to the name

    @classmethod
    def from_string(cls, name: str, text: str) -> TextSource:
        """Parse in-memory text (e.g. an upload): JSON lines if name ends in .jsonl, else plain text."""
        text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not text
        docs = _parse_jsonl(name, text) if name.lower().endswith(".jsonl") else _parse_txt(text)
        if not docs:
            raise ValueError(f"{name}: the text is empty (or whitespace only). Provide some "
                             "documents: plain text, or JSON lines with a 'text' field.")
        return cls(name, tuple(docs), f"{os.path.basename(name)} (local text)")

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TextSource:
        """Read a local text file by its content, whatever its extension (.txt, .md, .cor, none);
        ``.jsonl`` files are JSON lines. UTF-8, with or without a byte-order mark."""
        return cls.from_string(str(path), read_text_file(path))

    def part(self, part: str) -> tuple[str, ...]:
        """Documents of the calibration (first 80 %) or evaluation (last 20 %) part, or all of them."""
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, not {part!r}")
        if part == "whole":
            return self.documents
        n = len(self.documents)
        if n < 2:
            raise ValueError(f"{self.name}: only one document; calibration and evaluation need "
                             "at least two (separate documents by blank lines or one per line).")
        cut = min(max(int(n * CALIBRATION_FRACTION), 1), n - 1)
        return self.documents[:cut] if part == "calibration" else self.documents[cut:]

    @cached_property
    def fingerprint(self) -> str:
        """Content hash, so in-memory token caches never mix two texts with one name."""
        return hashlib.sha1("\x00".join(self.documents).encode("utf-8")).hexdigest()


def _parse_txt(text: str) -> list[str]:
    """Documents separated by blank lines; without any blank line, one document per line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    blocks = re.split(r"\n[ \t]*\n", text) if re.search(r"\n[ \t]*\n", text) else text.split("\n")
    return [b.strip() for b in blocks if b.strip()]


def _parse_jsonl(name: str, text: str) -> list[str]:
    """One JSON object per non-blank line, each with a string 'text' field."""
    docs = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name}, line {lineno}: not valid JSON ({err.msg}).") from err
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f"{name}, line {lineno}: expected an object with a string "
                             "'text' field, e.g. {\"text\": \"...\"}.")
        if row["text"].strip():
            docs.append(row["text"].strip())
    return docs


@cache
def _bundled(name: str) -> TextSource:
    """Load a bundled source once per process (wiki: from the on-disk cleaned cache)."""
    return TextSource(name, tuple(wiki.bundled_documents(name)), _BUNDLED[name])


def list_bundled_sources() -> list[str]:
    """Names of the sources that ship with the install (no network needed)."""
    return list(_BUNDLED)


def resolve_source(source: str | os.PathLike | TextSource) -> TextSource | HubSpec:
    """Turn a source name into a TextSource (local/bundled) or a HubSpec (hub datasets)."""
    if isinstance(source, (TextSource, HubSpec)):
        return source
    name = os.fspath(source).strip()
    if name in _BUNDLED:
        return _bundled(name)
    if name in HUB_SHORTCUTS:
        return HUB_SHORTCUTS[name]
    if name.startswith("hf:") and len(name) > 3:
        path, _, config = name[3:].partition(":")
        return HubSpec(path, config or None)
    path = Path(name).expanduser()
    if path.exists() or _looks_like_path(name):
        return TextSource.from_file(path)
    raise ValueError(f"Unknown text source {name!r}. Use one of {list_bundled_sources()}, a "
                     "text file (plain text, or .jsonl with a 'text' field), 'hf:NAME[:CONFIG]', or one of "
                     f"{list(HUB_SHORTCUTS)}.")


_DATASET_ID = re.compile(r"^[A-Za-z0-9][\w\-]*(\.[\w\-]+)*(/[A-Za-z0-9][\w\-]*(\.[\w\-]+)*)?$")  # hub repo id
_DATASET_CONFIG = re.compile(r"^[\w.\-]*$")
_LOCAL_BUILDERS = {"arrow", "audiofolder", "cache", "csv", "generator", "imagefolder", "json", "pandas", "parquet",
                   "pdffolder", "spark", "sql", "text", "videofolder", "webdataset", "xml"}  # read the disk


def is_hub_dataset_name(name: str) -> bool:
    """True for a dataset name that can only mean the Hugging Face hub, never a file of this machine: a
    shortcut (``wikitext-2-raw-v1``, ``c4``, ``ptb``) or ``hf:ID[:CONFIG]`` whose ID has a hub repository's
    shape, names no local path (``datasets`` would read a local folder or script of that name) and is no
    builder of ``datasets`` that reads local files (``hf:text`` would read the working folder's files)."""
    name = name.strip()
    if name in HUB_SHORTCUTS:
        return True
    if not name.startswith("hf:"):
        return False
    path, _, config = name[3:].partition(":")
    return (bool(_DATASET_ID.match(path)) and bool(_DATASET_CONFIG.match(config)) and not path.endswith(".py")
            and path.lower() not in _local_builders() and not os.path.lexists(path))


def _local_builders() -> set[str]:
    """The builder names of ``datasets`` that read files (this list, and the installed package's own)."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:
        return _LOCAL_BUILDERS
    return _LOCAL_BUILDERS | set(_PACKAGED_DATASETS_MODULES)


def _looks_like_path(name: str) -> bool:
    """A name meant as a file (a folder part or an extension), so a missing one is "not found"."""
    return "/" in name or os.sep in name or name.startswith("~") or bool(Path(name).suffix)


def read_text_file(path: str | os.PathLike) -> str:
    """A text file's content as str (UTF-8, byte-order mark kept for ``from_string`` to drop), or an
    error a user can act on: not found, a directory, or not UTF-8 (with the command that converts it)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a text file: pass one .txt/.jsonl file (or any "
                         "plain-text file) inside it.")
    if not path.is_file():
        raise FileNotFoundError(f"Text file not found: {path}")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start} cannot be read). Convert it first, "
                         f"e.g. iconv -f latin1 -t utf-8 '{path}' > '{path.with_suffix('.utf8' + path.suffix)}' "
                         "(use the file's real encoding instead of latin1), and pass the new file.") from None


def describe_source(source: str | os.PathLike | TextSource, part: str | None = None) -> str:
    """Human label, e.g. "Lee news corpus (gensim), calibration part" (hub: "..., test split")."""
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).strip() in _BUNDLED:
        label = _BUNDLED[os.fspath(source).strip()]
        if part == "whole":
            return f"{label} (the whole text)"
        return label if part is None else f"{label}, {part} part"
    spec = resolve_source(source)
    if isinstance(spec, HubSpec):
        label = f"{spec.path}{f' ({spec.config})' if spec.config else ''} from the Hugging Face hub"
        split = "train" if part == "calibration" else spec.eval_splits[0]
        return label if part is None else f"{label}, {split} split"
    label = spec.label or spec.name
    if part == "whole":
        return f"{label} (the whole text)"
    return label if part is None else f"{label}, {part} part"


def _hub_documents(spec: HubSpec, part: str) -> tuple[str, list[str]]:
    """(split, rows) read through the optional `datasets` package; clear error when offline."""
    advice = f"Use a local .txt/.jsonl file or a bundled source ({', '.join(_BUNDLED)}) instead."
    try:
        import datasets  # optional dependency, imported only for hub sources
    except ImportError as err:
        raise SourceUnavailableError(f"{spec.name} needs the optional 'datasets' package (pip "
                                     f"install datasets) and network access. {advice}") from err
    splits = ("train",) if part == "calibration" else spec.eval_splits
    errors = []
    for split in splits:
        try:
            rows = datasets.load_dataset(spec.path, spec.config, split=split, streaming=spec.streaming)
            return split, [r[spec.text_field] for r in itertools.islice(rows, spec.max_docs)]
        except Exception as err:  # offline, missing split, gated repo, ...: all unusable here
            errors.append(f"{split}: {type(err).__name__}: {err}")
    flags = [f"{v}=1" for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v) == "1"]
    why = f" ({', '.join(flags)} is set: offline)" if flags else " (offline?)"
    raise SourceUnavailableError(f"Could not load {spec.name} from the Hugging Face hub{why}. "
                                 f"{advice} Details: {'; '.join(errors)}")


def _tokenizer_key(tokenizer) -> tuple:
    """Identify a tokenizer for caching: where it came from (else the object) and its vocab size."""
    gguf = getattr(tokenizer, "init_kwargs", {}).get("gguf_file")
    return (type(tokenizer).__name__, tokenizer.name_or_path or id(tokenizer), gguf, len(tokenizer))


def _part_ids(tokenizer, source, part: str) -> tuple[torch.Tensor, str, str]:
    """(token ids (L,), protocol part/split name, source name) for one part, cached."""
    src = resolve_source(source)
    what = src if isinstance(src, HubSpec) else (src.name, src.fingerprint)
    key = (_tokenizer_key(tokenizer), what, part)
    if key not in _TOKEN_CACHE:
        split, docs = _hub_documents(src, part) if isinstance(src, HubSpec) else (part, src.part(part))
        text = (src.joiner if isinstance(src, HubSpec) else "\n\n").join(docs)
        ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False, verbose=False)
        if len(_TOKEN_CACHE) >= 8:  # keep 8 token streams; the largest (wiki) is ~4 MB
            _TOKEN_CACHE.pop(next(iter(_TOKEN_CACHE)))  # drop the oldest entry
        _TOKEN_CACHE[key] = (torch.tensor(ids["input_ids"], dtype=torch.long), split)  # (L,)
    ids, split = _TOKEN_CACHE[key]
    return ids, split, src.name

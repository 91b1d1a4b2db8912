"""Choosing a text (calibration, influence, evaluation): bundled, uploaded, a local file or a dataset.

The kind of text is picked outside the form, so the form shows only the input that kind needs;
the form returns a resolver that is called when the job runs, so a bad choice surfaces as a clear
error in the job's status box.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import streamlit as st

from ghosted.service.frontend import DeployConfig, TextSource

TEXT_KINDS = {"bundled:news": "Bundled news", "bundled:wiki": "Bundled Wikipedia",
              "upload": "Upload a file", "path": "Local file", "dataset": "Dataset"}


def text_kind(cfg: DeployConfig, default: str, key: str, label: str = "Text") -> str:
    """Which kind of text (outside a form, so the form shows only the inputs that kind needs)."""
    kinds = ["bundled:news", "bundled:wiki", "upload"]
    kinds += ["path"] if cfg.allow_local_paths else []
    kinds += ["dataset"] if cfg.allow_hub_datasets else []
    return st.radio(label, kinds, index=kinds.index(default), format_func=TEXT_KINDS.get,
                    horizontal=True, key=f"{key}_kind")


def text_inputs(cfg: DeployConfig, kind: str, key: str) -> Callable[[], object]:
    """The inputs a text kind needs (inside a form); returns a function resolving the submitted choice."""
    upload, other = None, ""
    if kind == "upload":
        upload = st.file_uploader("A .txt file (documents split by blank lines) or .jsonl ('text' field)",
                                  type=["txt", "jsonl"], key=f"{key}_upload")
    elif kind == "path":
        other = st.text_input("Local text file (plain text, any extension, or .jsonl)", key=f"{key}_path",
                              placeholder="data/calib.txt")
    elif kind == "dataset":
        other = st.text_input("Dataset (needs network and the datasets package)", key=f"{key}_dataset",
                              placeholder="wikitext-2-raw-v1  ·  c4  ·  ptb  ·  hf:NAME[:CONFIG]")
    return lambda: resolve_text(cfg, kind, upload, other)


def resolve_text(cfg: DeployConfig, kind: str, upload, other: str):
    """The text source a form asked for: a name, a path or an in-memory ``TextSource``."""
    if kind.startswith("bundled:"):
        return kind
    if kind == "upload":
        if upload is None:
            raise ValueError("Choose a .txt or .jsonl file to upload, or pick another text.")
        data = upload.getvalue()
        cfg.check_upload(len(data))
        try:
            return TextSource.from_string(upload.name, data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{upload.name} is not UTF-8 text. Convert it first, e.g. iconv -f latin1 -t utf-8 "
                             f"'{upload.name}' > converted.txt (use the file's real encoding), "
                             "and upload that.") from None
    name = other.strip()
    if not name:
        raise ValueError(f"Type a {'file path' if kind == 'path' else 'dataset name'} first.")
    cfg.check_text_source(name)
    if kind == "path":  # read now: a bad file is refused before anything is queued, and its content names it
        return TextSource.from_file(Path(name).expanduser())
    return name


def source_name(source) -> str:
    """How a text source is named in tables and recipes."""
    return getattr(source, "name", source)

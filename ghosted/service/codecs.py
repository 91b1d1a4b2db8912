"""Plain-JSON forms of the app's results, for the shared store's disk copy (never pickle).

A stored file is read back as untrusted input: every decoder checks the shape it gets (a mapping with
the expected fields, lists of records with the expected columns, numbers where numbers belong) and
raises ``ValueError`` otherwise, which the store turns into a warning and a recomputation.
"""

from __future__ import annotations

import math

import pandas as pd

from ghosted.service.comparison import VariantTable
from ghosted.service.results import Evaluation, Generations, Influence, ZeroShot

BLOCK_COLUMNS = ("metric", "start", "n", "end", "value")  # InfluenceReport.blocks
LAYER_COLUMNS = ("metric", "layer", "value")  # InfluenceReport.layers


def _mapping(data, *names: str) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    return data


def _frame(records, columns: tuple[str, ...]) -> pd.DataFrame:
    """A frame from a list of flat records that all hold ``columns`` (numbers and strings only)."""
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("expected a list of records")
    for record in records:
        _mapping(record, *columns)
        if not all(v is None or isinstance(v, (str, int, float, bool)) for v in record.values()):
            raise ValueError("a record holds something other than numbers and strings")
    frame = pd.DataFrame(records, columns=list(dict.fromkeys([*columns, *(k for r in records for k in r)])))
    return frame.fillna(value=math.nan) if len(frame) else frame


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def encode_influence(result: Influence) -> dict:
    report = result.report
    return {"model": result.model, "protocol": result.protocol, "num_layers": report.num_layers,
            "meta": report.meta, "blocks": _records(report.blocks), "layers": _records(report.layers)}


def decode_influence(data) -> Influence:
    from ghosted.selection.criteria import InfluenceReport

    data = _mapping(data, "model", "protocol", "num_layers", "meta", "blocks", "layers")
    if not isinstance(data["num_layers"], int) or data["num_layers"] < 1:
        raise ValueError("num_layers must be a positive whole number")
    report = InfluenceReport(blocks=_frame(data["blocks"], BLOCK_COLUMNS),
                             layers=_frame(data["layers"], LAYER_COLUMNS),
                             num_layers=data["num_layers"], meta=_mapping(data["meta"]))
    return Influence(str(data["model"]), report, _mapping(data["protocol"]))


def encode_evaluation(result: Evaluation) -> dict:
    return {"table": result.table.records(), "protocol": result.protocol}


def decode_evaluation(data) -> Evaluation:
    data = _mapping(data, "table", "protocol")
    return Evaluation(VariantTable.from_records(data["table"]), _mapping(data["protocol"]))


def encode_zeroshot(result: ZeroShot) -> dict:
    return {"frame": _records(result.frame), "protocols": result.protocols, "skipped": result.skipped,
            "notes": list(result.notes)}


def decode_zeroshot(data) -> ZeroShot:
    data = _mapping(data, "frame", "protocols", "skipped", "notes")
    notes = data["notes"]
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ValueError("notes must be a list of strings")
    return ZeroShot(_frame(data["frame"], ()), _mapping(data["protocols"]), _mapping(data["skipped"]), notes)


def decode_generations(data) -> Generations:
    data = _mapping(data, "prompts", "outputs")
    prompts, outputs = data["prompts"], _mapping(data["outputs"])
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    for texts in outputs.values():
        if not isinstance(texts, list) or len(texts) != len(prompts) or not all(isinstance(t, str) for t in texts):
            raise ValueError("each variant needs one string per prompt")
    departures = _mapping(data.get("departures", {}))
    for positions in departures.values():
        if not isinstance(positions, list) or len(positions) != len(prompts) or not all(
                p is None or (isinstance(p, int) and not isinstance(p, bool)) for p in positions):
            raise ValueError("each variant's departures need one whole number (or null) per prompt")
    return Generations(prompts, outputs, departures)

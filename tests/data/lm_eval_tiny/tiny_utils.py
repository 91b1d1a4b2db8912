"""Loader of the ``ghosted_tiny`` lm-eval task: the JSON-lines file next to this module."""

import json
from pathlib import Path


def load(**kwargs):
    """{"test": Dataset} from ghosted_tiny.jsonl (lm-eval passes the task's metadata as kwargs)."""
    import datasets

    path = Path(__file__).with_name("ghosted_tiny.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})

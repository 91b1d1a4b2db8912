"""Benchmarks: each module is a script (``python -m bench.NAME``) writing its section of docs/BENCHMARKS.md.

The benchmarks measure the bundled model and text offline: the hub is never asked (set before any module of
the package imports a Hugging Face library; a value already in the environment wins).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

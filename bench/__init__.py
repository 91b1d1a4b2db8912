"""Benchmarks: each module is a script (``python -m bench.NAME``) writing its section of docs/BENCHMARKS.md."""

"""Ghosted: prune whole decoder layers from causal LMs and recover them without training."""

__version__ = "0.1.0"

"""Calibration: the boundary statistics of each gap, collected in one pass, their sinks and their cache."""

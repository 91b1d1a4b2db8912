"""Experiments: the validated settings, one run, the grid of runs and the deployment limits."""

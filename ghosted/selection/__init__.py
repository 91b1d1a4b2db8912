"""Selection: which layers to remove, from the per-layer criteria and their sums to the selection rules."""

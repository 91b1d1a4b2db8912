"""Models: loading, the bundled assets, the architecture adapter, pruning and activation capture."""

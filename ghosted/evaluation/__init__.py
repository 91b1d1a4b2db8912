"""Evaluation: perplexity (with the shared prefix), generation, zero-shot tasks and the protocols behind them."""

"""Recovery: the method registry, the closed-form solvers and fits, and the diagnostics of a fitted gap."""

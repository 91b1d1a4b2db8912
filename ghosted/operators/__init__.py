"""Operators: the modules that stand in for pruned layers, where they attach, assembly and checkpoint I/O."""

"""The lowest layer: guards, the Hadamard transform and the progress protocol, used by every stage."""

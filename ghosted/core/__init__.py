"""The lowest layer: numerical guards, the Hadamard transform and the progress protocol; imports no other package."""

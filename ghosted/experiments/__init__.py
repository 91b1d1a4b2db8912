"""The experiment as data (the spec), and what runs it: one experiment, the grid, their reports."""

"""The reproduction grid: selections x layers removed x methods x texts x calibration draws, journaled."""

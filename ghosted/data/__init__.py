"""Text: the sources (bundled, files, hub) and the token windows cut from them for calibration and evaluation."""

"""Calibration: merged statistics -> ranges -> scale / zero point."""

"""Plots (matplotlib, PNG): peak memory and relative speed per layout, the memory/throughput trade-off, the
estimate's breakdown under the measured peak, the per-layer series; their shared style and label placement.
Computes no metric; imports no torch and no rich."""

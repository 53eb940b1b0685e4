"""Measured searches instead of a fixed grid: the largest batch that fits, the fewest layers to checkpoint, and
tune's loop (its decisions are pure, in analysis/tune_planner.py). Never prints."""

"""Config: YAML -> validated, frozen SweepConfig (field paths in errors), presets, the layout grammar and
the grid of points. Must not import torch (nor anything that does)."""

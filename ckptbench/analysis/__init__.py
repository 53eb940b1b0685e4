"""Analysis: compare, recommend, marks and statistics, as pure functions returning data.
Must not import torch or rich."""

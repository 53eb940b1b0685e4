"""Rendering: rich tables that fit the terminal, Markdown/CSV/JSON, plots and report.md.
Must not compute metrics, nor import torch."""

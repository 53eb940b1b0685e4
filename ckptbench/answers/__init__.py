"""The fourteen claims people make about checkpointing LLaMA-7B on an 80 GB card, each judged from measured
points (pure: no torch, no rich). Rendered by render/answers.py."""

"""The fourteen claims people make about checkpointing LLaMA-7B on an 80 GB card, each judged from measured
points and, where no run measured a point, from predictions handed in as plain data (answers/predictions.py:
memory predicted by the estimator, step times fitted to the runs) (pure: no torch, no rich). Rendered by
render/answers.py."""

"""Benchmarking: probes (CUDA stats, the CPU live-tensor tracker), one point's measured window, the runner,
sweep orchestration, searches, resume, isolation, environment facts and test-only fault hooks. Never prints."""

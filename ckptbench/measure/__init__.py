"""Measuring one point: probes (CUDA stats, the CPU live-tensor tracker), the measured window with its loss
check, the model slot, the runner (where a point runs is injected), device and environment facts, test-only
fault hooks. Never prints; starts no process of its own."""

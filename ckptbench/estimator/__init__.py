"""Estimation: the training step on fake tensors, the live-bytes tracker, the device model (allocator
rounding, kernel scratch, library workspaces), per-layer re-assembly, the caching-allocator replay (peak
reserved memory, the out-of-memory error) and the public estimate API. Must not read measured results to
make a prediction."""

"""Running points in other processes: a point in a fresh process (--isolate, the boundary of a search, its own
allocator settings), a sharded point's ranks, fanned-out jobs (submitit executors, what may run at once), and
the CUDA allocator's own trace. Never prints."""

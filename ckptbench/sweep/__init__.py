"""Running a sweep: its course and final status, the run directory, resume, the command's own timing, each
point's predictions made before it runs. Never prints."""

"""The command line (typer): parse, call one core function, render; the only package that imports typer.

Owns the consoles, the one error handler (CkptbenchError -> exit code), the Format enum and the
progress bars. Must not compute anything: every number comes from the core packages.
"""

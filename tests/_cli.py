"""Running a command as a user would, in this process: no exception but SystemExit, no traceback in its output."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from ckptbench.cli.main import app


def invoke(args: list[str]) -> Any:
    """``ckptbench ARGS``: its click Result, checked to have ended by an exit code and printed no traceback."""
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output, result.output
    return result

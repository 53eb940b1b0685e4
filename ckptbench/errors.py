"""Exceptions that carry a message a user can act on; ckptbench.cli maps them to exit codes."""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUN_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_REGRESSION = 3


class CkptbenchError(Exception):
    """Base class: a one-line message for the user and the exit code it maps to."""

    exit_code: int = EXIT_RUN_FAILURE


class ConfigError(CkptbenchError):
    """The config file or a command-line value is invalid (nothing was started)."""

    exit_code = EXIT_BAD_INPUT


class LayoutError(ConfigError):
    """A layout string does not parse or does not fit the model."""


class ResultsError(CkptbenchError):
    """A run directory is missing, unreadable or of an unknown schema."""

    exit_code = EXIT_BAD_INPUT


class MachineError(CkptbenchError):
    """The machine cannot run what was asked (for example CUDA requested, none present)."""

    exit_code = EXIT_BAD_INPUT


class RunFailure(CkptbenchError):
    """The sweep could not complete (the results written so far stay on disk)."""

    exit_code = EXIT_RUN_FAILURE

"""``--resume RUN_DIR``: check that a run still matches the config and machine; find what is left to do.

A point counts as done when the run holds a record for its key with status ``ok``, ``oom`` or
``skipped``; points recorded as ``error`` are run again (their new record supersedes the old
one when the run is loaded). The run's stored, resolved config must equal the config given now,
except for :data:`IGNORED_FIELDS`, which cannot change any measured number.
"""

from __future__ import annotations

from typing import Any

from ckptbench.config.load import parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.results.meta import RunEnvironment
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run

DONE_STATUSES = frozenset({"ok", "oom", "skipped"})
# 'name' only names the run directory and 'cluster' only says where points run; every other field
# changes what is measured or how.
IGNORED_FIELDS = frozenset({"name", "cluster"})
# Facts about the machine that must not change, or the new points would not compare with the old.
ENVIRONMENT_FIELDS = ("device_type", "gpu_name", "torch", "transformers")
_ABSENT = object()


def _short(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def first_difference(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first dotted path where two JSON-like values differ, with both values; None if equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new), key=str):
            where = f"{path}.{name}" if path else str(name)
            if not path and name in IGNORED_FIELDS:
                continue
            found = first_difference(old.get(name, _ABSENT), new.get(name, _ABSENT), where)
            if found is not None:
                return found
        return None
    return None if old == new else (path or "(top level)", old, new)


def _resolved(stored: Any) -> Any:
    """The run's stored config as this ckptbench resolves it: a field added since the run was written
    takes its default (it cannot have changed anything measured), so older runs stay resumable."""
    try:
        return parse_config(stored, source="run.json").model_dump(mode="json")
    except ConfigError:
        return stored  # not valid any more: compared as it is, and the difference is named


def check_command(run: Run, command: str) -> None:
    """ConfigError unless ``run`` was written by ``command`` ('sweep' or 'tune'): a sweep's grid run into a tune
    run, or tune's search appended to a sweep, would make a run that is neither."""
    if run.command != command:
        raise ConfigError(
            f"--resume {run.path}: written by ckptbench {run.command}, not {command}; continue it with "
            f"ckptbench {run.command} CONFIG --resume {run.path}, or start a new run"
        )


def check_resumable(cfg: SweepConfig, run: Run, environment: RunEnvironment, *, command: str = "sweep") -> None:
    """Raise ConfigError (one line) unless ``run`` can be continued by ``command`` with ``cfg`` on this machine."""
    check_command(run, command)
    if not run.config:
        raise ConfigError(
            f"--resume {run.path}: its run.json holds no config to check this one against; start a new run"
        )
    found = first_difference(_resolved(run.config), cfg.model_dump(mode="json"))
    if found is not None:
        where, old, new = found
        raise ConfigError(
            f"--resume {run.path}: the config no longer matches the run at {where} "
            f"(run: {_short(old)}, now: {_short(new)}); resume with the run's config or start a new run"
        )
    for name in ENVIRONMENT_FIELDS:
        old, new = getattr(run.environment, name), getattr(environment, name)
        if old != new:
            raise ConfigError(
                f"--resume {run.path}: the run was measured with {name} {old!r}, this machine has {new!r}; "
                "resume it where it was measured, or start a new run"
            )


def done_records(run: Run) -> dict[str, PointRecord]:
    """Finished records of ``run`` by key id (the same text as ``Point.key_id``).

    A record whose key is not a point of this version (a field missing or extra) cannot be a point of
    the config either: it is left out, so the point it may have meant runs again.
    """
    return {
        record.key_id: record
        for record in run.points
        if record.status in DONE_STATUSES and record.point is not None
    }

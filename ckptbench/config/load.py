"""Reading a config: YAML text -> validated SweepConfig, with one-line errors that name the field."""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from ckptbench.config.axes import _shown
from ckptbench.config.files import read_bounded
from ckptbench.config.model import CONFIG_DIR
from ckptbench.config.schema import SweepConfig
from ckptbench.config.yaml_text import check_expanded_size, read_yaml
from ckptbench.errors import ConfigError

MAX_CONFIG_BYTES = 16 * 2**20  # a config is a few KiB; 100,000 explicit points fit in a few MiB


def _format_loc(loc: tuple[Any, ...], data: Any = None) -> str:
    """The dotted field path of a pydantic location. Union members appear in it as type tags ('list[int]',
    "literal['max']"): not fields. A part that is a key (or index) of the data given is a field whatever its
    characters (a misspelt field 'a[b' is named as such, not as '(top level)')."""
    parts, node = [], data
    for x in loc:
        in_dict = isinstance(node, dict) and x in node
        if in_dict or (isinstance(node, list) and isinstance(x, int) and 0 <= x < len(node)):
            parts.append(str(x))
            node = node[x]
        elif not (isinstance(x, str) and ("[" in x or "(" in x)):
            parts.append(str(x))
            node = None
    return ".".join(parts) or "(top level)"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid field names of the model that owns ``loc`` (for 'did you mean')."""
    model: Any = SweepConfig
    for part in loc[:-1]:
        if isinstance(part, int):  # an index into a list of models (points.3.layuot)
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
        inner = getattr(model, "__args__", ())
        model = next((a for a in inner if hasattr(a, "model_fields")), model)
    return list(getattr(model, "model_fields", {}))



def _closest(word: Any, choices: list[str]) -> str:
    hint = difflib.get_close_matches(str(word), choices, n=1) if isinstance(word, str | int) else []
    return f"; did you mean {hint[0]!r}?" if hint else ""


def _error_line(source: str, err: Mapping[str, Any], data: Any = None) -> str:
    loc = tuple(err.get("loc", ()))
    where = _format_loc(loc, data)
    kind = err.get("type")
    if kind == "extra_forbidden":
        return f"{source}: unknown field {where!r}{_closest(loc[-1], _fields_at(loc)) if loc else ''}"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if not loc or msg.startswith((f"{where}.", f"{where}:")):  # checks that name their field path themselves
        return f"{source}: {msg}"
    given = err.get("input")
    shown = "" if isinstance(given, dict | list) or kind == "missing" else f" (got {_shown(given)})"
    hint = ""
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        hint = _closest(given, allowed)
    return f"{source}: {where}: {msg}{shown}{hint}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_config(data: Any, *, source: str = "config", config_dir: Path | None = None) -> SweepConfig:
    """Validate already-parsed YAML data; raise ConfigError with one line naming the field.

    ``config_dir``: the folder a relative ``model.config`` (a checkpoint's config.json) is read from; None:
    the working directory."""
    if data is None:
        raise ConfigError(f"{source}: the config is empty; it needs at least a 'name' field")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of fields, got {type(data).__name__}")
    check_expanded_size(data, source=source)  # before validation walks it: an alias bomb stops here
    try:
        cfg = SweepConfig.model_validate(data, context={CONFIG_DIR: config_dir})
        # The resolved config is stored as JSON in every run: it must round-trip.
        json.dumps(cfg.model_dump(mode="json"))
    except ValidationError as exc:
        raise ConfigError(_one_line(_error_line(source, exc.errors()[0], data))) from None
    except (ValueError, TypeError, RecursionError, PydanticSerializationError):
        # Only free-form fields (model.overrides) can hold such values: a recursive YAML alias, bytes.
        raise ConfigError(
            f"{source}: model.overrides: values must be plain numbers, strings, lists or mappings"
        ) from None
    return cfg


def loads_config(text: str, *, source: str = "config", config_dir: Path | None = None) -> SweepConfig:
    """Parse YAML text and validate it; every problem is a one-line ConfigError (``config_dir``: see parse_config)."""
    try:
        data = read_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or ["unparsable"])[0]
        raise ConfigError(_one_line(f"{source}: invalid YAML{where}: {problem}")) from None
    except Exception as exc:  # PyYAML's constructors raise others: 2020-13-45, '!!int' (an empty int)
        if isinstance(exc, ValueError) and "int_max_str_digits" in str(exc):  # not a hint at sys.set_int_max_...
            raise ConfigError(f"{source}: invalid YAML value: an integer of more than "
                              f"{sys.get_int_max_str_digits():,} digits; no field takes a number that long") from None
        why = f"{exc.__class__.__name__}: {_shown(str(exc))}"
        raise ConfigError(_one_line(f"{source}: invalid YAML value ({why})")) from None
    return parse_config(data, source=source, config_dir=config_dir)


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a YAML config file."""
    p = Path(path)
    try:
        text = read_bounded(p, limit_bytes=MAX_CONFIG_BYTES, what="a config file").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(f"{p}: cannot read config file (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: cannot read config file (not UTF-8 text: byte {exc.start})") from None
    except OSError as exc:
        reason = f"{exc.__class__.__name__}: {exc.strerror or exc}"
        raise ConfigError(_one_line(f"{p}: cannot read config file ({reason})")) from None
    return loads_config(text, source=str(p), config_dir=p.parent)


def with_parallel(cfg: SweepConfig, parallel: str) -> SweepConfig:
    """``cfg`` with every point spread as ``parallel``; a ConfigError names the option when it is invalid."""
    try:
        return cfg.with_parallel(parallel)
    except ValidationError as exc:
        raise ConfigError(_one_line(_error_line("--parallel", exc.errors()[0]))) from None

"""Where a model given on the command line comes from: a preset, a checkpoint's config.json (or the folder holding
it), or a Hugging Face model id resolved through huggingface_hub (the local cache first; a download of config.json
alone, where the network allows). The result is the ``model:`` section a sweep config would hold (no torch).

Only config.json is ever read or fetched: no weights. A hub id that cannot be resolved (offline and not cached,
not found, gated) is one line naming what to do.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from ckptbench.config.model import read_config_json
from ckptbench.config.presets import preset_names
from ckptbench.errors import ConfigError
from ckptbench.json_object import JsonObject

# 'org/name' as the Hub spells a model id (letters, digits, '-', '_', '.'; one slash).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def model_section(text: str) -> JsonObject:
    """The ``model:`` mapping of a sweep config for ``--model TEXT``; ConfigError (exit 2) in one line."""
    if text in preset_names():
        return {"preset": text}
    path = Path(text).expanduser()
    if path.is_dir():
        inner = path / "config.json"
        if not inner.exists():  # one that is no regular file (a FIFO) is refused as such when it is read
            raise ConfigError(f"--model: {text} is a folder without a config.json")
        return {"config": str(inner)}
    if path.exists() or text.endswith(".json"):
        return {"config": str(path)}  # read (bounded, one-line errors) when the config is validated
    if _HUB_ID.match(text):
        return {"config_fields": {**hub_config(text), "_name_or_path": text}}
    hint = difflib.get_close_matches(text, preset_names(), n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ConfigError(
        f"--model: unknown model {text!r}{extra}: give a preset (ckptbench's presets: {', '.join(preset_names())}), "
        "a config.json or a folder holding one, or a Hugging Face model id (org/name)"
    )


def hub_config(repo_id: str) -> JsonObject:
    """The fields of ``repo_id``'s config.json: from the local Hugging Face cache, else downloaded (that file only)."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - transformers depends on it
        raise ConfigError(f"--model: {repo_id} is a Hugging Face id and huggingface_hub is not installed") from None
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return _read(cached, repo_id)
    if any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE):
        raise ConfigError(f"--model: {repo_id}'s config.json is not in the local Hugging Face cache and the Hub is "
                          "offline (HF_HUB_OFFLINE); download it once with network, or give the config.json's path")
    try:
        path = hf_hub_download(repo_id, "config.json", etag_timeout=10)
    except GatedRepoError:
        raise ConfigError(f"--model: {repo_id} is gated: accept its license on huggingface.co and log in "
                          "(hf auth login), or give the config.json's path") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"--model: no model {repo_id!r} on the Hugging Face Hub (or it is private: log in "
                          "first)") from None
    except (LocalEntryNotFoundError, OSError) as exc:
        raise ConfigError(f"--model: cannot fetch {repo_id}'s config.json from the Hugging Face Hub (offline? "
                          f"{type(exc).__name__}); give the config.json's path instead") from None
    return _read(path, repo_id)


def _read(path: str, repo_id: str) -> JsonObject:
    try:
        return read_config_json(path, base=None)
    except ValueError as exc:
        raise ConfigError(f"--model: {repo_id}: {str(exc).removeprefix('model.config: ')}") from None

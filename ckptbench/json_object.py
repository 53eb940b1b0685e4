"""``JsonObject``: the one name for a JSON object's fields in ckptbench's types. A top-level leaf (it imports no
other part of ckptbench and no torch), so every room, config included, can mark its boundaries with JSON."""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
"""Marks a boundary with JSON (or the plain data of YAML and pydantic's dumps): what ``json.loads`` returns for an
object, what a ``to_json``/``model_dump``/``to_record`` writes, a file's or a message's raw fields before a model
checks them. Fields whose names are fixed and known between functions or rooms get a typed record instead."""

"""A model that writes exactly the fields it was given: a record's or run.json's JSON holds what ckptbench set
(``null`` where it set None), never a default it did not, so a file read and written again is the same file."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel

from ckptbench.json_object import JsonObject


class GivenFields(BaseModel):
    """The fields given (``model_fields_set``, unknown ones kept from a read included) are what is written."""

    def to_json(self) -> JsonObject:
        """As written to disk: exactly the fields that were given, as JSON values."""
        return self.model_dump(mode="json", exclude_unset=True)

    def given(self) -> dict[str, Any]:
        """The fields that were given, with their (typed) values."""
        return {name: getattr(self, name) for name in self.model_fields_set}

    def updated(self, **fields: Any) -> Self:
        """A copy with ``fields`` given too, checked as a new one is."""
        return self.model_validate({**self.given(), **fields})

    def without(self, *names: str) -> Self:
        """A copy in which ``names`` were never given: not written, their defaults on read."""
        return self.model_validate({k: v for k, v in self.given().items() if k not in names})

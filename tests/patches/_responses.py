"""A stand-in for vLLM's OpenAI response models, for driving its streaming generators."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel


class ResponseModel:
    """A response model: keeps what it is given, serialises it as JSON (nested stand-ins,
    lists, and real pydantic models such as vLLM's usage info)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def _dump(self, exclude_none: bool) -> dict[str, Any]:
        def conv(v: Any) -> Any:
            if isinstance(v, ResponseModel):
                return v._dump(exclude_none)
            if isinstance(v, BaseModel):
                return v.model_dump(exclude_none=exclude_none)
            if isinstance(v, list):
                return [conv(x) for x in v]
            return v
        return {k: conv(v) for k, v in self.__dict__.items()
                if not (exclude_none and v is None)}

    def model_dump_json(self, exclude_unset: bool = False, exclude_none: bool = False) -> str:
        return json.dumps(self._dump(exclude_none))

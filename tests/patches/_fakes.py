"""Fake aiohttp pieces for driving vLLM's benchmark request functions without a server."""

from __future__ import annotations

import json
import re
import types
from collections.abc import AsyncIterator
from typing import Any

from ._helpers import make_module


def bench_stubs() -> dict[str, types.ModuleType]:
    """Stubs for the benchmark modules' non-aiohttp third-party imports."""
    return {
        "regex": re,
        "tqdm": make_module("tqdm", tqdm=object),
        "tqdm.asyncio": make_module("tqdm.asyncio", tqdm=object),
    }


class FakeContent:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


class FakeResponse:
    def __init__(self, status: int = 200, chunks: list[bytes] | None = None,
                 body: Any = None, reason: str = "OK") -> None:
        self.status = status
        self.reason = reason
        self.content = FakeContent(chunks or [])
        self._body = body

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def json(self) -> Any:
        return self._body

    async def text(self) -> str:
        return self._body if isinstance(self._body, str) else json.dumps(self._body)


class FakeSession:
    """Records each request's url and headers; answers with ``respond(method, url, kw)``."""

    def __init__(self, respond: Any) -> None:
        self.respond = respond
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def _do(self, method: str, url: str, **kw: Any) -> FakeResponse:
        self.calls.append((method, url, kw))
        result = self.respond(method, url, kw)
        if isinstance(result, BaseException):
            raise result
        response: FakeResponse = result
        return response

    def post(self, url: str, **kw: Any) -> FakeResponse:
        return self._do("POST", url, **kw)

    def get(self, url: str, **kw: Any) -> FakeResponse:
        return self._do("GET", url, **kw)

    async def __aenter__(self) -> FakeSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

"""tokenize-v1-route: /tokenize and /detokenize are also served under /v1, with unique
OpenAPI operation ids."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.testclient import TestClient

from ._helpers import assert_pristine_lacks, load_with_auto_stubs, make_module

pytestmark = pytest.mark.e2e


class ErrorResponse(BaseModel):
    message: str


class TokenizeRequest(BaseModel):
    prompt: str


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int


class DetokenizeRequest(BaseModel):
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class _FakeTokenization:
    async def create_tokenize(self, request: TokenizeRequest, raw: Any) -> TokenizeResponse:
        toks = [ord(c) for c in request.prompt]
        return TokenizeResponse(tokens=toks, count=len(toks))

    async def create_detokenize(self, request: DetokenizeRequest, raw: Any) -> DetokenizeResponse:
        return DetokenizeResponse(prompt="".join(chr(t) for t in request.tokens))


async def _validate_json_request() -> None:
    return None


def _with_cancellation(fn: Any) -> Any:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    return wrapper


def _app(tree: Path) -> FastAPI:
    mod = load_with_auto_stubs(
        tree / "entrypoints/serve/tokenize/api_router.py",
        {
            "vllm.entrypoints.serve.engine.protocol": make_module(
                "p", ErrorResponse=ErrorResponse),
            "vllm.entrypoints.serve.tokenize.protocol": make_module(
                "p", TokenizeRequest=TokenizeRequest, TokenizeResponse=TokenizeResponse,
                DetokenizeRequest=DetokenizeRequest, DetokenizeResponse=DetokenizeResponse),
            "vllm.entrypoints.serve.utils.api_utils": make_module(
                "u", validate_json_request=_validate_json_request,
                with_cancellation=_with_cancellation),
        },
    )
    app = FastAPI()
    app.state.args = SimpleNamespace(enable_tokenizer_info_endpoint=False)
    app.state.serving_tokenization = _FakeTokenization()
    mod.attach_router(app)
    return app


def _check(tree: Path) -> None:
    client = TestClient(_app(tree))
    for prefix in ("", "/v1"):
        r = client.post(f"{prefix}/tokenize", json={"prompt": "hi"})
        assert r.status_code == 200, (prefix, r.status_code)
        assert r.json() == {"tokens": [104, 105], "count": 2}
        r = client.post(f"{prefix}/detokenize", json={"tokens": [104, 105]})
        assert r.status_code == 200, (prefix, r.status_code)
        assert r.json() == {"prompt": "hi"}
    # Operation ids are unique (FastAPI would warn on a duplicate; warnings are errors here).
    schema = client.get("/openapi.json").json()
    ids = [op["operationId"] for item in schema["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), ids
    assert {"/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize"} <= set(schema["paths"])


def test_patched_serves_v1_twins(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_lacks_v1_twins(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))

"""auth-deny-default: --api-key guards every path except /health, /ping, /load, /version."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ._helpers import assert_pristine_lacks, load_module, pin_file

pytestmark = pytest.mark.e2e

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPEN = ["/health", "/health/", "/ping", "/load", "/version"]
GUARDED = ["/tokenize", "/detokenize", "/metrics", "/docs", "/openapi.json", "/v1/models",
           "/invocations", "/v2/rerank"]
ALL_METHODS = ["GET", "POST", "OPTIONS", "HEAD"]


def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def _client(tree: Path, root_path: str = "") -> TestClient:
    mod = load_module(tree / "entrypoints/serve/middleware/authenticate.py")
    paths = sorted({p.rstrip("/") or "/" for p in OPEN + GUARDED})
    app = Starlette(
        routes=[Route(p, _ok, methods=ALL_METHODS) for p in paths],
        middleware=[
            # The order vLLM's register.py produces: auth outermost, then CORS.
            Middleware(mod.AuthenticationMiddleware, tokens=[KEY]),
            Middleware(CORSMiddleware, allow_origins=["https://ui.example"],
                       allow_methods=["*"], allow_headers=["*"]),
        ],
    )
    app.router.redirect_slashes = False
    return TestClient(app, root_path=root_path)


def _check(tree: Path, root_path: str) -> None:
    client = _client(tree, root_path)
    for path in OPEN:
        r = client.get(root_path + path)
        assert r.status_code != 401, f"{path} should answer without the key"
    for path in GUARDED:
        assert client.get(root_path + path).status_code == 401, f"{path} open without key"
        assert client.get(root_path + path, headers=AUTH).status_code == 200, path
        assert client.get(root_path + path,
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
    # A bare OPTIONS (no CORS preflight headers) needs the key: /metrics answers any method.
    assert client.options(root_path + "/metrics").status_code == 401
    assert client.options(root_path + "/metrics", headers=AUTH).status_code == 200
    # Origin alone is not a preflight.
    assert client.options(root_path + "/metrics",
                          headers={"Origin": "https://ui.example"}).status_code == 401
    # A real CORS preflight does not need it, and CORS answers it.
    r = client.options(
        root_path + "/v1/models",
        headers={"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code == 200
    assert r.headers.get("access-control-allow-origin") == "https://ui.example"


@pytest.mark.parametrize("root_path", ["", "/llm"])
def test_patched_denies_by_default(patched_vllm: Path, root_path: str) -> None:
    _check(patched_vllm, root_path)


def test_patched_help_text_describes_allowlist(patched_vllm: Path) -> None:
    text = pin_file(patched_vllm, "entrypoints/launchers/cli_args.py",
                    "entrypoints/common/cli_args.py").read_text()  # moved in 0.33.0
    assert "`/health`, `/ping`, `/load`" in text


@pytest.mark.parametrize("root_path", ["", "/llm"])
def test_pristine_lacks_deny_default(pristine_vllm: Path, root_path: str) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, root_path))

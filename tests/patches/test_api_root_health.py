"""api-root-health: GET/HEAD /, /api/status, /api/experimental/model-recommendations and
/api/show for `ollama launch codex`, matched against the served models at request time,
unguarded by --api-key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from ._helpers import assert_pristine_lacks, load_module, load_with_auto_stubs

pytestmark = pytest.mark.e2e

KEY = "sk-test"
ROOT = "/srv/models/Qwen3-8B"


@dataclass
class _Base:
    name: str
    model_path: str


@dataclass
class _Registry:
    """The interface of vLLM's OpenAIModelRegistry the routes use."""

    base_model_paths: list[_Base]
    model_config: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(max_model_len=32768))

    def is_base_model(self, name: str) -> bool:
        return any(name in (b.name, b.model_path) for b in self.base_model_paths)

    def model_name(self) -> str:
        return self.base_model_paths[0].name


def _client(tree: Path) -> tuple[TestClient, FastAPI]:
    module = tree / "entrypoints/serve/instrumentator/ollama_compat.py"
    assert module.exists(), "no Ollama-compatible routes"
    compat = load_with_auto_stubs(module)
    auth = load_module(tree / "entrypoints/serve/middleware/authenticate.py")
    app = FastAPI(middleware=[Middleware(auth.AuthenticationMiddleware, tokens=[KEY])])
    app.include_router(compat.router)
    app.state.openai_serving_models = _Registry([_Base("qwen", ROOT)])
    return TestClient(app), app


def _check(tree: Path) -> None:
    client, app = _client(tree)
    for path in ("/", "/api/status", "/api/experimental/model-recommendations"):
        for method in ("GET", "HEAD"):
            r = client.request(method, path)
            assert r.status_code == 200, (method, path, r.status_code)
    assert client.get("/").text == "Ollama is running"
    recs = client.get("/api/experimental/model-recommendations").json()["recommendations"]
    assert recs == [{"model": "qwen", "context_length": 32768}]

    for name in ("qwen", "qwen:latest", ROOT):
        r = client.post("/api/show", json={"model": name})
        assert r.status_code == 200, (name, r.status_code)
        body = r.json()
        assert body["model"] == "qwen"
        assert 32768 in body["model_info"].values()
    assert client.get("/api/show", params={"model": "qwen"}).status_code == 200

    r = client.post("/api/show", json={"model": "llama3"})
    assert r.status_code == 404
    assert "llama3" in r.text
    assert "qwen" not in r.text and ROOT not in r.text and "Qwen3" not in r.text

    # Served models are read at request time, and so is the context length.
    app.state.openai_serving_models = _Registry(
        [_Base("llama3", "/srv/llama")], SimpleNamespace(max_model_len=8192))
    r = client.post("/api/show", json={"name": "llama3"})
    assert r.status_code == 200 and 8192 in r.json()["model_info"].values()
    assert client.post("/api/show", json={"model": "qwen"}).status_code == 404

    # The probes answer without the API key; nothing else does.
    assert client.get("/api/status/").status_code != 401
    assert client.get("/v1/models").status_code == 401


def test_patched_serves_ollama_probes(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_registers_router(patched_vllm: Path) -> None:
    init = (patched_vllm / "entrypoints/serve/instrumentator/__init__.py").read_text()
    assert "ollama_compat" in init


def test_pristine_lacks_ollama_probes(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))

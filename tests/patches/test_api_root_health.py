"""api-root-health: GET/HEAD /, /api/status, /api/experimental/model-recommendations and
/api/show for `ollama launch codex`. Driven through vLLM's own model registry
(OpenAIServingModels from the tree, its matching included) behind vLLM's own
AuthenticationMiddleware."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from ._helpers import (
    assert_pristine_lacks,
    load_module,
    load_with_auto_stubs,
    make_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
QWEN_PATH = "/srv/models/Qwen3-8B"
LLAMA_PATH = "/srv/models/Llama-3.1-8B/"
GUARDED = ("/api/experimental/model-recommendations", "/api/show")


class _NoResolvers:
    @staticmethod
    def get_supported_resolvers() -> list[str]:
        return []


def _registry_modules(tree: Path) -> tuple[ModuleType, ModuleType]:
    """vLLM's protocol (BaseModelPath) and serving (the registry) modules from ``tree``."""
    protocol = load_module(tree / "entrypoints/openai/models/protocol.py")
    serving = load_with_auto_stubs(tree / "entrypoints/openai/models/serving.py", {
        "vllm.entrypoints.openai.models.protocol": protocol,
        "vllm.lora.resolver": make_module("vllm.lora.resolver",
                                          LoRAResolver=object,
                                          LoRAResolverRegistry=_NoResolvers),
    })
    return protocol, serving


class _App:
    def __init__(self, tree: Path) -> None:
        module = tree / "entrypoints/serve/instrumentator/ollama_compat.py"
        assert module.exists(), "no Ollama-compatible routes"
        self.protocol, self.serving = _registry_modules(tree)
        compat = load_with_auto_stubs(module, {
            "vllm.entrypoints.openai.models.protocol": self.protocol,
            "vllm.entrypoints.openai.models.serving": self.serving,
        })
        auth = load_module(tree / "entrypoints/serve/middleware/authenticate.py")
        self.app = FastAPI(middleware=[Middleware(auth.AuthenticationMiddleware,
                                                  tokens=[KEY])])
        self.app.include_router(compat.router)

        @self.app.get("/v1/models")
        async def _models() -> dict[str, list[str]]:
            return {"data": []}

        self.client = TestClient(self.app)

    def serve(self, models: list[tuple[str, str]], max_model_len: int = 32768) -> Any:
        engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                                 renderer=None, input_processor=None)
        registry = self.serving.OpenAIServingModels(
            engine, [self.protocol.BaseModelPath(name=n, model_path=p) for n, p in models])
        self.app.state.openai_serving_models = registry
        return registry

    def show(self, name: str, headers: dict[str, str] | None = None) -> Any:
        return self.client.post("/api/show", json={"model": name},
                                headers=AUTH if headers is None else headers)


def _check_probes(tree: Path) -> None:
    app = _App(tree)
    app.serve([("qwen", QWEN_PATH)])
    for path in ("/", "/api/status", "/api/experimental/model-recommendations"):
        for method in ("GET", "HEAD"):
            r = app.client.request(method, path, headers=AUTH)
            assert r.status_code == 200, (method, path, r.status_code)
    assert app.client.get("/").text == "Ollama is running"
    recs = app.client.get("/api/experimental/model-recommendations",
                          headers=AUTH).json()["recommendations"]
    assert recs == [{"model": "qwen", "context_length": 32768}]
    for name in ("qwen", "qwen:latest", QWEN_PATH, "Qwen3-8B"):
        r = app.show(name)
        assert r.status_code == 200, (name, r.status_code)
        assert r.json()["model"] == "qwen"
        assert 32768 in r.json()["model_info"].values()
    r = app.show("llama3")
    assert r.status_code == 404 and "llama3" in r.text
    assert "qwen" not in r.text and QWEN_PATH not in r.text
    # Served models and the context length are read at request time.
    app.serve([("llama3", "/srv/llama")], max_model_len=8192)
    r = app.show("llama3")
    assert r.status_code == 200 and 8192 in r.json()["model_info"].values()
    assert app.show("qwen").status_code == 404


def _check_guarded(tree: Path) -> None:
    """The routes that name models need the key, as /v1/models does; the liveness
    probes do not."""
    app = _App(tree)
    app.serve([("qwen", QWEN_PATH)])
    assert app.client.get("/v1/models").status_code == 401
    for path in GUARDED:
        for method in ("GET", "HEAD", "POST"):
            if method == "POST" and path != "/api/show":
                continue
            r = app.client.request(method, path, params={"model": "qwen"})
            assert r.status_code == 401, (method, path, r.status_code)
            assert "qwen" not in r.text and QWEN_PATH not in r.text
            r = app.client.request(method, path + "/", params={"model": "qwen"})
            assert r.status_code == 401, (method, path + "/", r.status_code)
    for path in ("/", "/api/status", "/api/status/"):
        assert app.client.get(path).status_code == 200, path


def _check_no_paths(tree: Path) -> None:
    """A model served without --served-model-name is named by its path; no answer
    carries that path, and the basename it publishes is accepted back."""
    app = _App(tree)
    app.serve([(QWEN_PATH, QWEN_PATH), (LLAMA_PATH, LLAMA_PATH)])
    recs = app.client.get("/api/experimental/model-recommendations", headers=AUTH)
    assert "/srv" not in recs.text, recs.text
    names = [rec["model"] for rec in recs.json()["recommendations"]]
    assert names == ["Qwen3-8B", "Llama-3.1-8B"]
    for name in [*names, QWEN_PATH, LLAMA_PATH, "Qwen3-8B:latest"]:
        r = app.show(name)
        assert r.status_code == 200, (name, r.status_code)
        assert "/srv" not in r.text, (name, r.text)
    assert app.show("Llama-3.1-8B").json()["model"] == "Llama-3.1-8B"


def _check_second_model(tree: Path) -> None:
    """With two served models, each name is answered for the model it names."""
    app = _App(tree)
    app.serve([("qwen", QWEN_PATH), ("llama", LLAMA_PATH)])
    for name, served in (("qwen", "qwen"), ("Qwen3-8B", "qwen"), ("llama", "llama"),
                         ("Llama-3.1-8B", "llama"), (LLAMA_PATH, "llama"),
                         ("llama:latest", "llama")):
        r = app.show(name)
        assert r.status_code == 200, (name, r.status_code)
        assert r.json()["model"] == served, (name, r.json()["model"])


def _check_registry_matching(tree: Path) -> None:
    """/api/show accepts exactly the names the registry accepts (one rule)."""
    app = _App(tree)
    registry = app.serve([("qwen", QWEN_PATH), (LLAMA_PATH, LLAMA_PATH)])
    for name in ("qwen", "QWEN", "qwen ", QWEN_PATH, QWEN_PATH + "/", "Qwen3-8B",
                 "Qwen3-8B/", "models/Qwen3-8B", LLAMA_PATH, LLAMA_PATH.rstrip("/"),
                 "Llama-3.1-8B", "srv", "/", "8B", "Qwen3"):
        accepted = app.show(name).status_code == 200
        assert accepted == registry.is_base_model(name), name


@pytest.mark.parametrize("check", [_check_probes, _check_guarded, _check_no_paths,
                                   _check_second_model, _check_registry_matching])
def test_patched_ollama_probes(patched_vllm: Path, check: Any) -> None:
    check(patched_vllm)


def test_patched_registers_router(patched_vllm: Path) -> None:
    """register_instrumentator_api_routers() includes the Ollama router (the real
    package __init__, its sibling routers stubbed)."""
    pkg_dir = patched_vllm / "entrypoints/serve/instrumentator"
    protocol, serving = _registry_modules(patched_vllm)
    ollama = load_with_auto_stubs(pkg_dir / "ollama_compat.py", {
        "vllm.entrypoints.openai.models.protocol": protocol,
        "vllm.entrypoints.openai.models.serving": serving,
    })
    pkg = "_qwen38_instrumentator"
    siblings = {f"{pkg}.{name}": make_module(f"{pkg}.{name}", router=f"{name}-router",
                                             attach_router=lambda app: None)
                for name in ("basic", "health", "metrics", "offline_docs")}
    siblings[f"{pkg}.ollama_compat"] = ollama
    spec = importlib.util.spec_from_file_location(
        pkg, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with stub_modules({pkg: module, **siblings}):
        spec.loader.exec_module(module)
        included: list[Any] = []
        module.register_instrumentator_api_routers(
            SimpleNamespace(include_router=included.append))
    assert ollama.router in included


def test_pristine_lacks_ollama_probes(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_probes(pristine_vllm))

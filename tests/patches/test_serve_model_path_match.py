"""serve-model-path-match: the served model's root path and its basename are accepted as the
model name (exact matches only); anything else 404s without naming a served path."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, load_module, load_with_auto_stubs, make_module

pytestmark = pytest.mark.e2e

ROOT = "/srv/models/Qwen3-8B-AWQ"


@dataclass
class _Error:
    message: str
    code: int


def _create_error_response(message: Any, err_type: str = "BadRequestError",
                           status_code: HTTPStatus = HTTPStatus.BAD_REQUEST,
                           param: str | None = None) -> _Error:
    return _Error(message=str(message), code=int(status_code))


def _load(tree: Path) -> tuple[Any, Any, Any]:
    protocol = load_module(tree / "entrypoints/openai/models/protocol.py")
    serve = make_module("vllm.entrypoints.serve", create_error_response=_create_error_response)
    models = load_with_auto_stubs(
        tree / "entrypoints/openai/models/serving.py",
        {"vllm.entrypoints.openai.models.protocol": protocol, "vllm.entrypoints.serve": serve},
    )
    envs = SimpleNamespace(VLLM_SKIP_MODEL_NAME_VALIDATION=False,
                           VLLM_ALLOW_RUNTIME_LORA_UPDATING=False)
    vllm_stub = make_module("vllm", envs=envs, PromptType=object, SamplingParams=object)
    engine = load_with_auto_stubs(
        tree / "entrypoints/serve/engine/serving.py",
        {"vllm": vllm_stub, "vllm.entrypoints.serve": serve,
         "vllm.entrypoints.openai.models.serving": models},
    )
    return protocol, models, engine


def _check(tree: Path, served_name: str) -> None:
    protocol, models, engine = _load(tree)
    base = [protocol.BaseModelPath(name=served_name, model_path=ROOT)]
    registry = models.OpenAIModelRegistry(model_config=None, base_model_paths=base)
    serving = engine.BaseServing(models=registry, model_config=None, request_logger=None)

    def check(name: str) -> Any:
        return asyncio.run(serving._check_model(SimpleNamespace(model=name)))

    for accepted in (served_name, ROOT, "Qwen3-8B-AWQ"):
        assert registry.is_base_model(accepted), accepted
        assert asyncio.run(registry.check_model(accepted)) is None, accepted
        assert check(accepted) is None, accepted
    for rejected in ("Qwen3-8B", "qwen3-8b-awq", "models/Qwen3-8B-AWQ", "/srv/models",
                     ROOT + "-x", "Qwen3-8B-AWQ/", "Qwen3"):
        assert not registry.is_base_model(rejected), rejected
        err = check(rejected)
        assert err is not None and err.code == 404, rejected
        assert f"`{rejected}`" in err.message
        # Apart from the echoed request, the body names no served path.
        rest = err.message.replace(f"`{rejected}`", "")
        assert ROOT not in rest, err.message
        assert "/srv/models" not in rest, err.message


@pytest.mark.parametrize("served_name", ["qwen", ROOT])
def test_patched_accepts_root_and_basename(patched_vllm: Path, served_name: str) -> None:
    _check(patched_vllm, served_name)


@pytest.mark.parametrize("served_name", ["qwen", ROOT])
def test_pristine_lacks_path_match(pristine_vllm: Path, served_name: str) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, served_name))

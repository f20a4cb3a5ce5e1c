"""topk-honour-flashinfer-sampler-switch: VLLM_USE_FLASHINFER_SAMPLER=0 also makes the
vocab-parallel (drafter candidate) top-k use torch.topk instead of FlashInfer's."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, make_module, stub_modules

pytestmark = pytest.mark.e2e


class _Logger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def info_once(self, msg: str, *args: Any) -> None:
        self.info(msg, *args)


def _funcs(tree: Path, use_flashinfer_sampler: bool, calls: list[str]) -> tuple[Any, Any]:
    def flashinfer_top_k(scores: Any, k: int, **kw: Any) -> str:
        calls.append("flashinfer")
        return "flashinfer"

    def torch_topk(scores: Any, k: int, dim: int = -1) -> str:
        calls.append("torch")
        return "torch"

    torch = SimpleNamespace(Tensor=object, topk=torch_topk)
    envs = SimpleNamespace(VLLM_USE_FLASHINFER_SAMPLER=use_flashinfer_sampler)
    ns = {
        "cache": functools.cache, "Callable": Callable, "torch": torch, "envs": envs,
        "current_platform": SimpleNamespace(is_cuda=lambda: True),
        "has_flashinfer": lambda: True,
        "logger": _Logger(logging.getLogger("test.topk"), {}),
    }
    path = tree / "model_executor/layers/logits_processor.py"
    fi_topk = exec_function(path, "_flashinfer_topk", ns)
    ns["_flashinfer_topk"] = fi_topk
    topk = exec_function(path, "_topk", ns)
    ns["_topk"] = topk
    fi_mod = make_module("flashinfer", top_k=flashinfer_top_k)
    return fi_topk, lambda *a: _with(fi_mod, topk, *a)


def _with(fi_mod: Any, fn: Any, *args: Any) -> Any:
    with stub_modules({"flashinfer": fi_mod}):
        return fn(*args)


def _check(tree: Path) -> None:
    scores = SimpleNamespace(is_cuda=True)
    calls: list[str] = []
    _, topk = _funcs(tree, use_flashinfer_sampler=True, calls=calls)
    assert topk(scores, 4) == "flashinfer"
    calls.clear()
    _, topk = _funcs(tree, use_flashinfer_sampler=False, calls=calls)
    assert topk(scores, 4) == "torch", "VLLM_USE_FLASHINFER_SAMPLER=0 not honoured"
    assert calls == ["torch"]


def test_patched_switch_covers_topk(patched_vllm: Path) -> None:
    _check(patched_vllm)
    src = (patched_vllm / "model_executor/layers/logits_processor.py").read_text()
    assert "import vllm.envs as envs" in src and "os.environ" not in src


def test_pristine_ignores_switch(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))

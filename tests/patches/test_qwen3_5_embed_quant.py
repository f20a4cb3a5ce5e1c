"""qwen3_5-embed-quant: Qwen3.5's model and its MTP module build the token embedding with
the model's quant config and the layer's prefix, so a quantized checkpoint's embedding is
created quantized (the quant config decides per prefix).

Runs vLLM's own Qwen3_5Model.__init__ and Qwen3_5MultiTokenPredictor.__init__ (from
qwen3_5.py and qwen3_5_mtp.py, their other layers stubbed) and records how they build
VocabParallelEmbedding; the embedding itself needs a tensor-parallel group."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    LooseAutoStub,
    assert_pristine_lacks,
    load_with_auto_stubs,
    make_module,
)

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")

PACKAGE = "vllm.model_executor.models"


class _QuantConfig:
    def get_name(self) -> str:
        return "gptq_marlin"


class _Mapper:
    def __or__(self, other: Any) -> _Mapper:
        return self

    def __ror__(self, other: Any) -> _Mapper:
        return self


def _compile_decorator(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], type) and not kwargs:
        return args[0]
    return lambda cls: cls


def _embedding_calls(tree: Path) -> dict[str, dict[str, Any]]:
    """Build both modules; return, per module, the embedding's keyword arguments
    (quant_config and prefix resolved from positions too)."""
    calls: dict[str, dict[str, Any]] = {}
    current: list[str] = []

    class VocabParallelEmbedding:
        def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype: Any = None,
                     org_num_embeddings: Any = None, padding_size: int = 64,
                     quant_config: Any = None, prefix: str = "", **kwargs: Any) -> None:
            calls[current[-1]] = {"quant_config": quant_config, "prefix": prefix,
                                  "num_embeddings": num_embeddings}

    embedding = LooseAutoStub("vllm.model_executor.layers.vocab_parallel_embedding")
    embedding.__dict__["VocabParallelEmbedding"] = VocabParallelEmbedding
    registry = SimpleNamespace(register_processor=lambda *a, **k: (lambda cls: cls))
    multimodal = LooseAutoStub("vllm.multimodal")
    multimodal.__dict__["MULTIMODAL_REGISTRY"] = registry
    qwen3_next = LooseAutoStub(f"{PACKAGE}.qwen3_next")
    qwen3_next.__dict__["Qwen3NextModel"] = type("Qwen3NextModel", (),
                                                 {"hf_to_vllm_mapper": _Mapper()})
    utils = LooseAutoStub(f"{PACKAGE}.utils")
    utils.__dict__["make_layers"] = lambda n, fn, prefix: (0, 0, [])
    overrides = {
        "vllm.compilation.decorators": make_module(
            "vllm.compilation.decorators", support_torch_compile=_compile_decorator),
        "vllm.multimodal": multimodal,
        "vllm.model_executor.layers.vocab_parallel_embedding": embedding,
        f"{PACKAGE}.qwen3_next": qwen3_next,
        f"{PACKAGE}.utils": utils,
    }
    main = load_with_auto_stubs(tree / "model_executor/models/qwen3_5.py", overrides,
                                package=PACKAGE, loose=True)
    mtp = load_with_auto_stubs(tree / "model_executor/models/qwen3_5_mtp.py",
                               {**overrides, f"{PACKAGE}.qwen3_5": main},
                               package=PACKAGE, loose=True)
    text_config = SimpleNamespace(vocab_size=151936, hidden_size=64, layer_types=[],
                                  num_hidden_layers=2, mtp_num_hidden_layers=0,
                                  rms_norm_eps=1e-6)
    quant = _QuantConfig()
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_text_config=text_config,
                                     hf_config=SimpleNamespace(),
                                     # no local directory: no MTP draft-vocab head
                                     # (qwen3_5-mtp-draft-vocab)
                                     model="Qwen/Qwen3.5-hub-id"),
        parallel_config=SimpleNamespace(eplb_config=SimpleNamespace(num_redundant_experts=0)),
        quant_config=quant)
    current.append("model")
    main.Qwen3_5Model(vllm_config=vllm_config, prefix="model")
    current.append("mtp")
    mtp.Qwen3_5MultiTokenPredictor(vllm_config=vllm_config, prefix="mtp")
    for call in calls.values():
        call["quantized"] = call["quant_config"] is quant
    return calls


def _check(tree: Path) -> None:
    calls = _embedding_calls(tree)
    assert set(calls) == {"model", "mtp"}, calls
    assert calls["model"]["quantized"] and calls["model"]["prefix"] == "model.embed_tokens"
    assert calls["mtp"]["quantized"] and calls["mtp"]["prefix"] == "mtp.embed_tokens"
    assert calls["model"]["num_embeddings"] == calls["mtp"]["num_embeddings"] == 151936


def test_patched_embeddings_get_quant_config(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_embeddings_unquantized(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))

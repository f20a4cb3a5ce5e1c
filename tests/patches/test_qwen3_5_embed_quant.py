"""qwen3_5-embed-quant: Qwen3.5's model and its MTP module build the token embedding with
the model's quant config and the layer's prefix, so a quantized checkpoint's embedding is
created quantized (the quant config decides per prefix).

Runs vLLM's own Qwen3_5Model.__init__ and Qwen3_5MultiTokenPredictor.__init__ (from
qwen3_5.py and qwen3_5_mtp.py, their other layers stubbed). The quant config is vLLM's own
ModelOpt mixed-precision config (modelopt.py), one of the two methods that quantize
embeddings in 0.32.0 (compressed-tensors is the other; GPTQ and AWQ do not): a checkpoint
whose quantized_layers give embed_tokens the Q8_0 block codec. The embedding stand-in
resolves its method as VocabParallelEmbedding does (the real layer needs a tensor-parallel
group), and the method is vLLM's own ModelOptBlockQuantLinearMethod, built with the b12x
kernel probe answered (it needs an SM12x GPU)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from ._helpers import (
    LooseAutoStub,
    assert_pristine_lacks,
    load_module,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")

PACKAGE = "vllm.model_executor.models"
QUANT = "vllm.model_executor.layers.quantization"
Q8_0 = {"quant_algo": "Q8_0", "group_size": 32, "block_payload_bytes": 34, "packing": "ggml"}


class VocabParallelEmbedding:
    """The embedding as vLLM builds it, up to its quant method: the quant config's
    method for the layer's prefix, or None (unquantized)."""

    calls: ClassVar[dict[str, dict[str, Any]]] = {}
    current: ClassVar[list[str]] = []
    lazy: ClassVar[dict[str, Any]] = {}

    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype: Any = None,
                 org_num_embeddings: Any = None, padding_size: int = 64,
                 quant_config: Any = None, prefix: str = "", **kwargs: Any) -> None:
        method = None
        if quant_config is not None:
            with stub_modules(self.lazy):
                method = quant_config.get_quant_method(self, prefix)
        self.calls[self.current[-1]] = {"quant_method": method, "prefix": prefix,
                                        "num_embeddings": num_embeddings}


class ParallelLMHead(VocabParallelEmbedding):
    pass


def _embedding_module() -> Any:
    module = LooseAutoStub("vllm.model_executor.layers.vocab_parallel_embedding")
    module.__dict__.update(VocabParallelEmbedding=VocabParallelEmbedding,
                           ParallelLMHead=ParallelLMHead)
    return module


def _modelopt(tree: Path, quantized_layers: dict[str, dict[str, Any]]) -> Any:
    """vLLM's ModelOptMixedPrecisionConfig for a checkpoint with these quantized layers;
    its lazily imported block-quant method module is vLLM's own too."""
    b12x = load_module(tree / "utils/b12x.py")
    api = SimpleNamespace(BlockQuantLinearWeight=object, is_supported=lambda: True)
    b12x.__dict__["get_b12x_blockscaled"] = lambda: api
    linear = LooseAutoStub("vllm.model_executor.layers.linear")
    linear.__dict__["register_weight_loader_v2_supported_method"] = lambda cls: cls
    common = {"vllm.model_executor.layers.vocab_parallel_embedding": _embedding_module(),
              "vllm.model_executor.layers.linear": linear, "vllm.utils.b12x": b12x,
              "vllm.logger": once_logger_module()}
    quant = tree / "model_executor/layers/quantization"
    block = load_with_auto_stubs(quant / "modelopt_block_quant.py", common, package=QUANT,
                                 loose=True)
    modelopt = load_with_auto_stubs(quant / "modelopt.py",
                                    {**common, f"{QUANT}.modelopt_block_quant": block},
                                    package=QUANT, loose=True)
    kernels = make_module("vllm.model_executor.kernels.linear",
                          _get_linear_backend=lambda quantization: "auto")
    VocabParallelEmbedding.lazy = {
        **{name: LooseAutoStub(name) for name in (
            "vllm", "vllm.model_executor", "vllm.model_executor.layers", QUANT)},
        f"{QUANT}.modelopt_block_quant": block,
        "vllm.model_executor.kernels.linear": kernels, "vllm.utils.b12x": b12x}
    config = modelopt.ModelOptMixedPrecisionConfig(
        kv_cache_quant_method=None, exclude_modules=[], quantized_layers=quantized_layers,
        fp8_config=None, nvfp4_config=None, w4a16_nvfp4_config=None, mxfp8_config=None)
    config.packed_modules_mapping = {}
    config.block_method = block.ModelOptBlockQuantLinearMethod
    return config


class _Mapper:
    def __or__(self, other: Any) -> _Mapper:
        return self

    def __ror__(self, other: Any) -> _Mapper:
        return self


def _compile_decorator(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], type) and not kwargs:
        return args[0]
    return lambda cls: cls


def _embedding_calls(tree: Path, quant: Any) -> dict[str, dict[str, Any]]:
    """Build both modules with ``quant`` as the model's quant config; return, per module,
    the embedding's prefix and the quant method it resolved."""
    calls: dict[str, dict[str, Any]] = {}
    VocabParallelEmbedding.calls, VocabParallelEmbedding.current = calls, []
    current = VocabParallelEmbedding.current
    embedding = _embedding_module()
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
    return calls


def _check(tree: Path) -> None:
    quant = _modelopt(tree, {"model.embed_tokens": Q8_0, "mtp.embed_tokens": Q8_0,
                             "model.layers.0.mlp.down_proj": Q8_0})
    calls = _embedding_calls(tree, quant)
    assert set(calls) == {"model", "mtp"}, calls
    for name in ("model", "mtp"):
        method = calls[name]["quant_method"]
        assert calls[name]["prefix"] == f"{name}.embed_tokens"
        # ModelOpt's packed Q8_0 embedding method, not an unquantized embedding.
        assert isinstance(method, quant.block_method), (name, method)
        assert method.codec == "q8_0" and (method.block_size, method.block_bytes) == (32, 34)
    assert calls["model"]["num_embeddings"] == calls["mtp"]["num_embeddings"] == 151936


def _check_unquantized_embedding(tree: Path) -> None:
    # A checkpoint that leaves the embedding unquantized: the config answers no method,
    # as before the patch.
    quant = _modelopt(tree, {"model.layers.0.mlp.down_proj": Q8_0})
    calls = _embedding_calls(tree, quant)
    assert [calls[n]["quant_method"] for n in ("model", "mtp")] == [None, None]


def test_patched_embeddings_get_quant_config(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_unquantized_embedding_unchanged(patched_vllm: Path) -> None:
    _check_unquantized_embedding(patched_vllm)


def test_pristine_embeddings_unquantized(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))

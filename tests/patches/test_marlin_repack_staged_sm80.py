"""marlin-repack-staged-sm80: with ``VLLM_MARLIN_REPACK_STAGED`` the Marlin dense kernel stages
each packed weight in one grow-only buffer per device (the bytes ``marlin_pad_qweight`` gives),
releases the parameter's source before ``gptq_marlin_repack`` runs, and the model loader frees
the buffer after the last layer; off, nothing changes.

Runs vLLM's own ``marlin_stage_qweight`` and ``MarlinLinearKernel.process_weights_after_loading``
(model_executor/kernels/linear/mixed_precision/marlin.py, with vLLM's own padding helpers) and
the loader's ``process_weights_after_loading`` (model_executor/model_loader/utils.py), with the
compiled repack replaced by a recorder. Peak memory on a GPU:
tests/gpu/test_marlin_repack_staged_sm80_gpu.py."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from . import test_marlin_int8_negative_scales as neg
from ._helpers import (
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_module,
    make_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

KERNEL = neg.KERNEL
LOADER = "model_executor/model_loader/utils.py"


def _stager(tree: Path, staging: dict[Any, Any]) -> Any:
    return exec_function(tree / KERNEL, "marlin_stage_qweight",
                         {"torch": torch, "_repack_staging": staging})


def _missing(tree: Path) -> None:
    if "def marlin_stage_qweight(" not in (tree / KERNEL).read_text():
        raise AssertionError("marlin_stage_qweight is not in marlin.py")


# (size_k, size_n) of a ladder of layer shapes; padded ones need Marlin's thread tiles
LADDER = [(256, 128), (512, 192), (512, 100), (384, 256), (1024, 512), (256, 64)]


def _check_staged_view(tree: Path) -> None:
    _missing(tree)
    u = neg._utils(tree)
    staging: dict[Any, Any] = {}
    stage = _stager(tree, staging)
    buffers: list[int] = []
    gen = torch.Generator().manual_seed(1)
    for size_k, size_n in LADDER:
        padded_n, padded_k = u["marlin_padded_nk"](size_n, size_k, 128)
        src = torch.randint(-2**31, 2**31 - 1, (size_k // 8, size_n), generator=gen,
                            dtype=torch.int32)
        for source in (src, src.t().contiguous().t()):  # contiguous and strided
            want = u["marlin_pad_qweight"](source.contiguous(), size_n, size_k, padded_n,
                                           padded_k)
            got = stage(source, size_n, size_k, padded_n, padded_k)
            assert torch.equal(got, want), (size_k, size_n, source.stride())
            assert got.data_ptr() == staging[source.device].data_ptr()
            ptr = staging[source.device].data_ptr()
            if not buffers or buffers[-1] != ptr:
                buffers.append(ptr)
    # grown only for a larger shape: 256x128 (4096 words), 512x192 (12288), 1024x512 (65536)
    assert len(buffers) == 3, buffers
    # another dtype: a new buffer
    stage(torch.zeros(16, 64, dtype=torch.int16), 64, 128, 64, 128)
    assert staging[torch.device("cpu")].dtype == torch.int16


def test_patched_staged_view_equals_the_padded_copy(patched_vllm: Path) -> None:
    _check_staged_view(patched_vllm)


def _load(tree: Path, staged: bool, monkeypatch: Any, n: int = 100) -> tuple[list[Any], Any]:
    """One real process_weights_after_loading of an int8 layer (K 512, N ``n``): what the
    repack saw (the tensor, and the parameter's size at that moment)."""
    monkeypatch.setenv("VLLM_MARLIN_REPACK_STAGED", "1" if staged else "0")
    envs = load_envs(tree)
    st = load_module(tree / "scalar_type.py").scalar_types
    staging: dict[Any, Any] = {}
    seen: list[Any] = []
    layer = torch.nn.Module()

    def repack(q: Any, **kw: Any) -> Any:
        seen.append((q, layer.w_q.data.numel()))
        return q.clone()

    namespace = {**neg._utils(tree), "torch": torch, "scalar_types": st, "envs": envs,
                 "ops": SimpleNamespace(gptq_marlin_repack=repack),
                 "permute_param_layout_": lambda x, **kw: None,
                 "BasevLLMParameter": torch.nn.Parameter,
                 "marlin_permute_scales": lambda s, **kw: s,
                 "marlin_make_empty": lambda device: torch.empty(0, dtype=torch.int),
                 "marlin_permute_bias": lambda b: b, "logger": logging.getLogger("t"),
                 "_repack_staging": staging}
    if "def marlin_stage_qweight(" in (tree / KERNEL).read_text():
        namespace["marlin_stage_qweight"] = _stager(tree, staging)
    run = exec_function(tree / KERNEL, "MarlinLinearKernel.process_weights_after_loading",
                        namespace)
    _, packed, scales = neg._layer(k=512, n=n, g=128, negative=0.0)
    layer.w_q = torch.nn.Parameter(packed.clone(), requires_grad=False)
    layer.w_s = torch.nn.Parameter(scales.clone(), requires_grad=False)
    config = SimpleNamespace(act_type=neg._Act(torch.float16), weight_type=st.uint4b8,
                             partition_weight_shape=(512, n), group_size=128,
                             zero_points=False)
    kernel = SimpleNamespace(config=config, w_q_name="w_q", w_s_name="w_s", w_zp_name=None,
                             _transform_param=lambda layer, name, fn: fn(getattr(layer, name)))
    run(kernel, layer)
    want = neg._utils(tree)["marlin_pad_qweight"](packed, n, 512, 128, 512)
    assert torch.equal(layer.w_q.data, want)  # the repack's output is the parameter
    return seen, (staging, want)


def _check_kernel(tree: Path, monkeypatch: Any) -> None:
    _missing(tree)
    (seen, (staging, want)) = _load(tree, True, monkeypatch)
    ((q, source_size),) = seen
    assert torch.equal(q, want)
    assert source_size == 0  # the source was released before the repack ran
    assert q.data_ptr() == staging[q.device].data_ptr()


def test_patched_kernel_repacks_from_the_staged_view(patched_vllm: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _check_kernel(patched_vllm, monkeypatch)


def test_patched_knob_off_is_stock(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (seen, (staging, want)) = _load(patched_vllm, False, monkeypatch)
    ((q, source_size),) = seen
    assert torch.equal(q, want) and source_size > 0 and not staging


def _loader_releases(tree: Path, staged: bool, monkeypatch: Any) -> list[str]:
    monkeypatch.setenv("VLLM_MARLIN_REPACK_STAGED", "1" if staged else "0")
    events: list[str] = []

    class QuantizeMethodBase:
        supports_pre_processed_weights = True
        requires_device_loading = False

        def process_weights_after_loading(self, module: Any) -> None:
            events.append("layer")

    module = torch.nn.Linear(2, 2)
    module.quant_method = QuantizeMethodBase()
    model = torch.nn.Sequential(module)
    run = exec_function(tree / LOADER, "process_weights_after_loading", {
        "torch": torch, "envs": load_envs(tree), "nullcontext": nullcontext, "QuantizeMethodBase": QuantizeMethodBase,
        "maybe_retie_word_embeddings": lambda *a: None,
        "is_weights_pre_processed": lambda: False,
        "release_device_memory_under_pressure": lambda device: None,
        "is_deferred_attention_layer": lambda m: False})
    marlin = make_module("vllm.model_executor.kernels.linear.mixed_precision.marlin",
                         release_marlin_repack_staging=lambda: events.append("release"))
    online = {name: make_module(name, OnlineLinearBase=type("A", (), {}),
                                OnlineMoEMethodBase=type("B", (), {}))
              for name in ("vllm.model_executor.layers.quantization.online.fp8",
                           "vllm.model_executor.layers.quantization.online.moe_base")}
    with stub_modules({marlin.__name__: marlin, **online}):
        run(model, SimpleNamespace(quantization=None, dtype=torch.float16),
            torch.device("cpu"))
    return events


def test_patched_loader_frees_the_buffer(patched_vllm: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert _loader_releases(patched_vllm, True, monkeypatch) == ["layer", "release"]
    assert _loader_releases(patched_vllm, False, monkeypatch) == ["layer"]


def test_pristine_has_no_staging(pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (seen, _) = _load(pristine_vllm, True, monkeypatch)
    assert seen[0][1] > 0  # the source is alive while the repack runs
    assert_pristine_lacks(lambda: _check_staged_view(pristine_vllm))
    assert_pristine_lacks(lambda: _check_kernel(pristine_vllm, monkeypatch))

"""sampler-warmup-cuda: with VLLM_SAMPLER_WARMUP_CUDA=1 the V2 model runner registers the
top-k/top-p sampler kernels' JIT warmups on CUDA too (not on ROCm only), inside the runner's
warmup registry; unset, CUDA registers none, as upstream. The knob is registered in envs.py
and read through it (vLLM's own envs.py is loaded).

Runs vLLM's own GPUModelRunner.load_model (v1/worker/gpu/model_runner.py, an already
built model handed in) up to the sampler's construction, with vLLM's own
register_top_k_top_p_warmups (topk_topp_sampler.py) registering recording kernels.
The warmups' effect (compiles at boot, none in requests) needs a GPU: not claimed here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    LooseAutoStub,
    assert_pristine_lacks,
    envs_stubs_active,
    exec_function,
    load_envs,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")

KERNELS = ("_topk_topp", "_topp_split_stats", "_topp_split_step", "_topp_split_mask")


class _SamplerReached(Exception):
    """Raised by the Sampler stand-in: load_model got past the warmup registration."""


class _Registry:
    """The runner's JitWarmupRegistry: records what registers while it is active."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    @contextmanager
    def activate(self) -> Iterator[None]:
        self.events.append("activate")
        yield
        self.events.append("deactivate")


class _Kernel:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def register_warmup(self, **kwargs: Any) -> None:
        self.events.append(self.name)


def _platform(kind: str) -> SimpleNamespace:
    return SimpleNamespace(is_rocm=lambda: kind == "rocm", is_cuda=lambda: kind == "cuda",
                           is_cuda_alike=lambda: kind in ("cuda", "rocm"),
                           is_cpu=lambda: kind == "cpu")


def _registered(tree: Path, kind: str, monkeypatch: pytest.MonkeyPatch,
                opt_in: str | None = None) -> list[str]:
    """The sampler kernels registered, in load_model's registry activation, on ``kind``
    with VLLM_SAMPLER_WARMUP_CUDA set to ``opt_in`` (None: unset)."""
    if opt_in is None:
        monkeypatch.delenv("VLLM_SAMPLER_WARMUP_CUDA", raising=False)
    else:
        monkeypatch.setenv("VLLM_SAMPLER_WARMUP_CUDA", opt_in)
    events: list[str] = []
    platform = _platform(kind)
    platforms = LooseAutoStub("vllm.platforms")
    platforms.__dict__["current_platform"] = platform

    def sampler(**kwargs: Any) -> Any:
        raise _SamplerReached

    runner_mod = load_with_auto_stubs(tree / "v1/worker/gpu/model_runner.py", {
        "vllm.platforms": platforms,
        "vllm.envs": load_envs(tree),
        "vllm.logger": once_logger_module(),
        "vllm.v1.worker.gpu.sample.sampler": make_module(
            "vllm.v1.worker.gpu.sample.sampler", Sampler=sampler),
        "vllm.v1.worker.gpu.model_states": make_module(
            "vllm.v1.worker.gpu.model_states",
            init_model_state=lambda *a: SimpleNamespace(num_new_sampled_tokens_per_step=1)),
    }, loose=True)
    kernels = {name: _Kernel(name, events) for name in KERNELS}
    register = exec_function(tree / "v1/sample/ops/topk_topp_sampler.py",
                             "register_top_k_top_p_warmups",
                             {"HAS_TRITON": True, "current_platform": platform, **kernels})
    topk = LooseAutoStub("vllm.v1.sample.ops.topk_topp_sampler")
    topk.__dict__["register_top_k_top_p_warmups"] = register
    cls = runner_mod.GPUModelRunner
    runner = cls.__new__(cls)
    runner.__dict__.update(
        lora_config=None, use_aux_hidden_state_outputs=False, use_pp=False,
        num_speculative_steps=0, speculator=None, is_last_pp_rank=True,
        is_pooling_model=False, speculative_config=None, max_num_reqs=4, vocab_size=128,
        device="cpu", req_states=None, jit_warmup_registry=_Registry(events),
        parallel_config=SimpleNamespace(enable_batch_sharded_sampling=False),
        load_config=SimpleNamespace(load_format="auto"),
        vllm_config=SimpleNamespace(watermark_config=None, load_config=None,
                                    model_config=None),
        model_config=SimpleNamespace(logits_processors=None, logprobs_mode="raw_logprobs",
                                     use_fp64_gumbel=False, enable_trace_replay=False,
                                     return_sampling_mask=False))
    lazy: dict[str, ModuleType] = {
        name: LooseAutoStub(name)
        for name in ("vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.ops")}
    lazy["vllm.v1.sample.ops.topk_topp_sampler"] = topk
    with stub_modules(lazy), pytest.raises(_SamplerReached):
        runner.load_model(model=SimpleNamespace())
    # Only what registered while the registry was active counts.
    active, inside = [], False
    for event in events:
        if event in ("activate", "deactivate"):
            inside = event == "activate"
        elif inside:
            active.append(event)
    return active


def _check(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Opted in: CUDA registers the four kernels.
    assert _registered(tree, "cuda", monkeypatch, "1") == list(KERNELS)


def _check_default(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Unset or 0: CUDA registers none, as upstream.
    assert _registered(tree, "cuda", monkeypatch) == []
    assert _registered(tree, "cuda", monkeypatch, "0") == []
    # ROCm registers them either way, as before; a CPU never does.
    assert _registered(tree, "rocm", monkeypatch) == list(KERNELS)
    assert _registered(tree, "rocm", monkeypatch, "1") == list(KERNELS)
    assert _registered(tree, "cpu", monkeypatch, "1") == []


def _check_registered(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    assert "VLLM_SAMPLER_WARMUP_CUDA" in envs.environment_variables
    monkeypatch.delenv("VLLM_SAMPLER_WARMUP_CUDA", raising=False)
    assert envs.VLLM_SAMPLER_WARMUP_CUDA is False
    with envs_stubs_active(envs):
        base = envs.compile_factors()
        monkeypatch.setenv("VLLM_SAMPLER_WARMUP_CUDA", "1")
        assert envs.VLLM_SAMPLER_WARMUP_CUDA is True
        # Which kernels compile at boot is no part of a traced graph.
        assert envs.compile_factors() == base


def test_patched_registers_sampler_warmups_on_cuda_opted_in(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, monkeypatch)


def test_patched_cuda_registers_none_by_default(patched_vllm: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _check_default(patched_vllm, monkeypatch)


def test_patched_registers_knob(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_registered(patched_vllm, monkeypatch)


def test_pristine_registers_on_rocm_only(pristine_vllm: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert _registered(pristine_vllm, "rocm", monkeypatch) == list(KERNELS)
    assert _registered(pristine_vllm, "cuda", monkeypatch) == []
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))

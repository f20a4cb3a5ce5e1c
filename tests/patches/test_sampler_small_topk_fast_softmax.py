"""sampler-small-topk-fast-softmax: V1's native sampler and rejection sampler take fp32
probabilities from ``softmax_fp32`` (the multi-block row softmax of row_softmax.py for 1-16 rows
of >= 16,384 columns on CUDA, torch's softmax otherwise); V1 drafters apply the requests'
top-k/top-p to the draft logits with ``VLLM_DRAFT_TOPK_TOPP=1`` (off by default) and divide
them by ``VLLM_DRAFT_TEMP_SCALE``. The row's small-k top-k/top-p half is retired (slower than
0.32.0's Triton path on the H200): 0.32.0's top-k/top-p dispatch is unchanged, checked here.

Runs vLLM's own topk_topp_sampler.py (``TopKTopPSampler.forward_native``, the dispatch, the
sort path), row_softmax.py's dispatcher (its Triton kernels run in
tests/gpu/test_sampler_small_topk_fast_softmax_gpu.py), rejection_sampler.py's
``rejection_sample`` source and the drafter's ``compute_probs_and_sample_next_token``, on CPU
torch with the device-only parts stubbed (the platform says CUDA; 0.32.0's Triton
top-k/top-p is a spy answering with the sort path)."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_with_auto_stubs,
    make_module,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

SAMPLER = "v1/sample/ops/topk_topp_sampler.py"
ROW_SOFTMAX = "v1/sample/ops/row_softmax.py"
VOCAB = 248320


def _platform(cpu: bool = False) -> SimpleNamespace:
    return SimpleNamespace(is_cpu=lambda: cpu, is_cuda=lambda: not cpu,
                           is_cuda_alike=lambda: not cpu, is_xpu=lambda: False,
                           simple_compile_backend="eager")


class _TritonSpy:
    """Stands in for 0.32.0's ``apply_top_k_top_p_triton``: records the call and answers
    with the sort path (the pristine reference)."""

    def __init__(self) -> None:
        self.calls = 0
        self.sort_path: Any = None

    def __call__(self, logits: Any, k: Any, p: Any, **flags: Any) -> Any:
        # flags: 0.33.0's has_topp_only_rows, a hint the sort path does not need
        self.calls += 1
        return self.sort_path(logits, k, p)


def _triton_utils() -> ModuleType:
    # row_softmax's kernels are only defined here (no Triton on this machine): a
    # decorator that keeps the function and a `tl` that answers `constexpr`.
    return make_module("vllm.triton_utils", HAS_TRITON=True,
                       triton=SimpleNamespace(jit=lambda fn: fn, cdiv=lambda a, b: -(-a // b)),
                       tl=SimpleNamespace(constexpr=int))


def _sampler(tree: Path, cpu: bool = False) -> tuple[ModuleType, _TritonSpy]:
    spy = _TritonSpy()
    platform = _platform(cpu)
    platforms = make_module("vllm.platforms", current_platform=platform,
                            CpuArchEnum=SimpleNamespace(RISCV="riscv", POWERPC="ppc"))
    overrides = {
        "vllm.platforms": platforms,
        "vllm.triton_utils": _triton_utils(),
        "vllm.v1.sample.ops.topk_topp_triton": make_module(
            "vllm.v1.sample.ops.topk_topp_triton", apply_top_k_top_p_triton=spy,
            _topk_topp=None, _topp_split_mask=None, _topp_split_stats=None,
            _topp_split_step=None),
    }
    if (tree / ROW_SOFTMAX).is_file():
        overrides["vllm.v1.sample.ops.row_softmax"] = load_with_auto_stubs(
            tree / ROW_SOFTMAX, {"vllm.platforms": platforms,
                                 "vllm.triton_utils": _triton_utils()})
    mod = load_with_auto_stubs(tree / SAMPLER, overrides)
    spy.sort_path = mod.apply_top_k_top_p_pytorch
    return mod, spy


def test_patched_top_k_top_p_dispatch_is_0_32s(patched_vllm: Path,
                                               pristine_vllm: Path) -> None:
    """The retired small-k half leaves no trace: top-k/top-p calls the pin's own Triton
    path, with the pin's own signature."""
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1))
    k = torch.tensor([3, 20, 64, 7], dtype=torch.int32)
    p = torch.full((4,), 0.9)
    mod, spy = _sampler(patched_vllm)
    pristine, _ = _sampler(pristine_vllm)
    assert (list(inspect.signature(mod.apply_top_k_top_p).parameters)
            == list(inspect.signature(pristine.apply_top_k_top_p).parameters))
    out = mod.apply_top_k_top_p(logits.clone(), k, p)
    assert spy.calls == 1
    assert torch.equal(out, mod.apply_top_k_top_p_pytorch(logits.clone(), k, p))


class _SoftmaxSpy:
    """Stands in for row_softmax.softmax_fp32: records its inputs, answers torch's softmax."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []

    def __call__(self, logits: Any) -> Any:
        self.inputs.append(logits)
        self.outputs.append(logits.softmax(dim=-1, dtype=torch.float32))
        return self.outputs[-1]


def _check_forward_native(tree: Path) -> None:
    """TopKTopPSampler.forward_native samples from softmax_fp32's probabilities of the
    masked logits."""
    mod, spy = _sampler(tree)
    softmax = _SoftmaxSpy()
    mod.__dict__["softmax_fp32"] = softmax
    sampler = mod.TopKTopPSampler.__new__(mod.TopKTopPSampler)
    torch.nn.Module.__init__(sampler)
    sampler.logprobs_mode, sampler.use_fp64_gumbel = "processed_logits", False
    seen: list[Any] = []

    def random_sample(probs: Any, generators: Any, fp64: bool) -> Any:
        seen.append(probs)
        return probs.argmax(-1)

    mod.__dict__["random_sample"] = random_sample
    logits = torch.randn(3, 2000, generator=torch.Generator().manual_seed(2))
    k = torch.tensor([5, 9, 2], dtype=torch.int32)
    _, processed = sampler.forward_native(logits.clone(), {}, k, None)
    assert spy.calls == 1
    assert len(softmax.inputs) == 1, "forward_native's probabilities are not softmax_fp32's"
    assert softmax.inputs[0] is processed and seen == [softmax.outputs[0]]


def test_patched_forward_native_uses_softmax_fp32(patched_vllm: Path) -> None:
    _check_forward_native(patched_vllm)


def _check_rejection_target_probs(tree: Path) -> None:
    softmax = _SoftmaxSpy()
    recovered: list[Any] = []

    def sample_recovered_tokens(max_spec_len: int, num_draft: Any, cu: Any, draft_ids: Any,
                                draft_probs: Any, target_probs: Any, *rest: Any) -> Any:
        recovered.append(target_probs)
        return torch.zeros_like(draft_ids)

    sample = exec_function(tree / "v1/sample/rejection_sampler.py", "rejection_sample", {
        "torch": torch, "SamplingMetadata": object, "PLACEHOLDER_TOKEN_ID": -1,
        "GREEDY_TEMPERATURE": 0.0, "softmax_fp32": softmax,
        "generate_uniform_probs": lambda n, *a: torch.rand(n),
        "sample_recovered_tokens": sample_recovered_tokens,
        "_rejection_random_sample": lambda *a: None})
    target = torch.randn(4, 300, generator=torch.Generator().manual_seed(4))
    sample(torch.tensor([1, 2, 3, 4]), [2, 2], 2, torch.tensor([2, 4]), None, target,
           torch.zeros(2, 1, dtype=torch.long),
           SimpleNamespace(all_greedy=False, all_random=True, generators={},
                           temperature=torch.ones(2)))
    assert len(softmax.inputs) == 1, "the target probabilities are not softmax_fp32's"
    assert softmax.inputs[0] is target and recovered == [softmax.outputs[0]]


def test_patched_rejection_target_probs_use_softmax_fp32(patched_vllm: Path) -> None:
    _check_rejection_target_probs(patched_vllm)


def _row_softmax(tree: Path, cpu: bool = False) -> ModuleType:
    return load_with_auto_stubs(tree / ROW_SOFTMAX, {
        "vllm.platforms": make_module("vllm.platforms", current_platform=_platform(cpu)),
        "vllm.triton_utils": _triton_utils()})


class _CudaLike:
    """What use_row_softmax reads of a tensor, for shapes this CPU cannot hold on a GPU."""

    def __init__(self, shape: tuple[int, ...], last_stride: int = 1, cuda: bool = True) -> None:
        self.shape, self.is_cuda, self._stride = shape, cuda, last_stride

    def dim(self) -> int:
        return len(self.shape)

    def stride(self, dim: int) -> int:
        return self._stride


def test_patched_row_softmax_dispatch(patched_vllm: Path) -> None:
    mod = _row_softmax(patched_vllm)
    taken = [(1, 16384), (16, 248320), (5, 151936)]
    for shape in taken:
        assert mod.use_row_softmax(_CudaLike(shape)), shape
    for like in (_CudaLike((17, 248320)), _CudaLike((0, 248320)), _CudaLike((4, 16383)),
                 _CudaLike((4, 248320), last_stride=2), _CudaLike((4, 248320), cuda=False),
                 _CudaLike((2, 4, 248320))):
        assert not mod.use_row_softmax(like), like.shape
    assert not _row_softmax(patched_vllm, cpu=True).use_row_softmax(_CudaLike((1, 248320)))
    # off the fast path, softmax_fp32 is torch's fp32 softmax, bit for bit
    x = torch.randn(3, 20000, dtype=torch.bfloat16)
    assert torch.equal(mod.softmax_fp32(x), x.softmax(dim=-1, dtype=torch.float32))


def _draft(tree: Path, monkeypatch: Any, knob: str | None, scale: str | None,
           k: Any, p: Any, rows_per_req: int = 1) -> tuple[Any, Any]:
    for name, value in (("VLLM_DRAFT_TOPK_TOPP", knob), ("VLLM_DRAFT_TEMP_SCALE", scale)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    mod, _ = _sampler(tree)
    path = tree / "v1/spec_decode/llm_base_proposer.py"
    namespace: dict[str, Any] = {
        "torch": torch, "envs": load_envs(tree), "_SAMPLING_EPS": 1e-5,
        "empty_exponential_noise_like": lambda probs, fp64: torch.empty_like(probs),
        "sample_with_exponential_noise": lambda probs, q: probs.argmax(dim=-1),
        "SamplingMetadata": object, "apply_top_k_top_p": mod.apply_top_k_top_p}
    if "def _apply_draft_top_k_top_p(" in path.read_text():
        namespace["_apply_draft_top_k_top_p"] = exec_function(
            path, "_apply_draft_top_k_top_p", namespace)
    compute = exec_function(path, "compute_probs_and_sample_next_token", namespace)
    reqs = (k if k is not None else p).shape[0]
    logits = torch.randn(reqs * rows_per_req, 5000, generator=torch.Generator().manual_seed(3))
    meta = SimpleNamespace(all_greedy=False, all_random=True,
                           temperature=torch.full((reqs * rows_per_req,), 0.8), top_k=k,
                           top_p=p)
    _, probs = compute(logits.clone(), meta)
    return logits, probs


def _check_draft(tree: Path, monkeypatch: Any) -> None:
    k = torch.tensor([4, 10], dtype=torch.int32)
    p = torch.tensor([0.8, 1.0])
    for rows_per_req in (1, 3):  # 3: parallel drafting, request-major rows
        logits, probs = _draft(tree, monkeypatch, "1", None, k, p, rows_per_req)
        ks = torch.repeat_interleave(k, rows_per_req)
        support = torch.zeros_like(logits, dtype=torch.bool)
        for row, kk in enumerate(ks.tolist()):
            support[row, logits[row].topk(kk).indices] = True
        assert bool((probs[~support] == 0).all()), "draft mass outside the target's top-k"
        assert bool(((probs > 0).sum(-1) <= ks).all())
        assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[0]))
    # top-p alone truncates too: the kept mass of each row reaches p
    logits, probs = _draft(tree, monkeypatch, "1", None, None, torch.tensor([0.5, 0.9]))
    full = (logits / 0.8).softmax(-1)
    kept = (probs > 0)
    assert bool((kept.sum(-1) < 5000).all())
    assert bool(((full * kept).sum(-1) >= torch.tensor([0.5, 0.9]) - 1e-6).all())
    # the extra temperature divides the draft logits once more
    logits, probs = _draft(tree, monkeypatch, "0", "2.0", k, p)
    assert torch.allclose(probs, (logits / 0.8 / 2.0).softmax(-1))


def test_patched_drafter_truncates_to_the_target_support(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_draft(patched_vllm, monkeypatch)


def test_patched_drafter_default_is_pristine(patched_vllm: Path, pristine_vllm: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    k = torch.tensor([4, 10], dtype=torch.int32)
    p = torch.tensor([0.8, 1.0])
    _, pristine = _draft(pristine_vllm, monkeypatch, None, None, k, p)
    for knob in (None, "0"):  # unset (the default) or off
        _, probs = _draft(patched_vllm, monkeypatch, knob, None, k, p)
        assert torch.equal(probs, pristine)


def test_patched_knobs_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_DRAFT_TOPK_TOPP", raising=False)
    monkeypatch.delenv("VLLM_DRAFT_TEMP_SCALE", raising=False)
    envs = load_envs(patched_vllm)
    assert envs.VLLM_DRAFT_TOPK_TOPP is False and envs.VLLM_DRAFT_TEMP_SCALE == 1.0
    monkeypatch.setenv("VLLM_DRAFT_TOPK_TOPP", "1")
    monkeypatch.setenv("VLLM_DRAFT_TEMP_SCALE", "1.5")
    assert envs.VLLM_DRAFT_TOPK_TOPP is True and envs.VLLM_DRAFT_TEMP_SCALE == 1.5


def test_pristine_takes_torch_softmax_and_untruncated_drafts(
        pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not (pristine_vllm / ROW_SOFTMAX).exists()
    assert_pristine_lacks(lambda: _check_forward_native(pristine_vllm))
    assert_pristine_lacks(lambda: _check_rejection_target_probs(pristine_vllm))
    assert_pristine_lacks(lambda: _check_draft(pristine_vllm, monkeypatch))

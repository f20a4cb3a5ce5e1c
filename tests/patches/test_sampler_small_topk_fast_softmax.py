"""sampler-small-topk-fast-softmax: with the batch's largest top-k known on the host and at
most 64, ``apply_top_k_top_p`` masks from ``torch.topk``'s 16/32/64 candidates instead of
sorting (or scanning) the vocabulary, with the sort path's result; V1 fills
``SamplingMetadata.top_k_max`` from its host array, V2's ``SamplingStates`` from its UVA
host array (no device read); V1 drafters apply the requests' top-k/top-p to the draft
logits (``VLLM_DRAFT_TOPK_TOPP``, on) and an extra temperature (``VLLM_DRAFT_TEMP_SCALE``).

Runs vLLM's own topk_topp_sampler.py (the small-k path, the dispatcher, the pristine sort
path as reference, ``TopKTopPSampler.forward_native``), row_softmax.py's dispatcher (its
Triton kernels run in tests/gpu/test_sampler_small_topk_fast_softmax_gpu.py), V1's
``InputBatch._make_sampling_metadata`` and ``Sampler.sample``, V2's ``SamplingStates`` and the
drafter's ``compute_probs_and_sample_next_token``, on CPU torch with the device-only parts
stubbed (the platform says CUDA; the 0.32.0 Triton top-k/top-p is a spy)."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

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

    def __call__(self, logits: Any, k: Any, p: Any) -> Any:
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


def _near_boundary(logits: Any, k: Any, p: Any) -> Any:
    """Rows where a kept candidate's tail mass is within 1e-6 of 1 - p: there the two
    paths' summation orders may legitimately disagree."""
    values = torch.topk(logits, 64, dim=-1).values
    rank = torch.arange(64).unsqueeze(0)
    values = values.masked_fill(rank >= k.unsqueeze(1), float("-inf"))
    tail = values.softmax(dim=-1).flip(-1).cumsum(-1).flip(-1)
    close = ((tail - (1 - p.unsqueeze(1))).abs() < 1e-6) & (rank < k.unsqueeze(1))
    return close.any(dim=-1)


def _takes_k_max(mod: ModuleType) -> None:
    assert "k_max" in inspect.signature(mod.apply_top_k_top_p).parameters, (
        "apply_top_k_top_p takes no k_max")


def _check_small_k_exact(tree: Path) -> int:
    mod, spy = _sampler(tree)
    _takes_k_max(mod)
    gen = torch.Generator().manual_seed(0)
    excluded = 0
    for rows in (1, 5, 33):
        logits = torch.randn(rows, VOCAB, generator=gen) * 3
        k = torch.randint(1, 65, (rows,), generator=gen, dtype=torch.int32)
        k[0] = 64  # the widest candidate set is exercised
        for top_p in (None, 0.5, 0.95, 1.0):
            p = None if top_p is None else torch.full((rows,), top_p)
            ref = mod.apply_top_k_top_p_pytorch(logits.clone(), k, p)
            fast = mod.apply_top_k_top_p(logits.clone(), k, p, k_max=int(k.max()))
            assert spy.calls == 0, "the small-k path fell back to the 0.32.0 Triton path"
            keep = torch.ones(rows, dtype=torch.bool)
            if p is not None:
                skip = _near_boundary(logits, k, p)
                excluded += int(skip.sum())
                keep = ~skip
            assert torch.equal(torch.isinf(fast[keep]), torch.isinf(ref[keep])), (rows, top_p)
            assert torch.equal(fast[keep], ref[keep]), (rows, top_p)
            survivors = (~torch.isinf(fast)).sum(dim=-1)
            assert bool((survivors >= 1).all()) and bool((survivors <= k).all())
    return excluded


def test_patched_small_k_matches_the_sort_path(patched_vllm: Path) -> None:
    excluded = _check_small_k_exact(patched_vllm)
    print(f"rows within 1e-6 of the top-p boundary, excluded: {excluded}")
    assert excluded <= 1


def _check_dispatch(tree: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 1000, generator=gen)
    k = torch.tensor([3, 20, 64, 7], dtype=torch.int32)
    p = torch.full((4,), 0.9)
    # k_max given and small, on a device platform: the small-k path, no Triton call
    mod, spy = _sampler(tree)
    _takes_k_max(mod)
    mod.apply_top_k_top_p(logits.clone(), k, p, k_max=64)
    assert spy.calls == 0
    # everything else keeps the 0.32.0 path, with its result
    for kwargs, cpu, kk, pp in (({}, False, k, p), ({"k_max": None}, False, k, p),
                                ({"k_max": 65}, False, k, p), ({"k_max": 64}, True, k, p),
                                ({"k_max": 64}, False, None, p)):
        mod, spy = _sampler(tree, cpu=cpu)
        out = mod.apply_top_k_top_p(logits.clone(), kk, pp, **kwargs)
        assert spy.calls == 1, (kwargs, cpu)
        assert torch.equal(out, mod.apply_top_k_top_p_pytorch(logits.clone(), kk, pp))


def test_patched_dispatch(patched_vllm: Path) -> None:
    _check_dispatch(patched_vllm)


def _check_forward_native(tree: Path) -> None:
    """TopKTopPSampler.forward_native takes k_max to the small-k path, and its probabilities
    come from softmax_fp32 (torch's softmax here: CPU tensors)."""
    mod, spy = _sampler(tree)
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
    _, processed = sampler.forward_native(logits.clone(), {}, k, None, k_max=9)
    assert spy.calls == 0
    assert torch.equal((~torch.isinf(processed)).sum(-1), k.long())
    assert torch.equal(seen[0], processed.softmax(dim=-1, dtype=torch.float32))


def test_patched_forward_native_takes_k_max(patched_vllm: Path) -> None:
    _check_forward_native(patched_vllm)


def _v1_metadata(tree: Path, top_k_cpu: list[int], no_top_k: bool) -> Any:
    meta = load_with_auto_stubs(tree / "v1/sample/metadata.py")
    make = exec_function(tree / "v1/worker/gpu_input_batch.py",
                         "InputBatch._make_sampling_metadata",
                         {"copy_slice": lambda src, dst, n: dst[:n].copy_(src[:n]),
                          "SamplingMetadata": meta.SamplingMetadata, "torch": torch,
                          "cast": lambda t, v: v, "PoolingParams": None})
    n = len(top_k_cpu)
    cpu = torch.tensor(top_k_cpu + [0] * 4, dtype=torch.int32)
    batch = SimpleNamespace(
        num_reqs=n, all_greedy=False, all_random=True, no_top_p=True, no_top_k=no_top_k,
        no_penalties=True, temperature_cpu_tensor=torch.ones(n + 4),
        temperature=torch.zeros(n + 4), top_k_cpu_tensor=cpu, top_k_cpu=cpu.numpy(),
        top_k=torch.zeros(n + 4, dtype=torch.int32), top_p=None,
        logits_processing_needs_token_ids=torch.zeros(n + 4, dtype=torch.bool).numpy(),
        thinking_budget_state_holder=None, bad_words_token_ids={},
        logitsprocs_need_output_token_ids=False, req_output_token_ids=[],
        no_allowed_token_ids=True, logprob_token_ids={}, generators={},
        max_num_logprobs=None, frequency_penalties=torch.zeros(n + 4),
        presence_penalties=torch.zeros(n + 4), repetition_penalties=torch.ones(n + 4),
        spec_token_ids=None, logitsprocs=None, device="cpu")
    return make(batch)


class _DeviceTensor(torch.Tensor):  # type: ignore[misc, name-defined]
    """A tensor standing for device memory: records the host reads made of it."""

    reads: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__index__",
                    "__float__"):
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


def _v2_k_max(tree: Path, top_ks: list[int]) -> tuple[Any, list[str]]:
    np = pytest.importorskip("numpy")
    recorded: dict[str, Any] = {}

    class UvaBackedTensor:
        def __init__(self, size: int, dtype: Any) -> None:
            self.np = torch.zeros(size, dtype=dtype).numpy()
            self.gpu: Any = None

        def copy_to_uva(self) -> None:
            self.gpu = torch.from_numpy(self.np.copy()).as_subclass(_DeviceTensor)

    def apply(logits: Any, k: Any, p: Any, k_max: Any = "absent") -> Any:
        recorded["k_max"] = k_max
        return logits

    states_mod = load_with_auto_stubs(tree / "v1/worker/gpu/sample/states.py", {
        "vllm.v1.worker.gpu.buffer_utils": make_module(
            "vllm.v1.worker.gpu.buffer_utils", UvaBackedTensor=UvaBackedTensor),
        "vllm.v1.sample.ops.topk_topp_sampler": make_module(
            "vllm.v1.sample.ops.topk_topp_sampler", apply_top_k_top_p=apply)})
    states = states_mod.SamplingStates(8, 1000)
    for i, top_k in enumerate(top_ks):
        states.add_request(i, SimpleNamespace(temperature=0.7, top_k=top_k, top_p=0.9,
                                              min_p=0.0, seed=1, logprobs=None))
    states.apply_staged_writes()
    _DeviceTensor.reads = []
    idx = np.arange(len(top_ks))
    states.apply_top_k_top_p(torch.zeros(len(top_ks), 1000),
                             torch.arange(len(top_ks)), idx)
    return recorded.get("k_max", "absent"), list(_DeviceTensor.reads)


def _check_k_max_sources(tree: Path) -> None:
    meta = _v1_metadata(tree, [20, 7, 64], no_top_k=False)
    assert getattr(meta, "top_k_max", "absent") == 64, "V1 metadata has no top_k_max"
    assert torch.equal(meta.top_k, torch.tensor([20, 7, 64], dtype=torch.int32))
    assert _v1_metadata(tree, [1000, 1000], no_top_k=True).top_k_max is None
    # V1's sampler hands it to the top-k/top-p sampler
    calls: list[Any] = []

    def topk_topp_sampler(logits: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return logits.argmax(-1), None

    sample = exec_function(tree / "v1/sample/sampler.py", "Sampler.sample",
                           {"torch": torch, "LogprobsMode": str, "SamplingMetadata": object})
    sampler = SimpleNamespace(
        logprobs_mode="raw_logprobs", apply_temperature=lambda logits, t, r: logits,
        topk_topp_sampler=topk_topp_sampler)
    sample(sampler, torch.zeros(3, 10), SimpleNamespace(
        all_greedy=False, all_random=True, temperature=torch.ones(3),
        logitsprocs=SimpleNamespace(argmax_invariant=[]), generators={}, top_k=meta.top_k,
        top_p=None, top_k_max=64))
    assert calls == [{"k_max": 64}], calls
    # V2: from the host half of the UVA array; a request without top-k is the vocabulary
    k_max, reads = _v2_k_max(tree, [20, 7, 50])
    assert k_max == 50 and not reads, (k_max, reads)
    k_max, reads = _v2_k_max(tree, [20, 0])
    assert k_max == 1000 and not reads, (k_max, reads)


def test_patched_k_max_comes_from_host_arrays(patched_vllm: Path) -> None:
    _check_k_max_sources(patched_vllm)


def _draft(tree: Path, monkeypatch: Any, knob: str | None, scale: str | None,
           k: Any, p: Any, k_max: Any, rows_per_req: int = 1) -> tuple[Any, Any]:
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
        "SamplingMetadata": object, "apply_top_k_top_p": mod.apply_top_k_top_p,
        "SMALL_TOP_K_WIDTHS": getattr(mod, "SMALL_TOP_K_WIDTHS", None)}
    if "def _apply_draft_top_k_top_p(" in path.read_text():
        namespace["_apply_draft_top_k_top_p"] = exec_function(
            path, "_apply_draft_top_k_top_p", namespace)
    compute = exec_function(path, "compute_probs_and_sample_next_token", namespace)
    reqs = k.shape[0]
    logits = torch.randn(reqs * rows_per_req, 5000, generator=torch.Generator().manual_seed(3))
    meta = SimpleNamespace(all_greedy=False, all_random=True,
                           temperature=torch.full((reqs * rows_per_req,), 0.8), top_k=k,
                           top_p=p, top_k_max=k_max)
    _, probs = compute(logits.clone(), meta)
    return logits, probs


def _check_draft(tree: Path, monkeypatch: Any) -> None:
    k = torch.tensor([4, 10], dtype=torch.int32)
    p = torch.tensor([0.8, 1.0])
    for rows_per_req in (1, 3):  # 3: parallel drafting, request-major rows
        logits, probs = _draft(tree, monkeypatch, None, None, k, p, 10, rows_per_req)
        ks = torch.repeat_interleave(k, rows_per_req)
        support = torch.zeros_like(logits, dtype=torch.bool)
        for row, kk in enumerate(ks.tolist()):
            support[row, logits[row].topk(kk).indices] = True
        assert bool((probs[~support] == 0).all()), "draft mass outside the target's top-k"
        assert bool(((probs > 0).sum(-1) <= ks).all())
        assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[0]))
    # the extra temperature divides the draft logits once more
    logits, probs = _draft(tree, monkeypatch, "0", "2.0", k, p, 10)
    assert torch.allclose(probs, (logits / 0.8 / 2.0).softmax(-1))


def test_patched_drafter_truncates_to_the_target_support(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_draft(patched_vllm, monkeypatch)


def test_patched_drafter_knob_off_is_pristine(patched_vllm: Path, pristine_vllm: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    k = torch.tensor([4, 10], dtype=torch.int32)
    p = torch.tensor([0.8, 1.0])
    _, probs = _draft(patched_vllm, monkeypatch, "0", None, k, p, 10)
    _, pristine = _draft(pristine_vllm, monkeypatch, "0", None, k, p, 10)
    assert torch.equal(probs, pristine)
    # and k_max above 64 leaves the draft untouched with the knob on
    _, wide = _draft(patched_vllm, monkeypatch, None, None, k, p, 65)
    assert torch.equal(wide, pristine)


def test_patched_knobs_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_DRAFT_TOPK_TOPP", raising=False)
    monkeypatch.delenv("VLLM_DRAFT_TEMP_SCALE", raising=False)
    envs = load_envs(patched_vllm)
    assert envs.VLLM_DRAFT_TOPK_TOPP is True and envs.VLLM_DRAFT_TEMP_SCALE == 1.0
    monkeypatch.setenv("VLLM_DRAFT_TOPK_TOPP", "0")
    monkeypatch.setenv("VLLM_DRAFT_TEMP_SCALE", "1.5")
    assert envs.VLLM_DRAFT_TOPK_TOPP is False and envs.VLLM_DRAFT_TEMP_SCALE == 1.5


def test_pristine_sorts_for_every_k(pristine_vllm: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_small_k_exact(pristine_vllm))
    assert_pristine_lacks(lambda: _check_dispatch(pristine_vllm))
    assert_pristine_lacks(lambda: _check_k_max_sources(pristine_vllm))
    assert_pristine_lacks(lambda: _check_draft(pristine_vllm, monkeypatch))

"""sampler-small-topk-fast-softmax on a GPU (marker ``gpu``).

vLLM's own row_softmax.py (real Triton) against an fp64 reference and ``torch.softmax`` over
1, 5 and 16 rows of a 248,320 vocabulary, with rows masked to -inf except k entries and an
all -inf row; seeded samples (vLLM's ``random_sample``) from its probabilities and torch's of
the same top-k/top-p-masked logits; its latency beside ``torch.softmax``. The row's small-k
top-k/top-p half was measured here against 0.32.0's Triton top-k/top-p and retired
(results/series-gpu-b-run5.txt)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.gpu import vllm_tree

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton.testing  # noqa: E402

VOCAB = 248320
ROW_SOFTMAX = "v1/sample/ops/row_softmax.py"


def _stubs() -> dict[str, ModuleType]:
    stubs = vllm_tree.kernel_stubs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def module(name: str, **attrs: Any) -> ModuleType:
        mod = ModuleType(name)
        mod.__dict__.update(attrs)
        return mod

    base = stubs["vllm.platforms"].current_platform
    # every public attribute, the class's methods too (the harness's platform is a class)
    platform = SimpleNamespace(**{n: getattr(base, n) for n in dir(base) if not n.startswith("_")})
    platform.simple_compile_backend = "eager"
    platform.device_type = "cuda"
    stubs["vllm.platforms"] = module(
        "vllm.platforms", current_platform=platform,
        CpuArchEnum=SimpleNamespace(RISCV="riscv", POWERPC="powerpc"))
    stubs.update({
        "vllm.platforms.interface": module("vllm.platforms.interface", DeviceCapability=object),
        "vllm._aiter_ops": module("vllm._aiter_ops", rocm_aiter_ops=None),
        "vllm.config.model": module(
            "vllm.config.model", LogprobsMode=str,
            PROCESSED_LOGPROBS_MODES=("processed_logits", "processed_logprobs")),
        "vllm.utils.gpu_sync_debug": module("vllm.utils.gpu_sync_debug",
                                            gpu_sync_allowed=nullcontext),
        "vllm.utils.platform_utils": module(
            "vllm.utils.platform_utils", num_compute_units=lambda *a: sms,
            get_device_name_as_file_name=lambda *a: "NVIDIA_H200"),
    })
    return stubs


def _modules(tree: Path) -> tuple[Any, Any]:
    """(row_softmax, topk_topp_sampler) of ``tree``, the sampler with its real Triton path."""
    if not (tree / ROW_SOFTMAX).is_file():
        raise AssertionError("no v1/sample/ops/row_softmax.py in the tree")
    stubs = _stubs()
    # packages whose __init__ would pull in the engine: empty, their files importable
    for sub in ("model_executor", "model_executor/warmup", "utils"):
        package = ModuleType("vllm." + sub.replace("/", "."))
        package.__path__ = [str(tree / sub)]
        stubs[package.__name__] = package
    rows = vllm_tree.import_from_tree(tree, "vllm.v1.sample.ops.row_softmax", stubs)
    stubs["vllm.v1.sample.ops.row_softmax"] = rows
    sampler = vllm_tree.import_from_tree(tree, "vllm.v1.sample.ops.topk_topp_sampler", stubs)
    return rows, sampler


def _logits(rows: int, seed: int, masked_k: int | None = None) -> Any:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=gen, device="cuda") * 4
    if masked_k is not None:  # every row -inf but k entries
        keep = torch.randperm(VOCAB, generator=gen, device="cuda")[:masked_k]
        x = torch.full_like(x, float("-inf")).index_copy_(1, keep, x[:, keep])
    return x


def _check_softmax(tree: Path) -> None:
    rows_mod, _ = _modules(tree)
    worst_ref = worst_torch = 0.0
    for rows in (1, 5, 16):
        for masked_k in (None, 20, 1):
            x = _logits(rows, rows * 7 + (masked_k or 0), masked_k)
            assert rows_mod.use_row_softmax(x)
            fast = rows_mod.softmax_fp32(x)
            ref = torch.softmax(x.double(), dim=-1)
            scale = ref.max(dim=-1, keepdim=True).values
            err = ((fast.double() - ref).abs() / scale).max().item()
            err_torch = ((fast - torch.softmax(x, -1, dtype=torch.float32)).abs()
                         / scale).max().item()
            worst_ref, worst_torch = max(worst_ref, err), max(worst_torch, err_torch)
            assert err <= 1e-6, (rows, masked_k, err)
            assert err_torch <= 2e-6, (rows, masked_k, err_torch)
    dead = torch.full((2, VOCAB), float("-inf"), device="cuda")
    dead_fast = rows_mod.softmax_fp32(dead)
    assert bool((dead_fast == 0).all())
    dead_torch = torch.softmax(dead, dim=-1, dtype=torch.float32)
    vllm_tree.record_line(
        f"  row softmax 1/5/16 x {VOCAB} (random, -inf but 20, -inf but 1): max |err| / row max "
        f"{worst_ref:.1e} vs fp64, {worst_torch:.1e} vs torch fp32; an all -inf row gives "
        f"zeros (torch: {'NaN' if bool(dead_torch.isnan().all()) else 'finite'})")


def test_row_softmax_accuracy() -> None:
    vllm_tree.record_line("sampler-small-topk-fast-softmax, row softmax (real Triton):")
    vllm_tree.fails_on_pristine(_check_softmax)


def test_seeded_samples_and_latency() -> None:
    _, patched = vllm_tree.trees()
    rows_mod, mod = _modules(patched)
    # seeded samples: row softmax vs torch's softmax of the same masked logits
    agree = total = 0
    for draw in range(64):
        x = _logits(16, 1000 + draw)
        k = torch.full((16,), 20, device="cuda", dtype=torch.int32)
        p = torch.full((16,), 0.95, device="cuda")
        masked = mod.apply_top_k_top_p(x, k, p)
        fast = rows_mod.softmax_fp32(masked)
        ref = torch.softmax(masked, -1, dtype=torch.float32)

        def gens(draw: int = draw) -> dict[int, Any]:
            return {i: torch.Generator(device="cuda").manual_seed(draw * 100 + i)
                    for i in range(16)}
        a = mod.random_sample(fast, gens())
        b = mod.random_sample(ref, gens())
        agree += int((a == b).sum())
        total += 16
    assert agree / total >= 0.999, (agree, total)
    lines = [f"  seeded samples, row softmax vs torch probabilities: {agree}/{total} equal"]

    def us(fn: Any) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100)) * 1e3

    for rows in (1, 5, 16):
        x = _logits(rows, 7)
        lines.append(f"  softmax {rows} x {VOCAB}: row softmax "
                     f"{us(lambda x=x: rows_mod.row_softmax(x)):.1f} us, torch "
                     f"{us(lambda x=x: torch.softmax(x, -1, dtype=torch.float32)):.1f} us")
    vllm_tree.record_line("sampler-small-topk-fast-softmax, samples and latency (patched tree):")
    for line in lines:
        vllm_tree.record_line(line)

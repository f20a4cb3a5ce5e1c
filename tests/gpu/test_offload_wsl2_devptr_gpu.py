"""offload-wsl2-devptr on a GPU (marker ``gpu``).

vLLM's own ``CudaRTLibrary`` (distributed/device_communicators/cuda_wrapper.py) over the real
CUDA runtime, through vLLM's own ``pin_mmap_region`` / ``host_register`` /
``host_device_pointer`` (tests/patches/_offload_devptr.py): a 64 MiB mmap registered in 16 MiB
chunks has its device address read for every chunk, and on native Linux the offset is 0. Then
vLLM's own Triton swap kernel (kv_offload/cpu/swap_blocks_triton.py) copies 32 blocks from the
registered mmap to the GPU through descriptors that ``compute_sub_block_ptrs`` built with the
region's offset: the bytes arrive. Not shown here: WSL2 (a non-zero offset needs its driver)."""

from __future__ import annotations

import logging
import mmap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.gpu import vllm_tree
from tests.patches import _offload_devptr as od
from tests.patches._helpers import exec_function, load_with_auto_stubs, make_module

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton  # noqa: E402

MIB = 1 << 20
PAGE = 4096


def _cudart(tree: Path) -> Any:
    find = exec_function(tree / "utils/system_utils.py", "find_loaded_library", {})
    platform = SimpleNamespace(is_rocm=lambda: False)
    mod = load_with_auto_stubs(tree / "distributed/device_communicators/cuda_wrapper.py", {
        "vllm.envs": make_module("vllm.envs", VLLM_CUDART_SO_PATH=None),
        "vllm.platforms": make_module("vllm.platforms", current_platform=platform),
        "vllm.utils.system_utils": make_module("vllm.utils.system_utils",
                                               find_loaded_library=find),
    })
    queries: list[tuple[int, int]] = []

    class Counting(mod.CudaRTLibrary):  # type: ignore[misc, name-defined]
        def cudaHostGetDevicePointer(self, ptr: int) -> tuple[int, int]:
            result = super().cudaHostGetDevicePointer(ptr)
            queries.append((ptr, result[1]))
            return result  # type: ignore[no-any-return]

    Counting.queries = queries
    return Counting


def _check(tree: Path) -> None:
    torch.zeros(1, device="cuda")  # the CUDA context the runtime calls use
    cls = _cudart(tree)
    buf = mmap.mmap(-1, 64 * MIB)
    base = torch.frombuffer(memoryview(buf), dtype=torch.int8)
    base.copy_(torch.randint(-128, 127, (64 * MIB,), dtype=torch.int8))
    region = SimpleNamespace(rank=0, _base=base, total_size_bytes=64 * MIB, _row_stride=MIB,
                             pinned_addresses=[], is_pinned=False, device_ptr_delta=0)
    log = od.pin(tree, region, cls, 16 * MIB)
    try:
        assert region.is_pinned and len(region.pinned_addresses) == 4, log.warnings
        assert len(cls.queries) == 4, f"{len(cls.queries)} device-address queries"
        deltas = {dev - host for host, dev in cls.queries}
        assert deltas == {region.device_ptr_delta} == {0}, deltas
        # 32 blocks of 4 KiB from the registered mmap (viewed as 16 KiB rows of 4 blocks)
        cpu = base.view(-1, 4 * PAGE)
        gpu = torch.zeros(64, PAGE, dtype=torch.int8, device="cuda")
        cpu_blocks = np.arange(8) * 97 % cpu.shape[0]
        gpu_blocks = np.arange(32)[::-1].copy()
        src = np.zeros(32, dtype=np.uint64)
        dst = np.zeros(32, dtype=np.uint64)
        ptrs = od.sub_block_ptrs(tree)
        ptrs(cpu_blocks, 4, src, cpu, ptr_delta=region.device_ptr_delta)
        ptrs(gpu_blocks, 1, dst, gpu)
        swap = load_with_auto_stubs(tree / "v1/kv_offload/cpu/swap_blocks_triton.py", {
            "vllm.triton_utils": make_module("vllm.triton_utils", tl=triton.language,
                                             triton=triton)})
        swap.swap_blocks_batch(torch.from_numpy(src.view(np.int64)),
                               torch.from_numpy(dst.view(np.int64)),
                               torch.full((32,), PAGE, dtype=torch.int64),
                               bytes_per_chunk=PAGE)
        torch.cuda.synchronize()
        want = cpu[torch.from_numpy(cpu_blocks)].reshape(32, PAGE)
        got = gpu[torch.from_numpy(gpu_blocks)].cpu()
        assert torch.equal(got, want)
    finally:
        reg = od.register_module(tree, cls)
        for address in region.pinned_addresses:
            reg.host_unregister(address)
        del base
    vllm_tree.record_line(f"  {tree.parent.name}: 64 MiB mmap in 4 registered chunks, device address "
                 f"offset {region.device_ptr_delta} for all; 32 blocks copied by the Triton "
                 "swap kernel through the offset descriptors arrive intact")


def test_registered_mmap_offset_and_swap() -> None:
    logging.getLogger("host_register").setLevel(logging.ERROR)
    vllm_tree.record_line("offload-wsl2-devptr (real cudart, real pin_mmap_region, Triton swap):")
    vllm_tree.fails_on_pristine(_check)

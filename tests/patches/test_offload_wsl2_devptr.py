"""offload-wsl2-devptr: after registering the CPU-offload mmap region, ``pin_mmap_region`` reads
each chunk's device address (``cudaHostGetDevicePointer``) and records one offset on the
region; every CPU-side copy descriptor is the host address plus that offset; an unreadable or
inconsistent offset leaves the region pageable; offset 0 changes nothing.

Runs vLLM's own ``pin_mmap_region``, ``host_register`` / ``host_device_pointer``,
``compute_sub_block_ptrs`` and the transfer handler's descriptor fills
(v1/kv_offload/cpu/gpu_worker.py, host_register.py) with a fake ``CudaRTLibrary`` that maps
registered memory at host + offset. The real driver and the Triton swap kernel on a GPU:
tests/gpu/test_offload_wsl2_devptr_gpu.py."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from . import _offload_devptr as od
from ._helpers import assert_pristine_lacks, load_with_auto_stubs, make_module

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

MIB = 1 << 20
DELTA = 0x7F00_0000_0000 - 0x10_0000  # device address - host address on a non-UVA driver


def _cudart(deltas: list[int] | None, fail: bool = False) -> Any:
    """A CudaRTLibrary whose registered chunks map at host + deltas[i] (chunk order)."""
    state: dict[str, Any] = {"registered": [], "unregistered": []}

    class CudaRTLibrary:
        calls = state

        def cudaHostRegister(self, ptr: int, size: int, flags: int = 0) -> int:
            state["registered"].append(ptr)
            return 0

        def cudaHostUnregister(self, ptr: int) -> int:
            state["unregistered"].append(ptr)
            return 0

        def cudaGetLastError(self) -> int:
            return 0

        def cudaHostGetDevicePointer(self, ptr: int) -> tuple[int, int]:
            if fail:
                return 1, 0
            i = state["registered"].index(ptr)
            return 0, ptr + (deltas or [0])[min(i, len(deltas or [0]) - 1)]

    return CudaRTLibrary


def _region(total: int = 64 * MIB, row: int = MIB) -> Any:
    base = SimpleNamespace(data_ptr=lambda: 0x5500_0000_0000)
    # cpu_page_size, page_size: 0.33.0 reads them to choose the registered ranges
    return SimpleNamespace(rank=0, _base=base, total_size_bytes=total, _row_stride=row,
                           cpu_page_size=row, page_size=4096,
                           pinned_addresses=[], is_pinned=False, device_ptr_delta=0)


def _check_pin(tree: Path) -> None:
    # one offset for all four 16 MiB chunks: recorded, region pinned, one WARNING
    cls = _cudart([DELTA] * 4)
    region = _region()
    log = od.pin(tree, region, cls, 16 * MIB)
    assert region.is_pinned and len(region.pinned_addresses) == 4
    assert region.device_ptr_delta == DELTA
    assert len(log.warnings) == 1 and "WSL2" in log.warnings[0]
    # chunks with different offsets: unregistered, pageable, WARNING
    cls = _cudart([DELTA, DELTA, DELTA + 4096, DELTA])
    region = _region()
    log = od.pin(tree, region, cls, 16 * MIB)
    assert not region.is_pinned and not region.pinned_addresses
    assert sorted(cls.calls["unregistered"]) == sorted(cls.calls["registered"])
    assert "differ" in log.warnings[0]
    # the address cannot be read: the same fallback
    cls = _cudart(None, fail=True)
    region = _region()
    log = od.pin(tree, region, cls, 16 * MIB)
    assert not region.is_pinned and "could not be read" in log.warnings[-1]


def test_patched_pin_records_one_offset(patched_vllm: Path) -> None:
    _check_pin(patched_vllm)


def test_patched_native_linux_is_unchanged(patched_vllm: Path) -> None:
    region = _region()
    log = od.pin(patched_vllm, region, _cudart([0]), 16 * MIB)
    assert region.is_pinned and region.device_ptr_delta == 0 and not log.warnings


def _ptrs(tree: Path, blocks_per_chunk: int, delta: int | None) -> Any:
    """Pointers relative to the tensor's host address (a fresh tensor per call)."""
    fn = od.sub_block_ptrs(tree)
    if delta is not None and "ptr_delta" not in inspect.signature(fn).parameters:
        raise AssertionError("compute_sub_block_ptrs takes no ptr_delta")
    tensor = torch.zeros(8, 4096, dtype=torch.int8)
    out = np.zeros(6, dtype=np.uint64)
    kwargs = {} if delta is None else {"ptr_delta": delta}
    fn(np.array([5, 1, 3, 0, 7, 2]), blocks_per_chunk, out, tensor, skip_count=0, **kwargs)
    return out.astype(object) - tensor.data_ptr()


def _check_ptrs(tree: Path) -> None:
    for blocks_per_chunk in (1, 2):
        stock = _ptrs(tree, blocks_per_chunk, None)
        assert ((_ptrs(tree, blocks_per_chunk, DELTA) - stock) == DELTA).all()
        assert (_ptrs(tree, blocks_per_chunk, 0) == stock).all()


def test_patched_descriptors_shift_by_the_offset(patched_vllm: Path) -> None:
    _check_ptrs(patched_vllm)


class _GpuTensor:
    """What the handler asserts of a GPU tensor, at a fixed address."""

    def __init__(self, blocks: int, page: int) -> None:
        self.dtype, self.ndim, self.is_cuda, self.is_xpu = torch.int8, 2, True, False
        self.shape = (blocks, page)
        self._page = page

    def data_ptr(self) -> int:
        return 0x7000_0000_0000

    def stride(self, dim: int) -> int:
        return self._page


def _fill(tree: Path, gpu_to_cpu: bool, deltas: list[int] | None) -> tuple[Any, Any, int]:
    """One real direct-layout descriptor fill of a handler built by its real __init__:
    (src pointers, dst pointers, the CPU tensor's host address)."""
    mod = load_with_auto_stubs(tree / od.WORKER, {
        "vllm.triton_utils": make_module("vllm.triton_utils", HAS_TRITON=False, triton=None),
        "vllm.v1.kv_offload.cpu.swap_blocks_triton": make_module(
            "vllm.v1.kv_offload.cpu.swap_blocks_triton", THRESHOLD_BYTES=28 * 1024,
            swap_blocks_batch=None),
        "vllm.utils.torch_utils": make_module("vllm.utils.torch_utils", PIN_MEMORY=False),
    }, loose=True)
    page = 1024
    gpu = _GpuTensor(16, page)
    cpu = torch.zeros(4, page * 2, dtype=torch.int8)
    refs = [[SimpleNamespace(tensor_idx=0, page_size_bytes=page, mapping=None)]]
    kwargs = {} if deltas is None else {"cpu_ptr_deltas": deltas}
    handler = mod.SingleDirectionOffloadingHandler(
        gpu_tensors=[gpu], cpu_tensors=[cpu], blocks_per_chunk=2,
        layer_refs_per_group=refs, gpu_to_cpu=gpu_to_cpu, **kwargs)
    src, dst = np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.int64)
    sizes = np.zeros(4, dtype=np.int64)
    gpu_blocks, cpu_blocks = np.array([3, 4, 9, 10]), np.array([1, 2])
    group_src, group_dst = (gpu_blocks, cpu_blocks) if gpu_to_cpu else (cpu_blocks, gpu_blocks)
    handler._fill_direct_ops(0, group_src, group_dst, 4, 0, 0, src, dst, sizes, 0)
    # the CPU side relative to its tensor's host address (a fresh tensor per call)
    if gpu_to_cpu:
        return src, dst.astype(object) - cpu.data_ptr(), cpu.data_ptr()
    return src.astype(object) - cpu.data_ptr(), dst, cpu.data_ptr()


def _check_handler(tree: Path) -> None:
    for gpu_to_cpu in (True, False):
        stock_src, stock_dst, _ = _fill(tree, gpu_to_cpu, [0])
        src, dst, _ = _fill(tree, gpu_to_cpu, [DELTA])
        cpu_side, gpu_side = (dst, src) if gpu_to_cpu else (src, dst)
        stock_cpu, stock_gpu = (stock_dst, stock_src) if gpu_to_cpu else (stock_src, stock_dst)
        assert ((cpu_side - stock_cpu) == DELTA).all(), gpu_to_cpu
        assert (gpu_side == stock_gpu).all()  # GPU tensors take no offset
        assert int(min(stock_cpu)) >= 0


def test_patched_handler_offsets_the_cpu_side(patched_vllm: Path) -> None:
    _check_handler(patched_vllm)


def test_pristine_uses_host_addresses(pristine_vllm: Path) -> None:
    region = _region()
    od.pin(pristine_vllm, region, _cudart([DELTA] * 4), 16 * MIB)
    assert region.is_pinned and region.device_ptr_delta == 0  # the offset is never read
    assert_pristine_lacks(lambda: _check_pin(pristine_vllm))
    assert_pristine_lacks(lambda: _check_ptrs(pristine_vllm))

"""cudagraph-memory-from-allocator on a GPU (marker ``gpu``).

vLLM's own V2 ``GPUModelRunner.capture_model`` and ``CudaGraphManager.capture``
(tests/patches/_cudagraph_memory.py) with real torch, around real CUDA graph captures of a toy
workload, while 1 GiB is allocated outside torch (``cudaMalloc`` through CuPy) between the two
readings, as another library or process would. The caching allocator's reserved bytes see only
the graphs; the driver's free memory sees both. Not shown here: an engine boot's log and KV
budget (need vLLM's compiled ops)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu import vllm_tree
from tests.patches import _cudagraph_memory as cg

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402

try:
    import cupy
except ImportError:
    vllm_tree.missing("CuPy is not installed: the foreign cudaMalloc needs it")

MIB = 1 << 20
FOREIGN = 1 << 30


class _Foreign:
    """Memory allocated with cudaMalloc, outside torch's allocator."""

    def __init__(self) -> None:
        self.ptrs: list[int] = []

    def alloc(self) -> None:
        self.ptrs.append(cupy.cuda.runtime.malloc(FOREIGN))

    def free(self) -> None:
        for ptr in self.ptrs:
            cupy.cuda.runtime.free(ptr)
        self.ptrs.clear()


def _toy_graphs(keep: list[Any], mib: int) -> None:
    """Capture one graph whose body allocates ``mib`` MiB in its pool."""
    x = torch.ones(mib * MIB // 4, device="cuda")
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (x * 2).sum()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    keep.append((graph, x, y))


def _check_capture_model(tree: Path) -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    keep: list[Any] = []
    foreign = _Foreign()
    reserved0 = torch.cuda.memory_reserved()

    def capture() -> None:
        _toy_graphs(keep, 160)
        foreign.alloc()

    try:
        size, log = cg.capture_model(tree, vllm_tree.accelerator_torch(), capture)
        graphs = torch.cuda.memory_reserved() - reserved0
    finally:
        foreign.free()
        keep.clear()
        torch.cuda.empty_cache()
    (line,) = [entry for entry in log.lines if "Graph capturing finished" in entry[0]]
    vllm_tree.record_line(f"  {tree.parent.name}: capture_model returned {size / MIB:.0f} MiB; "
                 f"reserved growth {graphs / MIB:.0f} MiB; log args {line[1:]}")
    assert size == graphs, f"returned {size / MIB:.0f} MiB for {graphs / MIB:.0f} MiB of graphs"


def test_capture_model_ignores_foreign_allocations() -> None:
    vllm_tree.record_line("cudagraph-memory-from-allocator capture_model (toy graph + 1 GiB cudaMalloc):")
    vllm_tree.fails_on_pristine(_check_capture_model)


SIZES = {8: 40, 16: 56, 32: 90}  # MiB each graph's body allocates


def _check_samples(tree: Path) -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    keep: list[Any] = []
    foreign = _Foreign()

    def forward(desc: cg.Desc, capturing: bool) -> None:
        out = torch.empty(SIZES[desc.num_tokens] * MIB, dtype=torch.uint8, device="cuda")
        out.fill_(1)
        if capturing:
            keep.append(out)

    try:
        samples = cg.manager_capture(tree, vllm_tree.accelerator_torch(),
                                     [cg.Desc(n) for n in SIZES], forward, foreign.alloc)
    finally:
        foreign.free()
        keep.clear()
        torch.cuda.empty_cache()
    vllm_tree.record_line(f"  {tree.parent.name}: FULL-graph samples {[s / MIB for s in samples]} MiB "
                 f"for bodies of {list(SIZES.values())} MiB")
    for sample, mib in zip(samples, SIZES.values(), strict=True):
        assert mib * MIB <= sample < (mib + 32) * MIB, (sample / MIB, mib)


def test_profiling_samples_ignore_foreign_allocations() -> None:
    vllm_tree.record_line("cudagraph-memory-from-allocator samples (3 real captures, 1 GiB foreign each):")
    vllm_tree.fails_on_pristine(_check_samples)

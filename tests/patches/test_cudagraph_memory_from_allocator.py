"""cudagraph-memory-from-allocator: the V2 runner's ``capture_model`` returns the caching
allocator's reserved growth across the capture (the driver's free-memory delta is logged beside
it; graphs in the cuMem pool keep the driver delta), and each FULL-graph profiling sample is the
reserved growth across one capture.

Runs vLLM's own ``GPUModelRunner.capture_model`` and ``CudaGraphManager.capture`` (see
tests/patches/_cudagraph_memory.py) against a fake ``torch.accelerator`` whose reserved bytes
and driver free memory move by different amounts, as they do when something outside torch
allocates during the capture. Real captures: tests/gpu/test_cudagraph_memory_from_allocator_gpu.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from . import _cudagraph_memory as cg
from ._helpers import assert_pristine_lacks

pytestmark = pytest.mark.e2e

MIB = 1 << 20
GRAPHS = 162 * MIB      # what the graphs reserve
FOREIGN = 1024 * MIB    # allocated outside torch while capturing (driver only)


class _Memory:
    def __init__(self) -> None:
        self.reserved, self.free, self.total = 5 << 30, 60 << 30, 80 << 30
        self.capturing = False

    def torch(self) -> Any:
        @contextmanager
        def graph(*a: Any, **k: Any) -> Iterator[None]:
            self.capturing = True
            yield
            self.capturing = False

        accelerator = SimpleNamespace(
            empty_cache=lambda: None, synchronize=lambda: None,
            get_memory_info=lambda: (self.free, self.total),
            memory_reserved=lambda: self.reserved)
        return SimpleNamespace(accelerator=accelerator,
                               cuda=SimpleNamespace(CUDAGraph=object, graph=graph))

    def grow(self, reserved: int, foreign: int) -> None:
        self.reserved += reserved
        self.free -= reserved + foreign


def _capture_model(tree: Path, *, cumem: bool) -> tuple[int, cg.Log]:
    mem = _Memory()
    return cg.capture_model(tree, mem.torch(), lambda: mem.grow(GRAPHS, FOREIGN), cumem=cumem)


def _check_capture_model(tree: Path) -> None:
    size, log = _capture_model(tree, cumem=False)
    assert size == GRAPHS
    (line,) = [entry for entry in log.lines if "Graph capturing finished" in entry[0]]
    assert line[2:] == (GRAPHS / (1 << 30), (GRAPHS + FOREIGN) / (1 << 30)), line
    # graphs in the cuMem pool bypass the caching allocator: the driver delta stays
    assert _capture_model(tree, cumem=True)[0] == GRAPHS + FOREIGN


SIZES = {8: 40 * MIB, 16: 56 * MIB, 32: 90 * MIB}


def _samples(tree: Path) -> list[int]:
    mem = _Memory()

    def forward(desc: cg.Desc, capturing: bool) -> None:
        if capturing:
            assert mem.capturing  # the body runs inside the graph capture
            mem.grow(SIZES[desc.num_tokens], 0)

    return cg.manager_capture(tree, mem.torch(), [cg.Desc(n) for n in SIZES], forward,
                              pool_enter=lambda: mem.grow(0, FOREIGN))


def test_patched_capture_model_returns_reserved_growth(patched_vllm: Path) -> None:
    _check_capture_model(patched_vllm)


def test_patched_samples_are_reserved_growth(patched_vllm: Path) -> None:
    assert _samples(patched_vllm) == list(SIZES.values())


def test_pristine_reads_the_driver(pristine_vllm: Path) -> None:
    assert _capture_model(pristine_vllm, cumem=False)[0] == GRAPHS + FOREIGN
    assert _samples(pristine_vllm) == [s + FOREIGN for s in SIZES.values()]
    assert_pristine_lacks(lambda: _check_capture_model(pristine_vllm))

"""memory-profile-after-warmup and pinned-kv-empty-cache on a GPU (marker ``gpu``).

vLLM's own ``Worker.determine_available_memory`` (tests/patches/_worker_memory.py) with real
torch, real ``gc`` and vLLM's own ``memory_profiling`` / ``MemorySnapshot``
(utils/mem_utils.py), around a toy ``profile_run`` whose first call also allocates and frees a
1 GiB "compile scratch" (what a cold compile or autotune cache does) and whose every call
allocates and frees 256 MiB of activations. The allocator split limit the worker sets is
replaced by a no-op here (its torch call is from torch 2.13). Not shown here: engine boots
with a cold and a warm cache granting the same KV blocks, and a pinned boot's used memory
(need vLLM's compiled ops)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.gpu import vllm_tree
from tests.patches import _worker_memory as wm
from tests.patches._helpers import load_with_auto_stubs, make_module

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
SCRATCH = GIB
ACTIVATIONS = 256 * MIB


def _mem_utils(tree: Path) -> Any:
    platform = SimpleNamespace(current_device=torch.cuda.current_device,
                               is_integrated_gpu=lambda index: False, device_name="cuda")
    mod = load_with_auto_stubs(tree / "utils/mem_utils.py", {
        "vllm.platforms": make_module("vllm.platforms", current_platform=platform),
        "vllm.utils.mem_constants": make_module("vllm.utils.mem_constants", GiB_bytes=GIB,
                                                KiB_bytes=1 << 10, MiB_bytes=MIB),
    }, package="vllm.utils")
    mod.__dict__["torch"] = vllm_tree.accelerator_torch()
    return mod


class _ToyModel:
    """profile_run: a 1 GiB scratch on the first call only, 256 MiB of activations each."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        if self.calls == 0:
            scratch = torch.empty(SCRATCH, dtype=torch.uint8, device="cuda")
            scratch.fill_(1)
            del scratch
        act = torch.empty(ACTIVATIONS, dtype=torch.uint8, device="cuda")
        act.fill_(1)
        del act
        self.calls += 1


def _measured(tree: Path) -> Any:
    """The real profiling result of the measured window."""
    mu = _mem_utils(tree)
    results: list[Any] = []

    @contextmanager
    def profiling(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with mu.memory_profiling(*args, **kwargs) as result:
            yield result
        results.append(result)

    gc.collect()
    torch.cuda.empty_cache()
    snapshot = mu.MemorySnapshot()
    real = {"torch": vllm_tree.accelerator_torch(), "gc": gc, "memory_profiling": profiling,
            "init_snapshot": snapshot, "logger": logging.getLogger("worker")}
    events = wm.run(tree, pinned=False, real=real, profile=_ToyModel())
    assert len(results) == 1, events
    return results[0]


def _check_warm(tree: Path) -> None:
    result = _measured(tree)
    peak = result.transient_peak_headroom
    vllm_tree.record_line(f"  {tree.parent.name}: transient peak {peak / MIB:.0f} MiB "
                 f"(activations {ACTIVATIONS / MIB:.0f} MiB, cold scratch {SCRATCH / MIB:.0f})")
    assert abs(peak - ACTIVATIONS) <= 16 * MIB, f"transient peak {peak / MIB:.0f} MiB"


def test_memory_profile_after_warmup() -> None:
    vllm_tree.record_line("memory-profile-after-warmup (real memory_profiling, toy profile_run):")
    vllm_tree.fails_on_pristine(_check_warm)


PINNED = 512 * MIB


def _check_pinned(tree: Path) -> None:
    def profile() -> None:  # leaves 1 GiB cached, as a profile run's scratch does
        scratch = torch.empty(SCRATCH, dtype=torch.uint8, device="cuda")
        scratch.fill_(1)
        del scratch

    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    real = {"torch": vllm_tree.accelerator_torch(), "gc": gc, "logger": logging.getLogger("worker"),
            "set_current_vllm_config": lambda config: nullcontext()}
    events = wm.run(tree, pinned=True, real=real, profile=profile)
    assert events[-1] == ("return", wm.PINNED)
    after = torch.cuda.memory_reserved()
    kv = torch.empty(PINNED, dtype=torch.uint8, device="cuda")
    with_kv = torch.cuda.memory_reserved()
    del kv
    torch.cuda.empty_cache()
    vllm_tree.record_line(f"  {tree.parent.name}: reserved after the pinned branch "
                 f"{(after - base) / MIB:+.0f} MiB over the start, the {PINNED / MIB:.0f} MiB "
                 f"KV pool then adds {(with_kv - after) / MIB:+.0f} MiB")
    assert after - base < 16 * MIB, f"{(after - base) / MIB:.0f} MiB still cached"
    assert with_kv - after == PINNED


def test_pinned_kv_empty_cache() -> None:
    vllm_tree.record_line("pinned-kv-empty-cache (real determine_available_memory, pinned branch):")
    vllm_tree.fails_on_pristine(_check_pinned)

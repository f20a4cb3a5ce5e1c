"""pinned-kv-empty-cache: with ``kv_cache_memory_bytes`` pinned, ``determine_available_memory``
collects, synchronizes and empties the allocator cache after its profile run and before it
returns the pinned size.

Runs vLLM's own ``Worker.determine_available_memory`` with recorders (tests/patches/
_worker_memory.py). The memory it gives back is measured on a GPU:
tests/gpu/test_worker_memory_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import _worker_memory as wm
from ._helpers import assert_pristine_lacks

pytestmark = pytest.mark.e2e


def _check(tree: Path) -> None:
    events = wm.run(tree, pinned=True)
    runs = wm.profile_runs(events)
    assert len(runs) == 1, events
    assert runs[0][1] == {"profiling": False, "config": True, "split": False}
    after = events[events.index(runs[0]) + 1:]
    assert after == ["gc", "synchronize", "empty_cache", ("return", wm.PINNED)], after


def test_patched_pinned_branch_empties_the_cache(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_measured_branch_keeps_its_window(patched_vllm: Path) -> None:
    events = wm.run(patched_vllm, pinned=False)
    assert wm.profile_runs(events)[-1][1]["profiling"] is True
    assert "enter_profiling" in events and "exit_profiling" in events


def test_pristine_pinned_branch_keeps_the_cache(pristine_vllm: Path) -> None:
    assert wm.run(pristine_vllm, pinned=True)[-1] == ("return", wm.PINNED)
    assert_pristine_lacks(lambda: _check(pristine_vllm))

"""memory-profile-after-warmup: ``determine_available_memory`` runs ``profile_run`` once before
the measured window (same config, split limit and inputs), then collects, synchronizes and
empties the allocator cache; the pinned branch still profiles once.

Runs vLLM's own ``Worker.determine_available_memory`` with recorders (tests/patches/
_worker_memory.py). What the warm pass buys (a cold cache's scratch not counted) is measured
under the real ``memory_profiling`` on a GPU: tests/gpu/test_worker_memory_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import _worker_memory as wm
from ._helpers import assert_pristine_lacks

pytestmark = pytest.mark.e2e

CONFIGURED = {"config": True, "split": True}


def _check(tree: Path) -> None:
    events = wm.run(tree, pinned=False)
    runs = wm.profile_runs(events)
    assert len(runs) == 2, events
    warm, measured = runs
    # the warm pass: outside the window, under the config and the split limit, same inputs
    assert warm[1] == {"profiling": False, **CONFIGURED} and warm[2], warm
    assert measured[1] == {"profiling": True, **CONFIGURED} and measured[2], measured
    between = events[events.index(warm) + 1:events.index("enter_profiling")]
    assert between == ["gc", "synchronize", "empty_cache"], between


def test_patched_profiles_after_a_warm_pass(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_pinned_branch_profiles_once(patched_vllm: Path) -> None:
    events = wm.run(patched_vllm, pinned=True)
    assert len(wm.profile_runs(events)) == 1
    assert events[-1] == ("return", wm.PINNED)


def test_pristine_profiles_cold(pristine_vllm: Path) -> None:
    assert len(wm.profile_runs(wm.run(pristine_vllm, pinned=False))) == 1
    assert_pristine_lacks(lambda: _check(pristine_vllm))

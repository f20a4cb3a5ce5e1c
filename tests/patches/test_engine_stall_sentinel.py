"""engine-stall-sentinel: with requests live and no step completing for
VLLM_ENGINE_STALL_SENTINEL_S seconds, exactly one warning per stall episode; none while
idle; a new episode after progress resumes. The knob is registered in envs.py."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from ._helpers import (
    FakeClock,
    assert_pristine_lacks,
    load_envs,
    load_with_auto_stubs,
    make_module,
)

pytestmark = pytest.mark.e2e


def _load(tree: Path, stall_s: float) -> Any:
    module = tree / "v1/engine/step_watch.py"
    assert module.exists(), "no step watch in the engine core"
    envs = make_module("vllm.envs", VLLM_ENGINE_STALL_SENTINEL_S=stall_s)
    return load_with_auto_stubs(module, {"vllm.envs": envs})


def _warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records
               if r.levelno == logging.WARNING and "no engine step has completed" in
               r.getMessage())


def _check_episodes(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    mod = _load(tree, 5.0)
    assert hasattr(mod, "StallSentinel"), "no stall sentinel"
    clock = FakeClock()
    s = mod.StallSentinel(5.0, engine_index=0, clock=clock)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        # Idle: no live requests, never a warning however long.
        for _ in range(20):
            clock.advance(10)
            s.check()
        assert _warnings(caplog) == 0
        # Requests arrive: idle time does not count as a stall.
        s.set_live(2)
        s.check()
        assert _warnings(caplog) == 0
        clock.advance(4.9)
        s.check()
        assert _warnings(caplog) == 0
        clock.advance(0.2)
        s.check()
        assert _warnings(caplog) == 1
        # Same episode: no repeat.
        for _ in range(30):
            clock.advance(3)
            s.check()
        assert _warnings(caplog) == 1
        # A step completes: the episode ends; a new stall is a new episode.
        s.progress(2)
        clock.advance(4)
        s.check()
        assert _warnings(caplog) == 1
        clock.advance(1.5)
        s.check()
        assert _warnings(caplog) == 2
        # Progress keeps happening: no warnings.
        for _ in range(10):
            clock.advance(3)
            s.progress(1)
            s.check()
        assert _warnings(caplog) == 2
        # Finishing the last request makes the engine idle: silence again.
        s.progress(0)
        clock.advance(60)
        s.check()
        assert _warnings(caplog) == 2


def _check_thread(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    mod = _load(tree, 0.2)
    watch = mod.EngineStepWatch(engine_index=0)
    sentinel = watch.stall_sentinel
    assert sentinel is not None and sentinel._thread is not None
    assert sentinel._thread.daemon
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING):
            watch.step_started(1)  # the step hangs
            time.sleep(0.8)
            assert _warnings(caplog) == 1
            watch.step_completed(True, 1)
            watch.step_started(1)
            time.sleep(0.8)
            assert _warnings(caplog) == 2
            watch.step_completed(True, 0)  # idle
            time.sleep(0.6)
            assert _warnings(caplog) == 2
    finally:
        sentinel.stop()
    # Off by default: no thread.
    assert _load(tree, 0.0).EngineStepWatch().stall_sentinel is None


def _check_knob(tree: Path) -> None:
    envs = load_envs(tree)
    assert "VLLM_ENGINE_STALL_SENTINEL_S" in envs.environment_variables
    src = (tree / "v1/engine/step_watch.py").read_text()
    assert "envs.VLLM_ENGINE_STALL_SENTINEL_S" in src and "os.environ" not in src


def test_patched_one_warning_per_episode(patched_vllm: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    _check_episodes(patched_vllm, caplog)


def test_patched_daemon_thread_warns(patched_vllm: Path,
                                     caplog: pytest.LogCaptureFixture) -> None:
    _check_thread(patched_vllm, caplog)


def test_patched_knob_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_knob(patched_vllm)
    envs = load_envs(patched_vllm)
    monkeypatch.setenv("VLLM_ENGINE_STALL_SENTINEL_S", "7.5")
    assert envs.VLLM_ENGINE_STALL_SENTINEL_S == 7.5
    monkeypatch.delenv("VLLM_ENGINE_STALL_SENTINEL_S")
    assert envs.VLLM_ENGINE_STALL_SENTINEL_S == 0.0


def test_pristine_lacks_sentinel(pristine_vllm: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert_pristine_lacks(lambda: _check_episodes(pristine_vllm, caplog))
    assert_pristine_lacks(lambda: _check_knob(pristine_vllm))

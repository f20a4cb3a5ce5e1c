"""engine-completion-log: one log line per completed engine step (a step that executed the
model), emitted from the engine core's real _process_engine_step."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    AutoStub,
    FakeClock,
    assert_pristine_lacks,
    exec_function,
    load_with_auto_stubs,
    make_module,
)

pytestmark = pytest.mark.e2e


class _Scheduler:
    def __init__(self) -> None:
        self.live = 3

    def get_num_unfinished_requests(self) -> int:
        return self.live

    def has_requests(self) -> bool:
        return False


class _Queue:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put_nowait(self, item: Any) -> None:
        self.items.append(item)


def _step_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "completed step" in r.getMessage()]


def _check(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = tree / "v1/engine/step_watch.py"
    assert module.exists(), "no step watch in the engine core"
    envs = make_module("vllm.envs", VLLM_ENGINE_STALL_SENTINEL_S=0.0)
    step_watch = load_with_auto_stubs(module, {"vllm.envs": envs})
    clock = FakeClock()
    # The engine core's own step method, run against a fake core.
    process_engine_step = exec_function(
        tree / "v1/engine/core.py", "EngineCoreProc._process_engine_step",
        # get_watch_dog: 0.33.0 feeds its engine watchdog once per step
        {"time": time, "get_watch_dog": lambda: SimpleNamespace(feed=lambda: None)})
    scheduler = _Scheduler()
    results = iter([({0: "out"}, True), ({}, False), ({0: "out2"}, True)])

    def step_fn() -> tuple[dict[int, str], bool]:
        clock.advance(0.025)
        return next(results)

    core = SimpleNamespace(
        step_fn=step_fn, output_queue=_Queue(), post_step=lambda executed: None,
        scheduler=scheduler,
        step_watch=step_watch.EngineStepWatch(engine_index=0, clock=clock),
    )
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        assert process_engine_step(core) is True
        assert len(_step_lines(caplog)) == 1
        line = _step_lines(caplog)[0]
        assert "step 1" in line and "25.0 ms" in line and "3 live requests" in line
        # A step that executed no model is not a completed step.
        assert process_engine_step(core) is False
        assert len(_step_lines(caplog)) == 1
        scheduler.live = 1
        assert process_engine_step(core) is True
    lines = _step_lines(caplog)
    assert len(lines) == 2 and "step 2" in lines[1] and "1 live requests" in lines[1]
    assert core.output_queue.items == [(0, "out"), (0, "out2")]


def test_patched_logs_each_completed_step(patched_vllm: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    _check(patched_vllm, caplog)


class _HandshakeReached(Exception):
    """Raised where EngineCoreProc.__init__ would start its ZMQ handshakes."""


def _core_step_watch(tree: Path, engine_index: int) -> Any:
    """Run EngineCoreProc.__init__ (vLLM's own, from core.py) up to its handshakes and
    return the step watch it built."""
    envs = make_module("vllm.envs", VLLM_ENGINE_STALL_SENTINEL_S=0.0,
                       enable_envs_cache=lambda: None)
    overrides: dict[str, Any] = {
        "vllm.envs": envs,
        "vllm.version": make_module("vllm.version", __version__="0.32.0"),
    }
    tracing = AutoStub("vllm.tracing")
    tracing.__dict__["instrument"] = lambda **kw: (lambda f: f)
    overrides["vllm.tracing"] = tracing
    watch_file = tree / "v1/engine/step_watch.py"
    if watch_file.exists():
        overrides["vllm.v1.engine.step_watch"] = load_with_auto_stubs(watch_file,
                                                                      {"vllm.envs": envs})
    core = load_with_auto_stubs(tree / "v1/engine/core.py", overrides,
                                prefixes=("vllm", "msgspec", "zmq"))

    class Proc(core.EngineCoreProc):  # type: ignore[name-defined,misc]
        def _perform_handshakes(self, *args: Any) -> Any:
            raise _HandshakeReached

    proc = Proc.__new__(Proc)
    init: Any = Proc.__init__
    with pytest.raises(_HandshakeReached):
        init(proc, SimpleNamespace(), True, "ipc://h", object, False,
             engine_index=engine_index)
    return getattr(proc, "step_watch", None)


def test_patched_core_builds_step_watch(patched_vllm: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    watch = _core_step_watch(patched_vllm, engine_index=3)
    assert watch is not None and watch.engine_index == 3
    # The watch the core built is the one that logs its steps.
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        watch.step_started(2)
        watch.step_completed(True, 2)
    assert len(_step_lines(caplog)) == 1


def test_pristine_core_has_no_step_watch(pristine_vllm: Path) -> None:
    assert _core_step_watch(pristine_vllm, engine_index=3) is None


def test_pristine_lacks_step_log(pristine_vllm: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, caplog))

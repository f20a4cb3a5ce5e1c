"""vLLM's own ``Worker.determine_available_memory`` (v1/worker/gpu_worker.py) on CPU, with the
model runner, the allocator calls and the profiling window replaced by recorders.

``run(tree, pinned=...)`` returns the ordered events: ``profile_run`` (with where it ran:
inside ``memory_profiling`` or not, under the current config or not, under the allocator split
limit or not, and its ``randomize_inputs``), ``gc``, ``synchronize``, ``empty_cache``,
``enter_profiling``, ``exit_profiling`` and ``return``. The measured branch stops at the CUDA
graph profiling that follows the window (the platform check raises)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._helpers import exec_function

RANDOMIZE = object()  # the worker's randomize_dummy_inputs, passed through as is
PINNED = 3 << 30


class _AfterWindow(Exception):
    """The measured branch went past the profiling window."""


def run(tree: Path, *, pinned: bool, real: dict[str, Any] | None = None,
        profile: Any = None) -> list[Any]:
    """``real`` replaces names of the method's namespace (the GPU test hands in torch, gc
    and vLLM's own ``memory_profiling``); ``profile`` is called inside each recorded
    ``profile_run``."""
    events: list[Any] = []
    state = {"profiling": False, "config": False, "split": False}

    @contextmanager
    def flag(name: str, enter: str | None = None) -> Iterator[Any]:
        state[name] = True
        if enter:
            events.append(enter)
        try:
            yield SimpleNamespace()
        finally:
            state[name] = False
            if enter:
                events.append(enter.replace("enter", "exit"))

    def profile_run(randomize_inputs: Any = None) -> None:
        events.append(("profile_run", dict(state), randomize_inputs is RANDOMIZE))
        if profile is not None:
            profile()

    def platform_check() -> bool:
        raise _AfterWindow

    torch = SimpleNamespace(accelerator=SimpleNamespace(
        synchronize=lambda: events.append("synchronize"),
        empty_cache=lambda: events.append("empty_cache")))
    namespace = {
        "torch": torch,
        "gc": SimpleNamespace(collect=lambda *a: events.append("gc")),
        "maybe_apply_startup_plan": lambda worker: None,
        "set_current_vllm_config": lambda config: flag("config"),
        "memory_profiling": lambda *a, **k: flag("profiling", "enter_profiling"),
        "format_gib": lambda b: f"{b / (1 << 30):.2f}",
        "reserve_mm_ipc_gpu_memory": lambda size, *a: size,
        "logger": SimpleNamespace(info=lambda *a: None, debug=lambda *a: None,
                                  info_once=lambda *a: None),
        "current_platform": SimpleNamespace(is_cuda_alike=platform_check,
                                            is_xpu=platform_check),
    }
    namespace.update(real or {})
    determine = exec_function(tree / "v1/worker/gpu_worker.py",
                              "Worker.determine_available_memory", namespace)
    worker = SimpleNamespace(
        cache_config=SimpleNamespace(kv_cache_memory_bytes=PINNED if pinned else None,
                                     gpu_memory_utilization=0.9),
        model_runner=SimpleNamespace(profile_run=profile_run, model_memory_usage=1 << 30),
        randomize_dummy_inputs=RANDOMIZE,
        # compilation_config: 0.33.0 reads it before the platform check that ends the run
        vllm_config=SimpleNamespace(compilation_config=SimpleNamespace()),
        init_snapshot=(real or {}).get("init_snapshot", SimpleNamespace(free_memory=40 << 30)),
        model_config=SimpleNamespace(multimodal_config=None),
        parallel_config=SimpleNamespace(),
        _scoped_allocator_max_split=lambda max_split_size_mb: flag("split"),
    )
    try:
        result = determine(worker)
    except _AfterWindow:
        pass
    else:
        events.append(("return", result))
    return events


def profile_runs(events: list[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, tuple) and e[0] == "profile_run"]

"""vLLM's own V2 ``GPUModelRunner.capture_model`` (v1/worker/gpu/model_runner.py) and
``CudaGraphManager.capture`` (v1/worker/gpu/cudagraph_utils.py), with the memory readings,
the graph capture and the graph pool supplied by the caller.

The CPU tests pass a fake ``torch`` whose readings move by set amounts; the GPU test
(tests/gpu/test_cudagraph_memory_from_allocator_gpu.py) passes the real one."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._helpers import exec_function, load_with_auto_stubs


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class Desc:
    num_tokens: int
    cg_mode: CUDAGraphMode = CUDAGraphMode.FULL
    num_ubatches: int = 1
    num_active_loras: int = 0


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[Any, ...]] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append((msg, *args))

    debug = warning = info


def cumem_check(tree: Path) -> Callable[[Any], bool] | None:
    """The patched tree's ``captures_into_cumem_pool`` (None where the file lacks it)."""
    mod = load_with_auto_stubs(tree / "compilation/cudagraph_pool.py")
    return getattr(mod, "captures_into_cumem_pool", None)


def capture_model(tree: Path, torch: Any, capture: Callable[[], None], *,
                  cumem: bool = False) -> tuple[int, Log]:
    """Run the real ``capture_model`` once; ``capture`` stands in for the manager's capture.
    Returns the size it reports and its log."""
    log = Log()
    namespace: dict[str, Any] = {
        "torch": torch, "logger": log, "time": __import__("time"),
        "compilation_counter": SimpleNamespace(num_gpu_runner_capture_triggers=0),
        "freeze_gc_for_cudagraph_capture": nullcontext,
        "lock_workspace": lambda: None,
        "create_lora_capture_hook": lambda *a: None,
        "use_workspace_lane": lambda lane: nullcontext(),
    }
    check = cumem_check(tree)
    if check is not None:
        namespace["captures_into_cumem_pool"] = check
    run = exec_function(tree / "v1/worker/gpu/model_runner.py",
                        "GPUModelRunner.capture_model", namespace)
    runner = SimpleNamespace(
        cudagraph_manager=SimpleNamespace(needs_capture=lambda: True,
                                          capture=lambda *a, **k: capture()),
        model_state=SimpleNamespace(supports_mm_inputs=False,
                                    capture_inner_cudagraphs=lambda *a: None),
        maybe_setup_dummy_loras=lambda cfg: nullcontext(), lora_config=None,
        input_buffers=None, pcp_manager=None, intermediate_tensors=None, block_tables=None,
        attn_groups=None, kv_cache_config=None, model=None,
        use_aux_hidden_state_outputs=False, speculator=None, adaptive_verification=None,
        kv_connector=SimpleNamespace(reset_capture_state=lambda: None),
        vllm_config=SimpleNamespace(use_cumem_cudagraph_pool=cumem),
    )
    size = int(run(runner, profile_only=True))
    return size, log


def manager_capture(tree: Path, torch: Any, descs: list[Desc],
                    forward: Callable[[Desc, bool], None],
                    pool_enter: Callable[[], None]) -> list[int]:
    """Run the real ``CudaGraphManager.capture`` over FULL ``descs`` in profiling mode
    (samples on); ``forward(desc, capturing)`` is each graph's body and ``pool_enter`` runs
    as the capture pool is entered. Returns the recorded samples."""

    @contextmanager
    def capture_pool(pool: Any, config: Any) -> Iterator[Any]:
        pool_enter()
        yield pool

    namespace: dict[str, Any] = {
        "torch": torch, "logger": Log(), "ExitStack": ExitStack,
        "CUDAGraphMode": CUDAGraphMode, "graph_capture": lambda device: nullcontext(),
        "is_global_first_rank": lambda: False, "tqdm": lambda it, **k: it,
        "get_offloader": lambda: SimpleNamespace(sync_prev_onload=lambda: None,
                                                 join_after_forward=lambda: None),
        "capture_pool": capture_pool,
        "compilation_counter": SimpleNamespace(num_cudagraph_captured=0),
    }
    run = exec_function(tree / "v1/worker/gpu/cudagraph_utils.py",
                        "CudaGraphManager.capture", namespace)
    samples: list[int] = []

    def create_forward_fn(desc: Desc, warmup: bool) -> Callable[[Any], None]:
        return lambda mode: forward(desc, not warmup)

    manager = SimpleNamespace(
        device=None, ubatch_runner=None, _capture_descs={CUDAGraphMode.FULL: list(descs)},
        _max_full_descs_to_capture=None, use_breakable_cg=False, graphs={}, pool=None,
        vllm_config=None, _capture_mem_samples=samples,
        _capture_stream=lambda desc: None, _graphs_captured=False)
    run(manager, create_forward_fn)
    assert len(manager.graphs) == len(descs)
    return samples

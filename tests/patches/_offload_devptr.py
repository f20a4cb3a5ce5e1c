"""vLLM's own CPU-offload registration and descriptor code (v1/kv_offload/cpu/host_register.py
and gpu_worker.py) with the CUDA runtime supplied by the caller: a fake ``CudaRTLibrary`` on CPU,
the real one on a GPU."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._helpers import exec_function, load_with_auto_stubs, make_module

WORKER = "v1/kv_offload/cpu/gpu_worker.py"
REGISTER = "v1/kv_offload/cpu/host_register.py"


class Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.warnings.append(msg % args if args else msg)

    def debug(self, *args: Any, **kwargs: Any) -> None:
        pass

    info = info_once = debug


def register_module(tree: Path, cudart_cls: Any) -> Any:
    platform = SimpleNamespace(is_cuda_alike=lambda: True, is_xpu=lambda: False,
                               device_name="cuda")
    mod = load_with_auto_stubs(tree / REGISTER, {
        "vllm.distributed.device_communicators.cuda_wrapper": make_module(
            "vllm.distributed.device_communicators.cuda_wrapper", CudaRTLibrary=cudart_cls),
        "vllm.platforms": make_module("vllm.platforms", current_platform=platform),
    })
    mod.__dict__["logger"] = logging.getLogger("host_register")
    return mod


def pin(tree: Path, region: Any, cudart_cls: Any, chunk_bytes: int) -> Log:
    """Run the real ``pin_mmap_region`` on ``region`` with registration through the real
    host_register.py over ``cudart_cls``."""
    reg = register_module(tree, cudart_cls)
    log = Log()
    namespace = {name: getattr(reg, name) for name in
                 ("host_register", "host_unregister", "host_device_pointer")
                 if hasattr(reg, name)}
    # MIN_HOST_REGISTER_SAVED_BYTES: 0.33.0's (it may register the worker's slots only)
    namespace.update(MAX_HOST_REGISTER_CHUNK_BYTES=chunk_bytes, logger=log,
                     MIN_HOST_REGISTER_SAVED_BYTES=3 * 1024**2,
                     current_platform=SimpleNamespace(is_cuda_alike=lambda: True))
    exec_function(tree / WORKER, "pin_mmap_region", namespace)(region)
    return log


def sub_block_ptrs(tree: Path) -> Any:
    import numpy as np

    return exec_function(tree / WORKER, "compute_sub_block_ptrs", {"np": np})

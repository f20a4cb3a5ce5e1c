"""Load the cubin for the device and launch the kernels on torch tensors.

The cubin is loaded through CuPy; a launch goes to the CUDA driver directly (ctypes) with a
prepacked argument block, CuPy's launch being the fallback."""

from __future__ import annotations

import threading
from typing import Any

from . import _validate as V
from ._cubins import find_cubin
from ._knobs import knobs

_LOCK = threading.Lock()
_MODULES: dict[int, Any] = {}


def _module(device: int) -> Any:
    with _LOCK:
        mod = _MODULES.get(device)
        if mod is None:
            import cupy
            import torch

            major, minor = torch.cuda.get_device_capability(device)
            path = find_cubin(major, minor)
            with cupy.cuda.Device(device):
                mod = cupy.RawModule(path=str(path))
            _MODULES[device] = mod
        return mod


_STREAMS: dict[tuple[int, int], Any] = {}


def _cupy_stream(device: int, ptr: int) -> Any:
    """A CuPy view of torch's stream ``ptr`` (cached; no new stream is created)."""
    key = (device, ptr)
    st = _STREAMS.get(key)
    if st is None:
        import warnings

        import cupy

        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream in favour of Stream.from_external, which
            # wants an object with __cuda_stream__; a raw pointer is what torch gives.
            warnings.simplefilter("ignore", DeprecationWarning)
            st = cupy.cuda.ExternalStream(ptr, device)
        _STREAMS[key] = st
    return st


class _Torch:
    """torch's C entry points for the hot path, bound once: the current device, the raw
    current stream, whether that stream is capturing a graph, and ``empty``."""

    def __init__(self) -> None:
        import torch

        c = torch._C
        self.torch = torch
        self.device = getattr(c, "_cuda_getDevice", torch.cuda.current_device)
        self.stream = getattr(c, "_cuda_getCurrentRawStream",
                              lambda d: torch.cuda.current_stream(d).cuda_stream)
        self.capturing = getattr(c, "_cuda_isCurrentStreamCapturing",
                                 torch.cuda.is_current_stream_capturing)
        self.empty = torch.empty
        self.empty_like = torch.empty_like
        self.zeros = torch.zeros
        self.uint8 = torch.uint8


_T: list[_Torch] = []


def _torch() -> _Torch:
    if not _T:
        _T.append(_Torch())
    return _T[0]


# Kernel argument formats, one character per argument (struct's codes, native alignment):
# Q a device pointer, i int32, q int64, f float32. They must match the kernels' signatures.
# The partition kernels and quantize end with the caches' block strides (K/V bytes, scale
# floats).
FMT_QUANTIZE = "QQQQQQQiiqqqqiqq"
FMT_PART = "QQQQQQiQQQiiiifqq"      # simt: ..., num_kv_heads, block_shift, part, parts, scale
FMT_MMA = "QQQQQQiQQQiiiiifqq"      # mma1: ..., num_kv_heads, gqa, block_shift, ...
FMT_CP = "QQQQQQiQQQQQiiiiifqq"     # cp3/cp4: ..., part_acc, out, counters, num_kv_heads, ...
FMT_WB = "QQQQQQiQQQiiiifqq"        # wb: ..., part_acc, gqa, block_shift, part, parts, scale
FMT_REDUCE = "QQQQiii"


class _ArgBlock:
    """One kernel's argument block for the driver's launch: a buffer that holds every
    argument at its natural alignment, and the array of their addresses that
    ``cuLaunchKernel`` reads. Filling it is one ``struct.pack_into``; the driver copies the
    values at the launch, so the block is reused (one per kernel and thread).

    With ``tail`` (the last arguments, fixed for a plan) written once, ``pack_head`` fills
    only the leading arguments that change from call to call: a prefix of a natively
    aligned layout has the same offsets as the whole."""

    __slots__ = ("address", "buf", "pack", "pack_head", "params")

    def __init__(self, fmt: str, tail: tuple[Any, ...] = ()) -> None:
        import ctypes
        import functools
        import struct

        layout = struct.Struct("@" + fmt)
        self.buf = ctypes.create_string_buffer(max(layout.size, 1))
        base = ctypes.addressof(self.buf)
        offsets = [struct.calcsize("@" + fmt[: i + 1]) - struct.calcsize("@" + c)
                   for i, c in enumerate(fmt)]
        self.params = (ctypes.c_void_p * len(fmt))(*(base + o for o in offsets))
        self.address = ctypes.addressof(self.params)
        self.pack = functools.partial(layout.pack_into, self.buf, 0)
        head = len(fmt) - len(tail)
        if tail:
            self.pack(*([0] * head), *tail)
        self.pack_head = functools.partial(struct.Struct("@" + fmt[:head]).pack_into,
                                           self.buf, 0)


class _Driver:
    """``cuLaunchKernel`` with a prepacked argument block: CuPy's own binding of it (typed
    Cython: no per-argument wrapping), else the driver library through ctypes. Either raises
    on a failed launch."""

    def __init__(self) -> None:
        launch = None
        try:
            from cupy.cuda import driver

            launch = getattr(driver, "launchKernel", None)
        except ImportError:
            pass
        self.launch = launch or self._ctypes_launch()

    @staticmethod
    def _ctypes_launch() -> Any:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")  # the driver torch and CuPy already loaded
        fn = lib.cuLaunchKernel
        u, p = ctypes.c_uint, ctypes.c_void_p
        fn.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
        fn.restype = ctypes.c_int
        name = lib.cuGetErrorName
        name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

        def check(code: int, _fn: Any, _args: Any) -> int:
            if code:
                out = ctypes.c_char_p()
                name(code, ctypes.byref(out))
                raise RuntimeError(f"cuLaunchKernel failed: {(out.value or b'?').decode()}")
            return code

        fn.errcheck = check  # type: ignore[assignment]
        return fn


_DRIVER: list[_Driver | None] = []


def _driver() -> _Driver | None:
    """The driver's launch, unless ``PTHFA_LAUNCH=cupy`` or no binding can be had; None sends
    every launch through CuPy's kernel call."""
    if not _DRIVER:
        drv = None
        if knobs().launch != "cupy":
            try:
                drv = _Driver()
            except (OSError, AttributeError):
                drv = None
        _DRIVER.append(drv)
    return _DRIVER[0]


class _Kernel:
    """A loaded kernel of one device: CuPy's RawKernel (module and shared-memory attribute),
    its CUfunction, its argument format, and an argument block per thread."""

    __slots__ = ("blocks", "device", "fmt", "fn", "raw", "smem")

    def __init__(self, device: int, name: str, fmt: str) -> None:
        import cupy

        self.device = device
        self.raw = _module(device).get_function(name)
        with cupy.cuda.Device(device):  # CuPy loads the module on the current device
            self.fn = int(self.raw.kernel.ptr)
        self.fmt = fmt
        self.smem = V.SMEM_DEFAULT
        self.blocks: dict[int, _ArgBlock] = {}

    def allow_smem(self, nbytes: int) -> None:
        import cupy

        if nbytes > self.smem:
            with cupy.cuda.Device(self.device):
                self.raw.max_dynamic_shared_size_bytes = max(
                    self.raw.max_dynamic_shared_size_bytes, nbytes)
            self.smem = nbytes

    def run(self, t: _Torch, stream: int, grid: tuple[int, int, int],
            block: tuple[int, int, int], args: tuple[Any, ...], shared_mem: int) -> None:
        """Launch on ``stream`` of this kernel's device. The hot path is one
        ``struct.pack_into`` and one ``cuLaunchKernel``; CuPy's kernel call (numpy scalars,
        and its device and stream context managers where the current device is another
        one) is the fallback."""
        drv = _DRIVER[0] if _DRIVER else _driver()
        if drv is not None and t.device() == self.device:
            blk = self.blocks.get(threading.get_ident())
            if blk is None:
                blk = self.blocks[threading.get_ident()] = _ArgBlock(self.fmt)
            blk.pack(*args)
            drv.launch(self.fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                       shared_mem, stream, blk.address, 0)
            return
        import cupy
        import numpy as np

        kinds = {"Q": np.uint64, "i": np.int32, "q": np.int64, "f": np.float32}
        typed = tuple(kinds[c](a) for c, a in zip(self.fmt, args, strict=True))
        if cupy.cuda.runtime.getDevice() == self.device:
            self.raw.kernel(grid, block, typed, shared_mem, _cupy_stream(self.device, stream))
            return
        with cupy.cuda.Device(self.device), _cupy_stream(self.device, stream):
            self.raw(grid, block, typed, shared_mem=shared_mem)


_KERNELS: dict[tuple[int, str], _Kernel] = {}


def _kernel(device: int, name: str, fmt: str, shared_mem: int = 0) -> _Kernel:
    """The loaded kernel ``name`` of ``device``, its dynamic shared memory allowed up to
    ``shared_mem``."""
    k = _KERNELS.get((device, name))
    if k is None:
        k = _KERNELS[(device, name)] = _Kernel(device, name, fmt)
    k.allow_smem(shared_mem)
    return k


def _launch(device: int, name: str, fmt: str, grid: tuple[int, int, int],
            block: tuple[int, int, int], args: tuple[Any, ...], shared_mem: int = 0) -> None:
    """Launch ``name`` on torch's current stream of ``device`` (for benchmarks and probes;
    decode and quantize_kv keep their kernels in their plans)."""
    t = _T[0] if _T else _torch()
    _kernel(device, name, fmt, shared_mem).run(t, t.stream(device), grid, block, args,
                                               shared_mem)

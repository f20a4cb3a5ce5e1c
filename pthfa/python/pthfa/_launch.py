"""Load the cubin for the device and launch the kernels on torch tensors.

The cubin is loaded through CuPy; a launch goes to the CUDA driver directly (ctypes) with a
prepacked argument block, CuPy's launch being the fallback."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

from . import _validate as V

_LOCK = threading.Lock()
_MODULES: dict[int, Any] = {}


def cubin_dir() -> Path:
    """Where the cubins are: $PTHFA_CUBIN_DIR, else the package's ``cubins/``."""
    env = os.environ.get("PTHFA_CUBIN_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "cubins"


def find_cubin(major: int, minor: int, directory: Path | None = None) -> Path:
    """The binary for compute capability major.minor.

    Exact ``sm_XY.cubin`` first; else the newest ``sm_X*`` cubin of the same major with a lower
    minor (cubins run on later minors of their major); else the newest ``compute_*.ptx`` not
    newer than the device (the driver compiles it). FileNotFoundError names what was looked for.
    """
    d = directory or cubin_dir()
    exact = d / f"sm_{major}{minor}.cubin"
    if exact.is_file():
        return exact
    for m in range(minor - 1, -1, -1):
        p = d / f"sm_{major}{m}.cubin"
        if p.is_file():
            return p
    ptx = []
    for p in d.glob("compute_*.ptx") if d.is_dir() else []:
        try:
            sm = int(p.stem.split("_", 1)[1])
        except ValueError:
            continue
        if sm <= major * 10 + minor:
            ptx.append((sm, p))
    if ptx:
        return max(ptx)[1]
    have = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
    raise FileNotFoundError(
        f"no pthfa cubin for compute capability {major}.{minor} in {d} (looked for "
        f"sm_{major}{minor}.cubin, sm_{major}x.cubin, compute_*.ptx; found {have}); build it "
        f"with `qwen38build kernels --arch {major}.{minor}`"
    )


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


# Per (device, stream): the scratch of one decode, reused by every eager decode on that stream
# (stream order keeps one call's reads before the next call's writes): first the arrival
# counters of the fused reduce (zeroed once; every call leaves them at zero), then the partial
# results. (counters' address, counters it holds, scratch's address, scratch bytes, tensor).
_WORK: dict[tuple[int, int], tuple[int, int, int, int, Any]] = {}


def _workspace(t: _Torch, device: int, stream: int, counters: int, nbytes: int,
               capturing: bool) -> tuple[int, int, Any]:
    """(counters' address, scratch's address, owner) for one decode. Eager: the stream's
    cached buffer, grown as needed. While the stream captures a graph: a fresh allocation from
    the graph's pool, so a replay never shares its scratch with eager calls; a graph never
    takes the fused reduce, so it needs no counters (and no zeroing in every replay)."""
    buf: Any
    if capturing:
        buf = t.empty(nbytes, dtype=t.uint8, device=device)
        return 0, buf.data_ptr(), buf
    got = _WORK.get((device, stream))
    if got is not None and got[1] >= counters and got[3] >= nbytes:
        return got[0], got[2], got[4]
    if got is not None:  # grow both parts: the counters are laid out first
        counters = max(counters, got[1])
        nbytes = max(nbytes, got[3])
    head = (counters * 4 + 255) // 256 * 256
    size = max(nbytes, 1 << 16)
    buf = t.zeros(head + size, dtype=t.uint8, device=device)
    _WORK[(device, stream)] = (buf.data_ptr(), head // 4, buf.data_ptr() + head, size, buf)
    return buf.data_ptr(), buf.data_ptr() + head, buf


IMPLS = ("simt", "mma1", "cp3", "cp4", "wb4", "wb5")
DEFAULT = "cp3"


class Knobs:
    """The environment knobs, read once (at the first call) rather than on every launch:
    ``PTHFA_IMPL``, ``PTHFA_PART_SIZE``, ``PTHFA_VALIDATE``, ``PTHFA_LAUNCH``. A program that
    changes them later calls :func:`reload_env`."""

    __slots__ = ("impl", "launch", "part_size", "validate")

    def __init__(self) -> None:
        self.impl = os.environ.get("PTHFA_IMPL", "")
        self.part_size = os.environ.get("PTHFA_PART_SIZE", "")
        self.validate = os.environ.get("PTHFA_VALIDATE", "") == "always"
        self.launch = os.environ.get("PTHFA_LAUNCH", "")


_KNOBS: list[Knobs] = []


def knobs() -> Knobs:
    if not _KNOBS:
        _KNOBS.append(Knobs())
    return _KNOBS[0]


def reload_env() -> None:
    """Re-read the PTHFA_* knobs, and forget every plan and launch choice made from them."""
    with _LOCK:
        _KNOBS.clear()
        _DRIVER.clear()
        _PLANS.clear()
        _DECODE_OK.clear()
        _QUANTIZE_OK.clear()


def decode_impl(head_dim: int, part_size: int = 2048) -> str:
    """The partition kernel: $PTHFA_IMPL if set (one of IMPLS), else the pipelined
    tensor-core kernel cp3, which measured fastest on every benchmark shape on the H200
    (2026-11-29) once its partition size is chosen by ``choose_part_size_cp``."""
    impl = knobs().impl
    if impl:
        if impl not in IMPLS:
            raise ValueError(f"PTHFA_IMPL must be one of {IMPLS}, got {impl!r}")
        return impl
    return DEFAULT


_PLANS: dict[tuple[Any, ...], tuple[str, int]] = {}
_SMS: dict[int, int] = {}


def _num_sms(device: int) -> int:
    n = _SMS.get(device)
    if n is None:
        import torch

        n = _SMS[device] = int(torch.cuda.get_device_properties(device).multi_processor_count)
    return n


def cached_plan(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int,
                gqa: int, head_dim: int, num_sms: int) -> tuple[str, int]:
    """:func:`plan`, remembered per arguments (the knobs it reads are fixed until
    :func:`reload_env`, which forgets these)."""
    key = (num_seqs, num_kv_heads, max_seq_len, block_size, gqa, head_dim, num_sms)
    got = _PLANS.get(key)
    if got is None:
        got = plan(num_seqs, num_kv_heads, max_seq_len, block_size, gqa, head_dim, num_sms)
        if len(_PLANS) < 4096:
            _PLANS[key] = got
    return got


def plan(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int, gqa: int,
         head_dim: int, num_sms: int) -> tuple[str, int]:
    """(partition kernel, partition size) that ``decode`` uses when no part_size is given.

    cp3/cp4: ``choose_part_size_cp`` with the CTAs per SM that their registers and shared
    memory allow; mma1: ``choose_part_size_mma``; simt: ``choose_part_size``.
    ``$PTHFA_PART_SIZE`` (a measurement knob) forces the partition size: any multiple of 16
    and of block_size, not only powers of two.
    """
    impl = decode_impl(head_dim)
    env_part = knobs().part_size
    if env_part:
        part = int(env_part)
        if part < 16 or part % 16 or part % block_size:
            raise ValueError(f"PTHFA_PART_SIZE must be a multiple of 16 and of block_size "
                             f"{block_size}, got {part}")
        return impl, part
    if impl.startswith("wb") and V.wb_supported(num_kv_heads, head_dim, block_size):
        part = V.choose_part_size_wb(num_seqs, max_seq_len, block_size, num_sms)
    elif impl.startswith("cp") or impl.startswith("wb"):
        stages = int(impl[2:]) if impl.startswith("cp") else 3
        smem = V.smem_bytes_cp(2048, block_size, gqa, head_dim, stages)
        per_sm = max(1, min(3 if stages == 3 else 2, (228 << 10) // (smem + 1024)))
        part = V.choose_part_size_cp(num_seqs, num_kv_heads, max_seq_len, block_size, num_sms,
                                     per_sm)
    elif impl == "simt":
        part = V.choose_part_size(num_seqs, num_kv_heads, max_seq_len, block_size, gqa,
                                  head_dim, num_sms)
    else:
        part = V.choose_part_size_mma(num_seqs, num_kv_heads, max_seq_len, block_size, num_sms)
    return impl, part


class _Signature:
    """What the full validation of one signature (every tensor's shape, strides, dtype and
    device) found, and the launch plans derived from it per scalar arguments."""

    __slots__ = ("args", "cap", "last", "plans")

    def __init__(self, args: Any) -> None:
        self.args = args
        self.plans: dict[tuple[Any, ...], Any] = {}
        # decode: the longest max_seq_len the block tables hold, and the last call's
        # (max_seq_len, plan) when part_size and sm_scale were left to the defaults
        self.cap = getattr(args, "max_blocks", 0) * getattr(args, "block_size", 0)
        self.last: tuple[int, Any] | None = None


_DECODE_OK: dict[tuple[Any, ...], _Signature] = {}
_QUANTIZE_OK: dict[tuple[Any, ...], _Signature] = {}


def _decode_key(q: Any, kc: Any, vc: Any, ks: Any, vs: Any, bt: Any, sl: Any,
                out: Any) -> tuple[Any, ...]:
    """decode's signature: every tensor's shape, strides, dtype and device, in one flat tuple
    (flat: the cheapest form to build and hash)."""
    return (q.shape, q.stride(), q.dtype, q.get_device(), kc.shape, kc.stride(), kc.dtype,
            kc.get_device(), vc.shape, vc.stride(), vc.dtype, vc.get_device(), ks.shape,
            ks.stride(), ks.dtype, ks.get_device(), vs.shape, vs.stride(), vs.dtype,
            vs.get_device(), bt.shape, bt.stride(), bt.dtype, bt.get_device(), sl.shape,
            sl.stride(), sl.dtype, sl.get_device(),
            None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()))


def _quantize_key(k: Any, v: Any, kc: Any, vc: Any, ks: Any, vs: Any,
                  sm: Any) -> tuple[Any, ...]:
    """quantize_kv's signature, as :func:`_decode_key`."""
    return (k.shape, k.stride(), k.dtype, k.get_device(), v.shape, v.stride(), v.dtype,
            v.get_device(), kc.shape, kc.stride(), kc.dtype, kc.get_device(), vc.shape,
            vc.stride(), vc.dtype, vc.get_device(), ks.shape, ks.stride(), ks.dtype,
            ks.get_device(), vs.shape, vs.stride(), vs.dtype, vs.get_device(), sm.shape,
            sm.stride(), sm.dtype, sm.get_device())


def _checked(seen: dict[tuple[Any, ...], _Signature], check: Any, key: Any,
             *tensors: Any) -> _Signature:
    """``check(*tensors)``, the full validation, once per signature ``key(*tensors)``: a
    later call with the same signature passes what the full check passed, in O(1) per
    tensor. ``PTHFA_VALIDATE=always`` checks every call."""
    try:
        sig = key(*tensors)
        got = seen.get(sig)
    except (AttributeError, TypeError):  # not tensors: the full check names what is wrong
        return _Signature(check(*tensors))
    if got is None:
        got = _Signature(check(*tensors))
        if len(seen) < 4096:
            seen[sig] = got
    elif (_KNOBS[0] if _KNOBS else knobs()).validate:
        check(*tensors)
    return got


def quantize_kv(key: Any, value: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
                slot_mapping: Any) -> None:
    """Quantize ``key``/``value`` [tokens, kv_heads, head_dim] into the paged int8 cache.

    Row ``slot_mapping[i]`` (= block * block_size + offset; negative skips the token) of the
    caches [num_blocks, block_size, kv_heads, head_dim] int8 gets token i, and the scales
    [num_blocks, block_size, kv_heads] fp32 get absmax / 127 of each (token, head) row.
    """
    sig = _checked(_QUANTIZE_OK, V.check_quantize, _quantize_key, key, value, k_cache, v_cache,
                   k_scale, v_scale, slot_mapping)
    p = sig.plans.get(())
    if p is None:
        a = sig.args
        warps = 2 * a.num_tokens * a.num_kv_heads
        kernel = (_kernel(a.device, f"pthfa_quantize_{a.dtype}_d{a.head_dim}", FMT_QUANTIZE)
                  if a.num_tokens else None)
        p = sig.plans[()] = (kernel, (max(1, math.ceil(warps / V.WARPS)), 1, 1),
                             (a.num_tokens, a.num_kv_heads, *a.key_strides, *a.value_strides,
                              a.block_shift, a.kv_bstride, a.sc_bstride),
                             {})
    kernel, grid, ints = p[0], p[1], p[2]
    blocks: dict[int, _ArgBlock] = p[3]
    if kernel is None:
        return
    t = _T[0] if _T else _torch()
    stream = t.stream(kernel.device)
    drv = _DRIVER[0] if _DRIVER else _driver()
    if drv is not None and t.device() == kernel.device:  # the hot path
        tid = threading.get_ident()
        blk = blocks.get(tid)
        if blk is None:
            blk = blocks[tid] = _ArgBlock(FMT_QUANTIZE, ints)
        blk.pack_head(key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                      k_scale.data_ptr(), v_scale.data_ptr(), slot_mapping.data_ptr())
        drv.launch(kernel.fn, grid[0], 1, 1, V.THREADS, 1, 1, 0, stream, blk.address, 0)
        return
    kernel.run(t, stream, grid, _THREADS3, (
        key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        k_scale.data_ptr(), v_scale.data_ptr(), slot_mapping.data_ptr(), *ints), 0)


def _bucket(n: int, cap: int) -> int:
    """``n`` rounded up to four significant bits (at most 12.5% more; never above ``cap``):
    the length a plan is made for. A decode's max_seq_len grows by one each step; plans per
    bucket keep the plan cache small and hit, and the partitions past a sequence's length
    return at once (the reduce reads only those its seq_len covers)."""
    if n <= 16:
        return n
    shift = n.bit_length() - 4
    return min((((n - 1) >> shift) + 1) << shift, cap)


class _DecodePlan:
    """Everything ``decode`` derives from a signature and its scalar arguments: the loaded
    kernels, grids, shared memory, scratch layout and the integer arguments."""

    __slots__ = (
        "acc_bytes",
        "blocks",
        "counters",
        "device",
        "empty",
        "fmt",
        "grid",
        "part",
        "part_ints",
        "reduce",
        "reduce_block",
        "reduce_grid",
        "reduce_ints",
        "smem",
        "threads",
        "work_bytes",
    )

    def __init__(self, a: Any, max_seq_len: int, part_size: int | None,
                 sm_scale: float | None) -> None:
        max_seq_len = V.check_max_seq_len(max_seq_len, a)
        if sm_scale is None:
            sm_scale = 1.0 / math.sqrt(a.head_dim)
        if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool):
            raise TypeError(f"sm_scale must be a float, got {type(sm_scale).__name__}")
        self.device = a.device
        self.blocks: dict[int, tuple[_ArgBlock, _ArgBlock]] = {}
        self.empty = a.num_seqs == 0 or a.num_heads == 0
        if self.empty:
            return
        if part_size is None:
            impl, part_size = cached_plan(a.num_seqs, a.num_kv_heads, max_seq_len,
                                          a.block_size, a.gqa, a.head_dim, _num_sms(a.device))
        else:
            V.check_part_size(part_size, a.block_size, a.gqa, a.head_dim)
            impl = decode_impl(a.head_dim, part_size)
        if impl.startswith("wb") and not V.wb_supported(a.num_kv_heads, a.head_dim,
                                                        a.block_size):
            impl = DEFAULT  # the whole-block kernel is built for 8 KV heads of 128 dims
        max_parts = max(1, math.ceil(max_seq_len / part_size))
        rows = a.num_seqs * a.num_heads * max_parts
        # the accumulators first, so both buffers start 256-byte aligned
        self.acc_bytes = rows * a.head_dim * 4
        self.work_bytes = rows * (a.head_dim + 2) * 4
        block_shift = a.block_size.bit_length() - 1
        scale_log2 = float(sm_scale) * math.log2(math.e)
        self.part_ints: tuple[Any, ...]
        self.grid = (max_parts, a.num_kv_heads, a.num_seqs)
        self.threads = V.THREADS
        if impl.startswith("wb"):
            name = f"pthfa_decode_{impl}_{a.dtype}_d{a.head_dim}_h{a.num_kv_heads}"
            self.fmt = FMT_WB
            self.grid = (max_parts, 1, a.num_seqs)
            self.threads = 32 * a.num_kv_heads
            self.part_ints = (a.gqa, block_shift, part_size, max_parts, scale_log2,
                              a.kv_bstride, a.sc_bstride)
            self.smem = V.smem_bytes_wb(part_size, a.block_size, a.num_kv_heads, a.head_dim,
                                        int(impl[2:]))
        elif impl == "simt":
            name = f"pthfa_decode_part_{a.dtype}_d{a.head_dim}_g{a.gqa}"
            self.fmt = FMT_PART
            self.part_ints = (a.num_kv_heads, block_shift, part_size, max_parts, scale_log2,
                              a.kv_bstride, a.sc_bstride)
            self.smem = V.smem_bytes(part_size, a.block_size, a.gqa, a.head_dim)
        else:
            name = f"pthfa_decode_{impl}_{a.dtype}_d{a.head_dim}"
            self.fmt = FMT_CP if impl.startswith("cp") else FMT_MMA
            self.part_ints = (a.num_kv_heads, a.gqa, block_shift, part_size, max_parts,
                              scale_log2, a.kv_bstride, a.sc_bstride)
            self.smem = (V.smem_bytes_cp(part_size, a.block_size, a.gqa, a.head_dim,
                                         int(impl[2:]))
                         if impl.startswith("cp") else
                         V.smem_bytes_mma(part_size, a.block_size, a.gqa, a.head_dim))
        self.part = _kernel(a.device, name, self.fmt, self.smem)
        self.reduce = _kernel(a.device, f"pthfa_decode_reduce_{a.dtype}_d{a.head_dim}",
                              FMT_REDUCE)
        self.reduce_grid = (a.num_heads, a.num_seqs, 1)
        self.reduce_block = (a.head_dim, 1, 1)
        self.reduce_ints = (a.num_heads, part_size, max_parts)
        # cp3/cp4 can reduce in their last CTA of each (sequence, kv head): one launch. That
        # is for eager calls small enough to be bound by the host's launches; in a graph, or
        # past FUSE_BYTES, the reduce kernel (wide) costs less than the last CTAs' merge
        # (serial, holding an SM slot each): measured in results/2026-11-30-fused-reduce.md.
        cache_bytes = a.num_seqs * max_seq_len * a.num_kv_heads * (2 * a.head_dim + 8)
        self.counters = (a.num_seqs * a.num_kv_heads
                         if self.fmt == FMT_CP and cache_bytes <= FUSE_BYTES else 0)


    def thread_blocks(self) -> tuple[_ArgBlock, _ArgBlock]:
        """This thread's argument blocks of the two kernels, their fixed tails written."""
        tid = threading.get_ident()
        got = self.blocks.get(tid)
        if got is None:
            got = self.blocks[tid] = (_ArgBlock(self.fmt, self.part_ints),
                                      _ArgBlock(FMT_REDUCE, self.reduce_ints))
        return got


def _plan_for(sig: _Signature, max_seq_len: Any, part_size: Any, sm_scale: Any) -> Any:
    """decode's plan for these scalars: cached per bucket of max_seq_len when they are plain
    ints and floats in range; else made (the full checks name what is wrong)."""
    cap = sig.cap
    if (type(max_seq_len) is int and 0 <= max_seq_len <= cap
            and (part_size is None or type(part_size) is int)
            and (sm_scale is None or type(sm_scale) is float or type(sm_scale) is int)):
        key = (_bucket(max_seq_len, cap), part_size, sm_scale)
        p = sig.plans.get(key)
        if p is None:
            p = _DecodePlan(sig.args, key[0], part_size, sm_scale)
            if len(sig.plans) < 512:
                sig.plans[key] = p
        if part_size is None and sm_scale is None:
            sig.last = (max_seq_len, p)
        return p
    return _DecodePlan(sig.args, max_seq_len, part_size, sm_scale)


_THREADS3 = (V.THREADS, 1, 1)
FUSE_BYTES = 32 << 20  # K, V and scales a decode reads, at most, to reduce in its last CTAs


def decode(query: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
           block_tables: Any, seq_lens: Any, *, max_seq_len: int | None = None,
           sm_scale: float | None = None, out: Any = None, part_size: int | None = None) -> Any:
    """Decode attention: one query token per sequence over the paged int8 cache.

    query [num_seqs, num_heads, head_dim] bf16/fp16; block_tables [num_seqs, max_blocks]
    int32; seq_lens [num_seqs] int32 (0 gives a zero output row). ``max_seq_len`` bounds
    seq_lens (read from the device, one sync, when omitted). Returns ``out``
    [num_seqs, num_heads, head_dim], query's dtype.

    A repeat call with the same signature costs a dictionary lookup, the pointers and one
    driver launch (two past FUSE_BYTES): the checks and the plan are remembered.
    """
    sig = _checked(_DECODE_OK, V.check_decode, _decode_key, query, k_cache, v_cache, k_scale,
                   v_scale, block_tables, seq_lens, out)
    a = sig.args
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if a.num_seqs else 0
    last = sig.last
    if (last is not None and last[0] == max_seq_len and type(max_seq_len) is int
            and part_size is None and sm_scale is None):
        p = last[1]  # the same scalars as the call before (serving's common case)
    else:
        p = _plan_for(sig, max_seq_len, part_size, sm_scale)
    t = _T[0] if _T else _torch()
    if out is None:
        out = t.empty_like(query)
    if p.empty:
        return out
    dev = p.device
    stream = t.stream(dev)
    capturing = t.capturing()
    fused = p.counters and not capturing
    counters, work, _owner = _workspace(t, dev, stream, p.counters, p.work_bytes, capturing)
    part_ml = work + p.acc_bytes
    seq_ptr = seq_lens.data_ptr()
    drv = _DRIVER[0] if _DRIVER else _driver()
    if drv is not None and t.device() == dev:  # the hot path: prepacked driver launches
        blocks = p.blocks.get(threading.get_ident()) or p.thread_blocks()
        g = p.grid
        if fused:  # one launch: the partitions, reduced by the last CTA of each head
            blocks[0].pack_head(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                k_scale.data_ptr(), v_scale.data_ptr(),
                                block_tables.data_ptr(), a.bt_stride, seq_ptr, part_ml, work,
                                out.data_ptr(), counters)
            drv.launch(p.part.fn, g[0], g[1], g[2], p.threads, 1, 1, p.smem, stream,
                       blocks[0].address, 0)
            return out
        if max_seq_len > 0:
            head = (query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                    k_scale.data_ptr(), v_scale.data_ptr(), block_tables.data_ptr(),
                    a.bt_stride, seq_ptr, part_ml, work)
            if p.fmt == FMT_CP:  # null out and counters: the partitions only
                blocks[0].pack_head(*head, 0, 0)
            else:
                blocks[0].pack_head(*head)
            drv.launch(p.part.fn, g[0], g[1], g[2], p.threads, 1, 1, p.smem, stream,
                       blocks[0].address, 0)
        blocks[1].pack_head(part_ml, work, seq_ptr, out.data_ptr())
        g = p.reduce_grid
        drv.launch(p.reduce.fn, g[0], g[1], g[2], a.head_dim, 1, 1, 0, stream,
                   blocks[1].address, 0)
        return out
    head = (query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_scale.data_ptr(),
            v_scale.data_ptr(), block_tables.data_ptr(), a.bt_stride, seq_ptr, part_ml, work)
    if fused:
        p.part.run(t, stream, p.grid, (p.threads, 1, 1),
                   (*head, out.data_ptr(), counters, *p.part_ints), p.smem)
        return out
    if max_seq_len > 0:
        extra = (0, 0) if p.fmt == FMT_CP else ()
        p.part.run(t, stream, p.grid, (p.threads, 1, 1), (*head, *extra, *p.part_ints),
                   p.smem)
    p.reduce.run(t, stream, p.reduce_grid, p.reduce_block,
                 (part_ml, work, seq_ptr, out.data_ptr(), *p.reduce_ints), 0)
    return out

"""Load the cubin for the device and launch the kernels on torch tensors through CuPy."""

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
        f"with qwen38build.kernels.compile_arch(..., '{major}.{minor}', ...)"
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


# Per (device, kernel name): the RawKernel, and the largest dynamic shared memory set on it.
_FUNCS: dict[tuple[int, str], list[Any]] = {}
_RAW_STREAM: list[Any] = []


def _stream_ptr(device: int) -> int:
    """torch's current stream on ``device`` as a raw pointer, by the cheapest call there is."""
    if not _RAW_STREAM:
        import torch

        fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _RAW_STREAM.append(fast or (lambda d: torch.cuda.current_stream(d).cuda_stream))
    ptr: int = _RAW_STREAM[0](device)
    return ptr


class _Packed:
    """One kernel's argument block for the driver's launch, made once per kernel, argument
    types and thread: a ctypes value per argument and the array of their addresses, which is
    what ``cuLaunchKernel`` takes. A launch writes the values and passes the one address."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        import ctypes

        import numpy as np

        kinds: dict[Any, Any] = {np.uint64: ctypes.c_uint64, np.int64: ctypes.c_int64,
                                 np.int32: ctypes.c_int32, np.float32: ctypes.c_float}
        self.values: list[Any] = [kinds[type(a)]() for a in args]
        self.floats = [isinstance(v, ctypes.c_float) for v in self.values]
        self.pointers = (ctypes.c_void_p * len(args))(*(ctypes.addressof(v)
                                                         for v in self.values))
        self.address = ctypes.addressof(self.pointers)

    def fill(self, args: tuple[Any, ...]) -> int:
        for value, is_float, a in zip(self.values, self.floats, args, strict=True):
            value.value = float(a) if is_float else int(a)
        return self.address


_DRIVER: list[Any] = []  # [cuda.bindings.driver], or [None] where it is missing or failed
_PACKED: dict[tuple[Any, ...], _Packed] = {}


def _driver() -> Any:
    """The CUDA driver API through cuda-python, if installed (and not turned off with
    ``PTHFA_LAUNCH=cupy``); None otherwise, and the launches go through CuPy."""
    if not _DRIVER:
        _DRIVER.append(_import_driver() if os.environ.get("PTHFA_LAUNCH", "") != "cupy"
                       else None)
    return _DRIVER[0]


def _import_driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


def _launch_driver(driver: Any, fn: Any, grid: tuple[int, ...], block: tuple[int, ...],
                   args: tuple[Any, ...], shared_mem: int, stream: int) -> None:
    import threading

    key = (fn.ptr, threading.get_ident(), *map(type, args))
    packed = _PACKED.get(key)
    if packed is None:
        packed = _PACKED[key] = _Packed(args)
    g = (*grid, 1, 1)
    b = (*block, 1, 1)
    (err,) = driver.cuLaunchKernel(fn.ptr, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem,
                                   stream, packed.fill(args), 0)
    if int(err) != 0:
        raise RuntimeError(f"cuLaunchKernel failed: {err}")


def _launch(device: int, name: str, grid: tuple[int, ...], block: tuple[int, ...],
            args: tuple[Any, ...], shared_mem: int = 0) -> None:
    """Launch ``name`` on torch's current stream of ``device``.

    The kernel handle, its shared-memory attribute and the stream are cached. With
    cuda-python installed the launch is one ``cuLaunchKernel`` with a prepacked argument
    block; else CuPy's Function is called with the stream as an argument. No context
    managers on the hot path unless the current device is another one.
    """
    entry = _FUNCS.get((device, name))
    if entry is None:
        raw = _module(device).get_function(name)
        entry = _FUNCS[(device, name)] = [raw, V.SMEM_DEFAULT]
    raw = entry[0]
    if shared_mem > entry[1]:
        raw.max_dynamic_shared_size_bytes = max(raw.max_dynamic_shared_size_bytes, shared_mem)
        entry[1] = shared_mem
    import cupy

    fn = getattr(raw, "kernel", None)  # CuPy's Function (its ptr is the CUfunction)
    if fn is not None and cupy.cuda.runtime.getDevice() == device:
        ptr = _stream_ptr(device)
        driver = _driver()
        if driver is not None:
            try:
                _launch_driver(driver, fn, grid, block, args, shared_mem, ptr)
                return
            except (AttributeError, TypeError, KeyError):
                _DRIVER[0] = None  # this cuda-python speaks otherwise: CuPy from now on
        fn(grid, block, args, shared_mem, _cupy_stream(device, ptr))
        return
    with cupy.cuda.Device(device), _cupy_stream(device, _stream_ptr(device)):
        raw(grid, block, args, shared_mem=shared_mem)


IMPLS = ("simt", "mma1", "cp3", "cp4")
DEFAULT = "cp3"


def decode_impl(head_dim: int, part_size: int = 2048) -> str:
    """The partition kernel: $PTHFA_IMPL if set (one of IMPLS), else the pipelined
    tensor-core kernel cp3, which measured fastest on every benchmark shape on the H200
    (2026-11-29) once its partition size is chosen by ``choose_part_size_cp``."""
    impl = os.environ.get("PTHFA_IMPL", "")
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
    """:func:`plan`, remembered per arguments (and the two knobs it reads)."""
    key = (num_seqs, num_kv_heads, max_seq_len, block_size, gqa, head_dim, num_sms,
           os.environ.get("PTHFA_IMPL", ""), os.environ.get("PTHFA_PART_SIZE", ""))
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
    env_part = os.environ.get("PTHFA_PART_SIZE", "")
    if env_part:
        part = int(env_part)
        if part < 16 or part % 16 or part % block_size:
            raise ValueError(f"PTHFA_PART_SIZE must be a multiple of 16 and of block_size "
                             f"{block_size}, got {part}")
        return impl, part
    if impl.startswith("cp"):
        stages = int(impl[2:])
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


_DECODE_OK: dict[tuple[Any, ...], Any] = {}
_QUANTIZE_OK: dict[tuple[Any, ...], Any] = {}


def _checked(seen: dict[tuple[Any, ...], Any], check: Any, *tensors: Any) -> Any:
    """``check(*tensors)``, the full validation, once per signature (every tensor's shape,
    strides, dtype and device): a later call with the same signature passes what the full
    check passed, in O(1) per tensor. ``PTHFA_VALIDATE=always`` checks every call."""
    try:
        key = tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device)
                    for t in tensors)
        got = seen.get(key)
    except (AttributeError, TypeError):  # not tensors: the full check names what is wrong
        return check(*tensors)
    if got is None or os.environ.get("PTHFA_VALIDATE") == "always":
        got = check(*tensors)
        if len(seen) < 4096:
            seen[key] = got
    return got


def _ptr(t: Any) -> Any:
    import numpy as np

    return np.uint64(t.data_ptr())


def quantize_kv(key: Any, value: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
                slot_mapping: Any) -> None:
    """Quantize ``key``/``value`` [tokens, kv_heads, head_dim] into the paged int8 cache.

    Row ``slot_mapping[i]`` (= block * block_size + offset; negative skips the token) of the
    caches [num_blocks, block_size, kv_heads, head_dim] int8 gets token i, and the scales
    [num_blocks, block_size, kv_heads] fp32 get absmax / 127 of each (token, head) row.
    """
    import numpy as np

    a = _checked(_QUANTIZE_OK, V.check_quantize, key, value, k_cache, v_cache, k_scale,
                 v_scale, slot_mapping)
    if a.num_tokens == 0:
        return
    warps = 2 * a.num_tokens * a.num_kv_heads
    grid = (math.ceil(warps / V.WARPS),)
    _launch(a.device, f"pthfa_quantize_{a.dtype}_d{a.head_dim}", grid, (V.THREADS,), (
        _ptr(key), _ptr(value), _ptr(k_cache), _ptr(v_cache), _ptr(k_scale), _ptr(v_scale),
        _ptr(slot_mapping), np.int32(a.num_tokens), np.int32(a.num_kv_heads),
        np.int64(a.key_strides[0]), np.int64(a.key_strides[1]),
        np.int64(a.value_strides[0]), np.int64(a.value_strides[1]),
    ))


def decode(query: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
           block_tables: Any, seq_lens: Any, *, max_seq_len: int | None = None,
           sm_scale: float | None = None, out: Any = None, part_size: int | None = None) -> Any:
    """Decode attention: one query token per sequence over the paged int8 cache.

    query [num_seqs, num_heads, head_dim] bf16/fp16; block_tables [num_seqs, max_blocks]
    int32; seq_lens [num_seqs] int32 (0 gives a zero output row). ``max_seq_len`` bounds
    seq_lens (read from the device, one sync, when omitted). Returns ``out``
    [num_seqs, num_heads, head_dim], query's dtype.
    """
    import numpy as np
    import torch

    a = _checked(_DECODE_OK, V.check_decode, query, k_cache, v_cache, k_scale, v_scale,
                 block_tables, seq_lens, out)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if a.num_seqs else 0
    max_seq_len = V.check_max_seq_len(max_seq_len, a)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(a.head_dim)
    if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool):
        raise TypeError(f"sm_scale must be a float, got {type(sm_scale).__name__}")
    if out is None:
        out = torch.empty_like(query)
    if a.num_seqs == 0 or a.num_heads == 0:
        return out
    if part_size is None:
        impl, part_size = cached_plan(a.num_seqs, a.num_kv_heads, max_seq_len, a.block_size,
                                      a.gqa, a.head_dim, _num_sms(a.device))
    else:
        V.check_part_size(part_size, a.block_size, a.gqa, a.head_dim)
        impl = decode_impl(a.head_dim, part_size)
    max_parts = max(1, math.ceil(max_seq_len / part_size))
    # One allocation for both partial buffers (the allocator's call is a cost per launch);
    # the accumulators first, so both start 256-byte aligned (head_dim >= 64 floats a row).
    rows = a.num_seqs * a.num_heads * max_parts
    work = torch.empty(rows * (a.head_dim + 2), dtype=torch.float32, device=query.device)
    part_acc = work[: rows * a.head_dim]
    part_ml = work[rows * a.head_dim :]
    block_shift = a.block_size.bit_length() - 1
    if max_seq_len > 0:
        if impl == "simt":
            _launch(
                a.device, f"pthfa_decode_part_{a.dtype}_d{a.head_dim}_g{a.gqa}",
                (max_parts, a.num_kv_heads, a.num_seqs), (V.THREADS,),
                (_ptr(query), _ptr(k_cache), _ptr(v_cache), _ptr(k_scale), _ptr(v_scale),
                 _ptr(block_tables), np.int32(a.bt_stride), _ptr(seq_lens), _ptr(part_ml),
                 _ptr(part_acc), np.int32(a.num_kv_heads), np.int32(block_shift),
                 np.int32(part_size), np.int32(max_parts),
                 np.float32(float(sm_scale) * math.log2(math.e))),
                shared_mem=V.smem_bytes(part_size, a.block_size, a.gqa, a.head_dim),
            )
        else:
            _launch(
                a.device, f"pthfa_decode_{impl}_{a.dtype}_d{a.head_dim}",
                (max_parts, a.num_kv_heads, a.num_seqs), (V.THREADS,),
                (_ptr(query), _ptr(k_cache), _ptr(v_cache), _ptr(k_scale), _ptr(v_scale),
                 _ptr(block_tables), np.int32(a.bt_stride), _ptr(seq_lens), _ptr(part_ml),
                 _ptr(part_acc), np.int32(a.num_kv_heads), np.int32(a.gqa),
                 np.int32(block_shift), np.int32(part_size), np.int32(max_parts),
                 np.float32(float(sm_scale) * math.log2(math.e))),
                shared_mem=(V.smem_bytes_cp(part_size, a.block_size, a.gqa, a.head_dim,
                                            int(impl[2:]))
                            if impl.startswith("cp") else
                            V.smem_bytes_mma(part_size, a.block_size, a.gqa, a.head_dim)),
            )
    _launch(
        a.device, f"pthfa_decode_reduce_{a.dtype}_d{a.head_dim}", (a.num_heads, a.num_seqs),
        (a.head_dim,),
        (_ptr(part_ml), _ptr(part_acc), _ptr(seq_lens), _ptr(out), np.int32(a.num_heads),
         np.int32(part_size), np.int32(max_parts)),
    )
    return out

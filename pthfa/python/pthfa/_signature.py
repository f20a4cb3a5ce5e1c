"""The full validation of a call, run once per signature (every tensor's shape,
strides, dtype and device) and remembered with the plans made for it."""

from __future__ import annotations

from typing import Any

from ._knobs import _KNOBS, knobs


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

"""pthfa: int8 per-token-head paged KV cache kernels (quantize + flash-decoding attention).

The kernels ship as one cubin per CUDA arch under ``pthfa/cubins/``; they are loaded with
CuPy's RawModule and launched on torch tensors (by ``data_ptr()``, on torch's current stream)
through the CUDA driver. torch and CuPy are imported on first launch only, so argument checks
work without them. The PTHFA_* knobs are read at the first call; ``reload_env()`` re-reads them.
"""

from __future__ import annotations

from ._cubins import cubin_dir, find_cubin
from ._ops import decode, quantize_kv, reload_env

__version__ = "0.1.0"
__all__ = ["__version__", "cubin_dir", "decode", "find_cubin", "quantize_kv", "reload_env"]

"""vLLM's ``vllm.general_plugins`` entry point of the pthfa wheel (``entry_points.txt``).

vLLM calls :func:`register` once per process (front end, engine core, workers) before it
selects attention backends. It adds ``AttentionBackendEnum.PTHFA``, so that
``--attention-backend PTHFA`` names it and ``PTH_FA=1`` can put it first (the series'
``pthfa-backend-select`` row). Nothing of vLLM is imported until vLLM calls it.
"""

from __future__ import annotations

BACKEND_PATH = "pthfa.vllm_backend.PthfaBackend"


def register() -> None:
    """Register the PTHFA attention backend; a second call (vLLM loads plugins per process,
    tests may load them again) changes nothing."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from .vllm_backend import NAME

    if NAME in AttentionBackendEnum.__members__:
        return
    register_backend(NAME, BACKEND_PATH)

"""vllm-pr50021-gdn-spec-bounds: an accepted-token count outside the request's own row gives
zero output rows and no state write in the spec-decode kernels, instead of a step run from
another request's state.

The kernels are Triton: on CPU only Triton's interpreter can run them, and only the
causal-conv update runs there (the delta-rule and selective-state-update kernels loop over a
typed length argument the interpreter cannot take). This test runs vLLM's own
``causal_conv1d_update`` of the pristine and the patched tree on the same inputs
(tests/patches/_gdn_bounds.py) under ``TRITON_INTERPRET=1`` where Triton is installed, and is
skipped, saying so, where it is not. All four kernels on a GPU:
tests/gpu/test_vllm_pr50021_gdn_spec_bounds_gpu.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.gpu import vllm_tree

from . import _gdn_bounds as gb

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    pytest.skip("a GPU is present: tests/gpu/test_vllm_pr50021_gdn_spec_bounds_gpu.py runs "
                "the kernels there", allow_module_level=True)
if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed: its interpreter runs the kernel",
                allow_module_level=True)
# Triton reads it as it sets itself up: before the first import of Triton (this process
# has no GPU, so no other test needs compiled Triton kernels)
os.environ["TRITON_INTERPRET"] = "1"


def _run(tree: Path, monkeypatch: pytest.MonkeyPatch) -> gb.Run:
    mod = gb.load(tree, "causal_conv1d", vllm_tree.import_from_tree, vllm_tree.kernel_stubs())
    return gb.run_causal_conv1d(mod, "cpu")


def test_patched_causal_conv1d_bounds(patched_vllm: Path, pristine_vllm: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gb.compare("causal_conv1d", _run(pristine_vllm, monkeypatch),
               _run(patched_vllm, monkeypatch))


def test_pristine_runs_invalid_requests(pristine_vllm: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(pristine_vllm, monkeypatch)
    with pytest.raises(AssertionError, match="not zeroed"):
        gb.compare("causal_conv1d", run, run)

"""vllm-pr50021-gdn-spec-bounds on a GPU (marker ``gpu``).

vLLM's own four spec-decode kernels (the delta-rule ``fused_recurrent`` and
``fused_sigmoid_gating`` kernels, ``causal_conv1d_update`` and ``selective_state_update``),
loaded by harness H from the pristine and the patched tree and run on the same inputs
(tests/patches/_gdn_bounds.py: accepted counts 2, 5, 0, 4 over four-slot rows): after the
patch the invalid requests' output rows are exactly 0 and their state slots untouched, and
the valid requests' rows and states are bit for bit those of the pristine kernels; on the
pristine tree the invalid requests are computed from another request's state. Kernel time on
valid inputs, pristine and patched, is reported. Not shown here: the compiled MTP op, and a
compute-sanitizer run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu import vllm_tree
from tests.patches import _gdn_bounds as gb

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton.testing  # noqa: E402


def _module(tree: Path, kernel: str) -> Any:
    return gb.load(tree, kernel, vllm_tree.import_from_tree, vllm_tree.kernel_stubs())


@pytest.mark.parametrize("kernel", list(gb.RUNS))
def test_invalid_counts_zero_valid_unchanged(kernel: str, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    pristine, patched = vllm_tree.trees()
    mods = {"pristine": _module(pristine, kernel), "patched": _module(patched, kernel)}
    runs = {label: gb.RUNS[kernel](mod, "cuda") for label, mod in mods.items()}
    torch.cuda.synchronize()
    gb.compare(kernel, runs["pristine"], runs["patched"])
    with pytest.raises(AssertionError):
        gb.compare(kernel, runs["pristine"], runs["pristine"])
    # time on valid inputs only (every request accepts 2)
    monkeypatch.setattr(gb, "ACCEPTED", [2, 2, 2, 2])
    times = {label: triton.testing.do_bench(lambda mod=mod: gb.RUNS[kernel](mod, "cuda"))
             for label, mod in mods.items()}
    vllm_tree.record_line(f"pr50021 {kernel}: invalid requests {sorted(gb.INVALID[kernel])} zero and "
                 "their states untouched, valid ones bit for bit as pristine; pristine "
                 "computes the invalid ones from another request's state. Call time on valid "
                 f"inputs (inputs made in the call): pristine {times['pristine'] * 1e3:.1f} us, "
                 f"patched {times['patched'] * 1e3:.1f} us")

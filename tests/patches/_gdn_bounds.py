"""The four spec-decode kernels vllm-pr50021-gdn-spec-bounds bounds, driven the same way for
the pristine and the patched tree (harness H, real Triton; on a GPU, or on CPU under
``TRITON_INTERPRET=1``): four requests of four tokens each whose accepted counts are valid
(2 and 4) or not (0 and 5, past a four-slot row), varlen, state slots 1..16 (0 is the null
block). Batches are not varlen (Triton's interpreter cannot loop over a loaded length); the
index load and the exit under test are the same code either way. Each ``run_*`` returns the
output rows per request and the state tensors after and before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# (output rows per request, states after, states before)
Run = tuple[list[Any], dict[str, Any], dict[str, Any]]
ACCEPTED = [2, 5, 0, 4]
N, T = 4, 4
MODULES = {
    "fused_recurrent": "vllm.third_party.flash_linear_attention.ops.fused_recurrent",
    "fused_sigmoid_gating": "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating",
    "causal_conv1d": "vllm.model_executor.layers.mamba.ops.causal_conv1d",
    "mamba_ssm": "vllm.model_executor.layers.mamba.ops.mamba_ssm",
}
# the requests each kernel's bound rejects (selective_state_update clamps 0 to slot 0 of
# the request's own row, which stays valid)
INVALID = {"fused_recurrent": {1, 2}, "fused_sigmoid_gating": {1, 2},
           "causal_conv1d": {1, 2}, "mamba_ssm": {1}}


def load(tree: Path, kernel: str, importer: Callable[..., Any], stubs: dict[str, Any]) -> Any:
    return importer(tree, MODULES[kernel], stubs)


def _gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _common(device: str) -> dict[str, Any]:
    i32 = torch.int32
    return {"cu": torch.arange(0, N * T + 1, T, dtype=i32, device=device),
            "idx": torch.arange(1, N * T + 1, dtype=i32, device=device).reshape(N, T),
            "acc": torch.tensor(ACCEPTED, dtype=i32, device=device)}


def _delta_inputs(device: str) -> dict[str, Any]:
    g = _gen(device, 0)
    H, HV, K, V = 2, 4, 16, 16
    return {"q": torch.randn(N, T, H, K, generator=g, device=device),
            "k": torch.randn(N, T, H, K, generator=g, device=device),
            "v": torch.randn(N, T, HV, V, generator=g, device=device),
            "state": torch.randn(N * T + 1, HV, V, K, generator=g, device=device),
            "HV": HV, "K": K, "V": V}


def run_fused_recurrent(mod: Any, device: str) -> Run:
    c, d = _common(device), _delta_inputs(device)
    g = _gen(device, 1)
    gate = -torch.rand(N, T, d["HV"], generator=g, device=device) * 0.2
    beta = torch.rand(N, T, d["HV"], generator=g, device=device)
    state = d["state"].clone()
    o, _ = mod.fused_recurrent_gated_delta_rule_fwd(
        d["q"], d["k"], d["v"], gate, beta, d["K"] ** -0.5, state,
        inplace_final_state=True, ssm_state_indices=c["idx"],
        num_accepted_tokens=c["acc"], use_qk_l2norm_in_kernel=True)
    # the wrappers return o squeezed to [N, T, HV, V]
    return [o[r] for r in range(N)], {"state": state}, {"state": d["state"]}


def run_fused_sigmoid_gating(mod: Any, device: str) -> Run:
    c, d = _common(device), _delta_inputs(device)
    g = _gen(device, 2)
    HV = d["HV"]
    state = d["state"].clone()
    o, _ = mod.fused_sigmoid_gating_delta_rule_update(
        A_log=torch.randn(HV, generator=g, device=device) * 0.1,
        a=torch.randn(N, T, HV, generator=g, device=device),
        b=torch.randn(N, T, HV, generator=g, device=device),
        dt_bias=torch.randn(HV, generator=g, device=device) * 0.1,
        q=d["q"], k=d["k"], v=d["v"], scale=d["K"] ** -0.5, initial_state=state,
        inplace_final_state=True, ssm_state_indices=c["idx"],
        num_accepted_tokens=c["acc"], use_qk_l2norm_in_kernel=True)
    # the wrappers return o squeezed to [N, T, HV, V]
    return [o[r] for r in range(N)], {"state": state}, {"state": d["state"]}


def run_causal_conv1d(mod: Any, device: str) -> Run:
    g = _gen(device, 3)
    dim, width = 64, 4
    x = torch.randn(N, dim, T, generator=g, device=device)
    conv_state = torch.randn(N + 1, dim, width - 1 + T - 1, generator=g, device=device)
    out = torch.full_like(x, float("nan"))
    before = conv_state.clone()
    mod.causal_conv1d_update(
        x, conv_state, torch.randn(dim, width, generator=g, device=device),
        bias=torch.randn(dim, generator=g, device=device), activation="silu",
        conv_state_indices=torch.arange(1, N + 1, dtype=torch.int32, device=device),
        num_accepted_tokens=_common(device)["acc"], out=out)
    return [out[r] for r in range(N)], {"conv_state": conv_state}, {"conv_state": before}


def run_mamba_ssm(mod: Any, device: str) -> Run:
    c = _common(device)
    g = _gen(device, 4)
    nheads, dim, dstate = 2, 16, 16
    # one token per request (not varlen); the index row still has T slots
    state = torch.randn(N * T + 1, nheads, dim, dstate, generator=g, device=device)
    x = torch.randn(N, nheads, dim, generator=g, device=device)
    out = torch.full_like(x, float("nan"))
    before = state.clone()
    mod.selective_state_update(
        state, x, torch.rand(N, nheads, dim, generator=g, device=device) * 0.1,
        -torch.rand(nheads, dim, dstate, generator=g, device=device),
        torch.randn(N, 1, dstate, generator=g, device=device),
        torch.randn(N, 1, dstate, generator=g, device=device),
        torch.randn(nheads, dim, generator=g, device=device),
        torch.zeros(nheads, dim, device=device), dt_softplus=True,
        state_batch_indices=c["idx"], out=out, num_accepted_tokens=c["acc"])
    return [out[r] for r in range(N)], {"state": state}, {"state": before}


RUNS = {"fused_recurrent": run_fused_recurrent,
        "fused_sigmoid_gating": run_fused_sigmoid_gating,
        "causal_conv1d": run_causal_conv1d, "mamba_ssm": run_mamba_ssm}


def state_rows(kernel: str, request: int) -> list[int]:
    """The state slots (or conv-state lines) a request owns."""
    if kernel == "causal_conv1d":
        return [request + 1]
    return list(range(request * T + 1, request * T + T + 1))


def compare(kernel: str, pristine: Run, patched: Run) -> None:
    """Patched: invalid requests' rows exactly 0 and their state untouched; valid requests
    bit for bit as pristine (rows and state)."""
    rows_p, states_p, _ = pristine
    rows, states, before = patched
    for r in range(N):
        if r in INVALID[kernel]:
            assert bool((rows[r] == 0).all()), f"{kernel}: request {r} not zeroed"
            for name, tensor in states.items():
                for slot in state_rows(kernel, r):
                    assert torch.equal(tensor[slot], before[name][slot]), (kernel, r, slot)
        else:
            assert torch.equal(rows[r], rows_p[r]), f"{kernel}: valid request {r} changed"
            for name, tensor in states.items():
                for slot in state_rows(kernel, r):
                    assert torch.equal(tensor[slot], states_p[name][slot]), (kernel, r)

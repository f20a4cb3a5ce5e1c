"""bench-probe-errors: `vllm bench serve`'s /tokenize alignment probe sends the API key
(Bearer from OPENAI_API_KEY, --header wins) and says why it failed (404, 401, unreachable,
timeout); the /metrics scrapes send the benchmark's headers. Driven against a real local
aiohttp server."""

from __future__ import annotations

import asyncio
import inspect
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ._fakes import bench_stubs
from ._helpers import assert_pristine_lacks, load_with_auto_stubs, make_module

pytestmark = pytest.mark.e2e

KEY = "sk-bench"
METRICS = (
    "# HELP vllm:spec_decode_num_drafts_total drafts\n"
    "vllm:spec_decode_num_drafts_total{model_name=\"m\"} 10\n"
    "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 30\n"
    "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 20\n"
)


@dataclass
class SampleRequest:
    prompt: Any
    prompt_len: int
    expected_output_len: int = 8
    multi_modal_data: Any = None
    request_overrides: Any = None
    chat_messages: Any = None


class _ScrapesSeen(Exception):
    """Stops benchmark() once both of its "before" /metrics scrapes have run."""


def _load(tree: Path) -> Any:
    erf = load_with_auto_stubs(tree / "benchmarks/lib/endpoint_request_func.py", bench_stubs())
    stubs = bench_stubs()
    stubs.update({
        "vllm.benchmarks.lib.endpoint_request_func": erf,
        "vllm.benchmarks.datasets": make_module(
            "d", SampleRequest=SampleRequest, add_dataset_parser=None, get_samples=None),
    })
    return load_with_auto_stubs(tree / "benchmarks/serve.py", stubs,
                                prefixes=("vllm", "numpy"))


def _app(seen: list[dict[str, str]]) -> web.Application:
    def authorized(request: web.Request) -> bool:
        seen.append(dict(request.headers))
        return request.headers.get("Authorization") == f"Bearer {KEY}"

    async def tokenize(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        if body["model"] != "m":
            return web.json_response({"error": "no such model"}, status=404)
        return web.json_response({"tokens": list(range(len(body["prompt"])))})

    async def detokenize(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        return web.json_response({"prompt": "x" * len(body["tokens"])})

    async def metrics(request: web.Request) -> web.Response:
        if not authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.Response(text=METRICS)

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/metrics", metrics)
    return app


async def _with_server(fn: Any) -> Any:
    seen: list[dict[str, str]] = []
    runner = web.AppRunner(_app(seen))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        return await fn(f"http://127.0.0.1:{port}", seen)
    finally:
        await runner.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_probe(tree: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    serve = _load(tree)
    reqs = [SampleRequest("abcdefgh", 5), SampleRequest("abcdefghij", 5)]

    async def align(base: str, model: str = "m", headers: dict[str, str] | None = None) -> Any:
        kwargs = {"headers": headers} if headers is not None else {}
        return await serve._align_prompts_to_server_tokenizer(
            base, model, list(reqs), None, **kwargs)

    # Key from OPENAI_API_KEY: the probe authenticates and re-aligns the prompts.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = asyncio.run(_with_server(lambda base, seen: align(base)))
    assert [r.prompt for r in out] == ["xxxxx", "xxxxx"], "probe did not authenticate"
    # --header wins over OPENAI_API_KEY.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-stale")
    out = asyncio.run(_with_server(
        lambda base, seen: align(base, headers={"Authorization": f"Bearer {KEY}"})))
    assert [r.prompt for r in out] == ["xxxxx", "xxxxx"], "--header did not win"

    # No key: the warning says 401 and how to fix it, and the prompts are unchanged.
    monkeypatch.delenv("OPENAI_API_KEY")
    capsys.readouterr()
    out = asyncio.run(_with_server(lambda base, seen: align(base)))
    assert out == reqs
    msg = capsys.readouterr().out
    assert "401" in msg and "OPENAI_API_KEY" in msg, msg
    # Wrong model name (or no route): 404, said so.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = asyncio.run(_with_server(lambda base, seen: align(base, model="other")))
    msg = capsys.readouterr().out
    assert out == reqs and "404" in msg and "model name" in msg, msg
    # Nothing listening: unreachable.
    out = asyncio.run(align(f"http://127.0.0.1:{_free_port()}"))
    msg = capsys.readouterr().out
    assert out == reqs and "unreachable" in msg, msg
    # A timeout is named as such.
    describe = serve._describe_probe_failure
    assert "timed out" in describe("http://h/tokenize", TimeoutError())


def _check_metrics(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve = _load(tree)
    for fetch in (serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics):
        assert "headers" in inspect.signature(fetch).parameters, fetch.__name__
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def scrape(base: str, seen: list[dict[str, str]]) -> Any:
        async with aiohttp.ClientSession() as session:
            without = await serve.fetch_spec_decode_metrics(base, session)
            with_key = await serve.fetch_spec_decode_metrics(
                base, session, {"Authorization": f"Bearer {KEY}"})
            return without, with_key

    without, with_key = asyncio.run(_with_server(scrape))
    assert without is None
    assert with_key is not None and with_key.num_drafts == 10


def _benchmark_scrapes(tree: Path, monkeypatch: pytest.MonkeyPatch,
                       extra_headers: dict[str, str] | None) -> list[tuple[str, Any, Any]]:
    """Run vLLM's benchmark() against the local server up to its first two /metrics
    scrapes (the real fetch functions, recorded on the way): (name, headers, result)."""
    serve = _load(tree)
    calls: list[tuple[str, Any, Any]] = []
    real_spec, real_diffusion = serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics

    async def spec(base: str, session: Any, *args: Any, **kwargs: Any) -> Any:
        result = await real_spec(base, session, *args, **kwargs)
        calls.append(("spec_decode", (args, kwargs), result))
        return result

    async def diffusion(base: str, session: Any, *args: Any, **kwargs: Any) -> Any:
        result = await real_diffusion(base, session, *args, **kwargs)
        calls.append(("diffusion", (args, kwargs), result))
        await session.close()  # benchmark() stops here; close what it opened
        raise _ScrapesSeen

    monkeypatch.setattr(serve, "fetch_spec_decode_metrics", spec)
    monkeypatch.setattr(serve, "fetch_diffusion_metrics", diffusion)

    async def run(base: str, seen: list[dict[str, str]]) -> None:
        with pytest.raises(_ScrapesSeen):
            await serve.benchmark(
                task_type=None, endpoint_type="openai", api_url=f"{base}/v1/completions",
                base_url=base, model_id="m", model_name="m", tokenizer=None,
                input_requests=[SampleRequest("abcdefgh", 5)], logprobs=None,
                request_rate=float("inf"), burstiness=1.0, disable_tqdm=True,
                num_warmups=0, profile=False, selected_percentile_metrics=[],
                selected_percentiles=[], ignore_eos=False, goodput_config_dict={},
                max_concurrency=None, lora_modules=None, extra_headers=extra_headers,
                extra_body=None, ready_check_timeout_sec=0)

    asyncio.run(_with_server(run))
    return calls


def _check_benchmark_wiring(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmark() sends its scrapes the Bearer key of OPENAI_API_KEY, --header winning."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    calls = _benchmark_scrapes(tree, monkeypatch, None)
    assert [name for name, _, _ in calls] == ["spec_decode", "diffusion"]
    spec_result = calls[0][2]
    assert spec_result is not None and spec_result.num_drafts == 10, "scrape not authorized"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-stale")
    calls = _benchmark_scrapes(tree, monkeypatch, {"Authorization": f"Bearer {KEY}"})
    assert calls[0][2] is not None and calls[0][2].num_drafts == 10, "--header did not win"


def test_patched_probe_sends_key_and_classifies(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _check_probe(patched_vllm, monkeypatch, capsys)


def test_patched_metrics_scrapes_send_headers(patched_vllm: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _check_metrics(patched_vllm, monkeypatch)


def test_patched_benchmark_scrapes_with_key(patched_vllm: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _check_benchmark_wiring(patched_vllm, monkeypatch)


def test_pristine_benchmark_scrapes_without_key(pristine_vllm: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_benchmark_wiring(pristine_vllm, monkeypatch))


def test_pristine_lacks_probe_auth(pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert_pristine_lacks(lambda: _check_probe(pristine_vllm, monkeypatch, capsys))
    assert_pristine_lacks(lambda: _check_metrics(pristine_vllm, monkeypatch))

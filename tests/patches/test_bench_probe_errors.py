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
    # benchmark() builds the scrape headers from OPENAI_API_KEY and --header.
    src = inspect.getsource(serve.benchmark)
    assert src.count("metrics_headers") >= 5


def test_patched_probe_sends_key_and_classifies(
        patched_vllm: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _check_probe(patched_vllm, monkeypatch, capsys)


def test_patched_metrics_scrapes_send_headers(patched_vllm: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _check_metrics(patched_vllm, monkeypatch)


def test_pristine_lacks_probe_auth(pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert_pristine_lacks(lambda: _check_probe(pristine_vllm, monkeypatch, capsys))
    assert_pristine_lacks(lambda: _check_metrics(pristine_vllm, monkeypatch))

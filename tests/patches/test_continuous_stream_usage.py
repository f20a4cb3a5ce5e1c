"""continuous-stream-usage: with stream_options.continuous_usage_stats, a step whose delta
the parser buffers (parse_delta returns None) still streams a chunk carrying the usage;
without continuous usage, buffered steps are still skipped.

Drives vLLM's own OpenAIServingChat.chat_completion_stream_generator (and its own
should_include_usage) with a fake engine output stream and a parser that buffers its
first deltas, as a tool or reasoning parser does. The response models are small
stand-ins that serialise what the generator sets."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, load_with_auto_stubs, make_module
from ._responses import ResponseModel

pytestmark = pytest.mark.e2e

PROMPT = [1, 2, 3, 4]


_Model = ResponseModel


class DeltaMessage(_Model):
    def __init__(self, **fields: Any) -> None:
        super().__init__(**{"role": None, "content": None, "reasoning": None,
                            "tool_calls": [], **fields})


def _models(*names: str) -> dict[str, type[_Model]]:
    return {name: type(name, (_Model,), {}) for name in names}


class GenerationError(Exception):
    pass


class _BufferingParser:
    """Buffers (returns None for) the first ``hold`` deltas, then releases them."""

    def __init__(self, delta_cls: type[_Model], hold: int) -> None:
        self.delta_cls, self.hold, self.buffer = delta_cls, hold, ""

    def parse_delta(self, delta_text: str, delta_token_ids: list[int], request: Any,
                    prompt_token_ids: Any, finished: bool) -> Any:
        self.buffer += delta_text
        self.hold -= 1
        if self.hold >= 0 and not finished:
            return None
        out, self.buffer = self.buffer, ""
        return self.delta_cls(content=out)


def _generator_module(tree: Path) -> Any:
    api_utils = load_with_auto_stubs(tree / "entrypoints/serve/utils/api_utils.py", {
        "vllm.logger": make_module("vllm.logger", init_logger=logging.getLogger,
                                   current_formatter_type=lambda: None)},
        prefixes=("vllm", "orjson"))  # 0.33.0 encodes with orjson (not installed here)
    base_protocol = make_module(
        "vllm.entrypoints.generate.base.protocol",
        DeltaMessage=DeltaMessage,
        **_models("FunctionCall", "PerRequestMetrics",
                  "RequestResponseMetadata", "ToolCall"))
    chat_protocol = make_module(
        "vllm.entrypoints.openai.chat_completion.protocol",
        **_models("ChatCompletionLogProb", "ChatCompletionLogProbs",
                  "ChatCompletionLogProbsContent", "ChatCompletionNamedToolChoiceParam",
                  "ChatCompletionRequest", "ChatCompletionResponse",
                  "ChatCompletionResponseChoice", "ChatCompletionResponseStreamChoice",
                  "ChatCompletionStreamResponse", "ChatMessage"))
    engine_protocol = make_module(
        "vllm.entrypoints.serve.engine.protocol",
        **_models("CompletionTokenUsageInfo", "ErrorResponse", "PromptProgressInfo",
                  "PromptTokenUsageInfo", "UsageInfo"))

    class GenerateBaseServing:
        pass

    modules = {
            "vllm.entrypoints.generate.base.protocol": base_protocol,
            "vllm.entrypoints.generate.base.serving": make_module(
                "vllm.entrypoints.generate.base.serving",
                GenerateBaseServing=GenerateBaseServing,
                build_per_request_timing_metrics=lambda metrics, n: None,
                build_spec_decoding_metrics=lambda res: None,
                chat_top_logprobs_limit=lambda top, return_all: top,  # 0.33.0's
                clamp_prompt_logprobs=lambda x: x,
                format_token_id_placeholder=str),
            "vllm.entrypoints.openai.chat_completion.protocol": chat_protocol,
            "vllm.entrypoints.serve.engine.protocol": engine_protocol,
            "vllm.entrypoints.serve.utils.api_utils": api_utils,
            "vllm.entrypoints.serve.utils.tool_calls_utils": make_module(
                "vllm.entrypoints.serve.utils.tool_calls_utils",
                maybe_filter_parallel_tool_calls=lambda choice, request: choice,
                # 0.33.0's
                resolve_finish_reason=lambda reason, request, calls: reason or "stop",
                keeps_tool_calls=lambda request, **kw: False),
            "vllm.exceptions": make_module("vllm.exceptions",
                                           GenerationError=GenerationError),
            "vllm.utils.collection_utils": make_module("vllm.utils.collection_utils",
                                                       as_list=list),
    }
    processor = tree / "entrypoints/openai/chat_completion/stream_processor.py"
    if processor.exists():  # 0.33.0 turns each choice's chunks into deltas there
        name = "vllm.entrypoints.openai.chat_completion.stream_processor"
        modules[name] = load_with_auto_stubs(processor, modules)
    return load_with_auto_stubs(tree / "entrypoints/openai/chat_completion/serving.py",
                                modules)


def _stream(tree: Path, continuous: bool, include_usage: bool = True) -> list[Any]:
    """Run the generator over four one-token steps, the parser holding the first two."""
    module = _generator_module(tree)
    delta_cls = module.DeltaMessage
    serving = module.OpenAIServingChat.__new__(module.OpenAIServingChat)

    def unexpected_error(e: Exception) -> str:
        raise AssertionError(f"the generator reported an error: {e!r}")

    serving.__dict__.update(
        parser_cls=_BufferingParser, enable_force_include_usage=False,
        _include_reasoning_tokens_details=False, enable_log_outputs=False,
        request_logger=None, system_fingerprint=None, enable_prompt_tokens_details=False,
        enable_per_request_metrics=False,
        _make_parser=lambda request, tokenizer, kwargs: _BufferingParser(delta_cls, 2),
        get_chat_request_role=lambda request: "assistant",
        _raise_if_error=lambda finish_reason, request_id: None,
        create_streaming_error_response=unexpected_error,
        # 0.33.0's
        enable_auto_tools=False, create_error_response=unexpected_error,
    )
    request = SimpleNamespace(
        n=1, tool_choice="auto", echo=False, logprobs=False, include_reasoning=True,
        return_token_ids=False, return_prompt_text=False,
        return_weight_versions=False,  # 0.33.0's
        stream_options=SimpleNamespace(include_usage=include_usage,
                                       continuous_usage_stats=continuous))

    async def engine() -> AsyncIterator[Any]:
        texts = ["<tool", "_call>", "{}", "</tool_call>"]
        for step, text in enumerate(texts):
            last = step == len(texts) - 1
            yield SimpleNamespace(
                prompt_token_ids=PROMPT, encoder_prompt_token_ids=None,
                num_cached_tokens=0, num_cache_creation_tokens=None, prompt=None,
                metrics=None, prompt_progress=None, kv_transfer_params=None,
                outputs=[SimpleNamespace(index=0, text=text, token_ids=[10 + step],
                                         logprobs=None, stop_reason=None,
                                         finish_reason="stop" if last else None)])

    async def collect() -> list[Any]:
        out = []
        async for line in serving.chat_completion_stream_generator(
                request, engine(), "req-1", "qwen", [], object(), SimpleNamespace()):
            assert line.startswith("data: ") and line.endswith("\n\n"), line
            payload = line[len("data: "):].strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out

    return asyncio.run(collect())


def _usage(chunk: dict[str, Any]) -> int | None:
    usage = chunk.get("usage")
    return None if usage is None else int(usage["completion_tokens"])


def _check(tree: Path) -> None:
    chunks = _stream(tree, continuous=True)
    assert chunks[-1] == "[DONE]"
    body = [c for c in chunks[:-1] if c.get("choices")]
    # The role chunk, then one chunk per engine step: the two buffered steps
    # included, each with the usage of the tokens generated so far.
    assert [_usage(c) for c in body] == [0, 1, 2, 3, 4], body
    buffered = body[1:3]
    for chunk in buffered:
        assert chunk["choices"][0]["finish_reason"] is None
        assert chunk["usage"]["prompt_tokens"] == len(PROMPT)
    assert body[3]["choices"][0]["delta"]["content"] == "<tool_call>{}"
    assert chunks[-2]["usage"]["completion_tokens"] == 4  # the final usage chunk


def _check_plain_usage_unchanged(tree: Path) -> None:
    # Without continuous usage the buffered steps send nothing, as before.
    chunks = _stream(tree, continuous=False)
    body = [c for c in chunks[:-1] if c.get("choices")]
    assert len(body) == 3 and all("usage" not in c for c in body)
    assert chunks[-2]["usage"]["completion_tokens"] == 4
    assert len([c for c in _stream(tree, continuous=False, include_usage=False)
                if c != "[DONE]"]) == 3


def test_patched_buffered_steps_carry_usage(patched_vllm: Path) -> None:
    _check(patched_vllm)
    _check_plain_usage_unchanged(patched_vllm)


def test_pristine_drops_usage_while_buffering(pristine_vllm: Path) -> None:
    _check_plain_usage_unchanged(pristine_vllm)
    assert_pristine_lacks(lambda: _check(pristine_vllm))

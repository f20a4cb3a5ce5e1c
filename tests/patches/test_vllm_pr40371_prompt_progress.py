"""vllm-pr40371-prompt-progress: with ``return_progress`` on a streaming chat or completion
request, the stream carries chunks with no choices and a ``prompt_progress`` object
(total, cache, processed, time_ms) while the prompt prefills, before the first token;
without it, nothing changes and the engine sends nothing extra.

Each layer runs vLLM's own code on the CPU:
- the requests' ``to_sampling_params`` (chat and completion) into the real SamplingParams;
- the real Scheduler's ``_update_after_schedule`` and ``update_from_output`` over a real
  Request, step by step through a chunked prefill with a prefix-cache hit (synchronous
  and asynchronous scheduling, and a recompute after preemption);
- the EngineCoreOutputs that scheduler makes, through the real OutputProcessor (its
  RequestState, RequestOutputCollector, IterationStats, detokenizer and parallel
  sampling);
- the real streaming generators of serving chat and completions over a fake engine
  stream (vLLM's own usage and progress models; the response models are small
  stand-ins that serialise what they are given);
- all of it chained: a chat request's to_sampling_params, the scheduler, the output
  processor, then the chat generator.

The model's forward pass is not run: update_from_output gets the sampled tokens a step
would give. How the chunks are paced against a real GPU prefill is not tested here."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    LooseAutoStub,
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
)
from ._responses import ResponseModel

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")
pytest.importorskip("msgspec")

PROMPT = 100  # prompt tokens
CACHED = 20  # of them from the prefix cache: 16 local, 4 external
CHUNKS = (30, 30, 20)  # the chunked prefill; the last chunk samples the first token
ARRIVAL = 1_000_000.0  # the request's arrival, wall clock


# --- vLLM's modules, from one tree --------------------------------------------------------


@cache
def _vllm(tree: Path) -> SimpleNamespace:
    """The engine side of ``tree``: sampling params, engine core messages, request,
    scheduler, outputs and output processor, wired to each other (their other vLLM
    imports stand in)."""
    logger = once_logger_module()
    envs = load_envs(tree)
    serial = LooseAutoStub("vllm.v1.serial_utils")
    # A plain mixin: msgspec's metaclass takes no placeholder base.
    serial.__dict__["PydanticMsgspecMixin"] = type("PydanticMsgspecMixin", (), {})
    utils = make_module("vllm.utils", length_from_prompt_token_ids_or_embeds=(
        lambda ids, embeds: len(ids) if ids is not None else len(embeds)))
    mods: dict[str, ModuleType] = {
        "vllm.logger": logger, "vllm.envs": envs, "vllm": make_module("vllm", envs=envs),
        "vllm.v1.serial_utils": serial, "vllm.utils": utils}

    def load(name: str, rel: str, **extra: ModuleType) -> ModuleType:
        mods[name] = load_with_auto_stubs(tree / rel, {**mods, **extra}, loose=True)
        return mods[name]

    ns = SimpleNamespace()
    ns.stats = load("vllm.v1.metrics.stats", "v1/metrics/stats.py")
    ns.sp = load("vllm.sampling_params", "sampling_params.py")
    ns.engine = load("vllm.v1.engine", "v1/engine/__init__.py")
    ns.request = load(
        "vllm.v1.request", "v1/request.py",
        **{"vllm.v1.utils": make_module("vllm.v1.utils", ConstantList=lambda x: x),
           "vllm.v1.structured_output.request": make_module(
               "vllm.v1.structured_output.request",
               StructuredOutputRequest=SimpleNamespace(from_sampling_params=lambda p: None))})
    load("vllm.v1.core.sched.utils", "v1/core/sched/utils.py")
    ns.scheduler = load("vllm.v1.core.sched.scheduler", "v1/core/sched/scheduler.py")
    ns.outputs = load("vllm.outputs", "outputs.py")
    load("vllm.v1.engine.detokenizer", "v1/engine/detokenizer.py")
    load("vllm.v1.engine.logprobs", "v1/engine/logprobs.py")
    ns.parallel = load("vllm.v1.engine.parallel_sampling", "v1/engine/parallel_sampling.py")
    ns.processor = load("vllm.v1.engine.output_processor", "v1/engine/output_processor.py")
    return ns


def _params(v: SimpleNamespace, progress: bool, **kw: Any) -> Any:
    """SamplingParams asking for progress. Set as an attribute (SamplingParams keeps a
    __dict__), so a tree without the field runs the same request."""
    params = v.sp.SamplingParams(max_tokens=3, **kw)
    params.return_progress = progress
    return params


# --- the scheduler ------------------------------------------------------------------------


class _Steps:
    """One request through the real Scheduler: each step is scheduled
    (_update_after_schedule, as schedule() ends) and its model output handed to
    update_from_output, as EngineCore.step does."""

    def __init__(self, v: SimpleNamespace, progress: bool, params: Any = None) -> None:
        self.v = v
        self.request = v.request.Request(
            "r1", list(range(PROMPT)), params or _params(v, progress), None,
            arrival_time=time.time())
        sched = v.scheduler.Scheduler.__new__(v.scheduler.Scheduler)
        sched.__dict__.update(
            requests={"r1": self.request}, running=[self.request], defer_block_free=False,
            perf_metrics=None, num_sampled_tokens_per_step=1, aux_output_connector=None,
            return_sampling_mask=False, is_mm_encoder_only=False, max_model_len=1024,
            structured_output_manager=SimpleNamespace(accept_tokens=lambda r, ids: True),
            kv_cache_manager=SimpleNamespace(estimate_cached_tokens=lambda r: CACHED,
                                             take_events=lambda: None),
            grammar_compile_error_reqs=set(), encoder_cache_mismatch_reqs=set(),
            recompute_kv_load_failures=True, ec_connector=None, connector=None,
            finished_req_ids_dict=None, sched_step_seq=0, _inflight_prefills=set(),
            finished_req_ids=set(), reset_preempted_req_ids=set(),
            make_stats=lambda *args, **kwargs: None,
            num_spec_tokens=0)  # read by 0.33.0's update_from_output: no drafts here
        self.sched = sched
        # What schedule() does when it admits the request with a prefix-cache hit.
        self.request.status = v.request.RequestStatus.RUNNING
        self.request.num_computed_tokens = CACHED
        assert self.request.prefill_stats is not None
        self.request.prefill_stats.set(num_prompt_tokens=PROMPT, num_local_cached_tokens=16,
                                       num_external_cached_tokens=4)

    def schedule(self, num_tokens: int) -> Any:
        out = SimpleNamespace(
            num_scheduled_tokens={"r1": num_tokens}, total_num_scheduled_tokens=num_tokens,
            scheduled_spec_decode_tokens={}, num_invalid_spec_tokens=None,
            has_structured_output_requests=False)
        self.sched._update_after_schedule(out)
        return out

    def finish(self, scheduled: Any, token: int | None) -> list[Any]:
        """The step's EngineCoreOutputs (``token``: what the step sampled, if anything)."""
        runner = SimpleNamespace(
            sampled_token_ids=[[token] if token is not None else []], logprobs=None,
            prompt_logprobs_dict={}, prompt_token_id_logprobs_dict={}, pooler_output=None,
            num_nans_in_logits=None, kv_connector_output=None, ec_connector_output=None,
            cudagraph_stats=None, req_id_to_index={"r1": 0}, sampling_masks=None,
            aux_output_connector_output=None)
        outs = self.sched.update_from_output(scheduled, runner)
        return [o for eco in outs.values() for o in eco.outputs]

    def step(self, num_tokens: int, token: int | None) -> list[Any]:
        return self.finish(self.schedule(num_tokens), token)

    def prefill(self) -> list[list[Any]]:
        """The chunked prefill, then one decode step: the outputs of each step."""
        tokens = [None] * (len(CHUNKS) - 1) + [7]
        return [self.step(n, t) for n, t in zip(CHUNKS, tokens, strict=True)] + [
            self.step(1, 8)]


def _progress(out: Any) -> tuple[int, int] | None:
    """(computed, cached) of a progress output; None for any other output."""
    computed = getattr(out, "num_computed_tokens", None)
    return None if computed is None else (computed, out.num_cached_prompt_tokens)


def _check_scheduler(tree: Path) -> None:
    v = _vllm(tree)
    steps = _Steps(v, progress=True).prefill()
    assert [len(s) for s in steps] == [1, 1, 1, 1], steps
    first, second, token, decode = (s[0] for s in steps)
    # While the prompt prefills: no tokens, the prompt tokens computed so far (the
    # cached ones included) and the cache hit, no finish, no events or stats taken.
    assert first.new_token_ids == [] and _progress(first) == (50, CACHED)
    assert second.new_token_ids == [] and _progress(second) == (80, CACHED)
    assert first.finish_reason is None and first.prefill_stats is None
    # The step that samples the first token is the ordinary output, prefill stats and all.
    assert token.new_token_ids == [7] and _progress(token) is None
    assert token.prefill_stats is not None and token.prefill_stats.num_cached_tokens == CACHED
    assert decode.new_token_ids == [8] and _progress(decode) is None


def _check_scheduler_async(tree: Path) -> None:
    # Async scheduling: the next chunk is scheduled before this one's output comes
    # back; the tokens still in flight are not counted as processed.
    v = _vllm(tree)
    run = _Steps(v, progress=True)
    s1 = run.schedule(30)
    s2 = run.schedule(30)
    assert [_progress(o) for o in run.finish(s1, None)] == [(50, CACHED)]
    s3 = run.schedule(20)
    assert [_progress(o) for o in run.finish(s2, None)] == [(80, CACHED)]
    assert [o.new_token_ids for o in run.finish(s3, 7)] == [[7]]


def _check_recompute_silent(tree: Path) -> None:
    # A recompute after preemption, with tokens already sampled, is not reported.
    v = _vllm(tree)
    run = _Steps(v, progress=True)
    run.prefill()
    run.request.num_computed_tokens = 0
    assert run.step(30, None) == []


def _check_scheduler_off(tree: Path) -> None:
    # Without return_progress the scheduler sends nothing extra.
    steps = _Steps(_vllm(tree), progress=False).prefill()
    assert [[o.new_token_ids for o in s] for s in steps] == [[], [], [[7]], [[8]]]


def test_patched_scheduler_reports_prefill_progress(patched_vllm: Path) -> None:
    _check_scheduler(patched_vllm)
    _check_scheduler_async(patched_vllm)
    _check_recompute_silent(patched_vllm)
    _check_scheduler_off(patched_vllm)


def test_pristine_scheduler_reports_no_progress(pristine_vllm: Path) -> None:
    _check_scheduler_off(pristine_vllm)
    assert_pristine_lacks(lambda: _check_scheduler(pristine_vllm))


# --- the output processor -----------------------------------------------------------------


class _Frontend:
    """The real OutputProcessor with one request, fed the scheduler's outputs."""

    def __init__(self, v: SimpleNamespace, *, stream: bool = True, n: int = 1,
                 params: Any = None) -> None:
        self.v = v
        kind = v.sp.RequestOutputKind.DELTA if stream else v.sp.RequestOutputKind.FINAL_ONLY
        params = params or _params(v, True, n=n, output_kind=kind)
        self.arrival = ARRIVAL
        self.processor = v.processor.OutputProcessor(None, log_stats=True)
        self.queue = v.processor.RequestOutputCollector(kind, "ext-1")
        request = v.engine.EngineCoreRequest(
            request_id="r1", prompt_token_ids=list(range(PROMPT)), mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=self.arrival,
            lora_request=None, cache_salt=None, data_parallel_rank=None,
            external_req_id="ext-1")
        parent = None
        if n > 1:
            # As AsyncLLM.add_request fans out n samples: this is the first child.
            parent = v.parallel.ParentRequest(request)
            request.request_id, request.sampling_params = parent.get_child_info(0)
        self.rid = request.request_id
        self.processor.add_request(request, None, parent, 0, self.queue)
        self.stats: list[Any] = []

    def feed(self, outputs: list[Any]) -> None:
        for out in outputs:
            out.request_id = self.rid
        stats = self.v.stats.IterationStats()
        self.stats.append(stats)
        result = self.processor.process_outputs(outputs, time.monotonic(), stats)
        assert result.reqs_to_abort == []

    @property
    def state(self) -> Any:
        return self.processor.request_states[self.rid]


@contextmanager
def _wall_clock(v: SimpleNamespace, now: float) -> Iterator[None]:
    """The output processor's ``time.time()`` reads ``now`` (its module's ``time``
    swapped; the rest of the time module as it is)."""
    module = v.processor.__dict__
    saved = module.get("time")
    module["time"] = SimpleNamespace(time=lambda: now, monotonic=time.monotonic)
    try:
        yield
    finally:
        if saved is None:
            module.pop("time")
        else:
            module["time"] = saved


def _check_output_processor(tree: Path) -> None:
    v = _vllm(tree)
    steps = _Steps(v, progress=True).prefill()
    front = _Frontend(v)
    with _wall_clock(v, ARRIVAL + 1.25):
        front.feed(steps[0])
    out = front.queue.get_nowait()
    assert out is not None and out.outputs == [] and not out.finished
    progress = out.prompt_progress
    assert (progress.total, progress.cache, progress.processed) == (PROMPT, CACHED, 50)
    assert progress.time_ms == 1250  # the clock reads 1.25 s after arrival
    assert out.request_id == "ext-1"
    # A progress output is no first token: no TTFT, the prefill goes on.
    assert front.stats[0].time_to_first_tokens_iter == []
    assert front.state.is_prefilling and front.state.num_cached_tokens == 0
    # An unconsumed progress output is replaced by the next: a newer progress, then the
    # first token (with its own cache count and TTFT, and no progress).
    front.feed(steps[1])
    front.feed(steps[2])
    out = front.queue.get_nowait()
    assert out is not None and out.prompt_progress is None
    assert [list(o.token_ids) for o in out.outputs] == [[7]]
    assert out.num_cached_tokens == CACHED
    assert len(front.stats[2].time_to_first_tokens_iter) == 1
    assert not front.state.is_prefilling
    front.feed(steps[3])
    out = front.queue.get_nowait()
    assert out is not None and [list(o.token_ids) for o in out.outputs] == [[8]]


def _check_output_processor_quiet(tree: Path) -> None:
    # Not streaming (FINAL_ONLY), or one of n > 1 samples: no progress output.
    v = _vllm(tree)
    for front in (_Frontend(v, stream=False), _Frontend(v, n=2)):
        steps = _Steps(v, progress=True).prefill()
        front.feed(steps[0])
        front.feed(steps[1])
        assert front.queue.get_nowait() is None
        assert front.state.is_prefilling


def test_patched_output_processor_carries_progress(patched_vllm: Path) -> None:
    _check_output_processor(patched_vllm)
    _check_output_processor_quiet(patched_vllm)


def test_pristine_output_processor_carries_no_progress(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_output_processor(pristine_vllm))


# --- the requests -------------------------------------------------------------------------


def _request_fields(stream: bool, progress: bool) -> SimpleNamespace:
    """The fields to_sampling_params reads, as a request with defaults has them."""
    return SimpleNamespace(
        _DEFAULT_SAMPLING_PARAMS={}, allowed_token_ids=None, bad_words=None,
        ec_transfer_params=None, echo=False, extract_structured_outputs=lambda: None,
        ignore_eos=False, include_stop_str_in_output=False, kv_transfer_params=None,
        logit_bias=None, logprob_token_ids=None, logprobs=None, max_tokens=16, min_tokens=0,
        n=1, prompt_logprobs=None, repetition_detection=None, routed_experts_prompt_start=0,
        seed=None, skip_special_tokens=True, spaces_between_special_tokens=True, stop=[],
        stop_token_ids=None, stream=stream, stream_interval=None, thinking_token_budget=None,
        top_logprobs=0, vllm_xargs=None, watermarking=None, return_progress=progress)


CHAT_PROTOCOL = ("entrypoints/openai/chat_completion/protocol.py",
                 "ChatCompletionRequest.to_sampling_params")
COMPLETION_PROTOCOL = ("entrypoints/openai/completion/protocol.py",
                       "CompletionRequest.to_sampling_params")


def _to_params(tree: Path, where: tuple[str, str]) -> Any:
    """The request's own to_sampling_params, over the tree's real SamplingParams."""
    v = _vllm(tree)
    namespace = {"SamplingParams": v.sp.SamplingParams,
                 "RequestOutputKind": v.sp.RequestOutputKind, "Any": Any}
    return exec_function(tree / where[0], where[1], namespace)


def _check_requests(tree: Path) -> None:
    v = _vllm(tree)
    assert getattr(v.sp.SamplingParams(), "return_progress", None) is False
    for where in (CHAT_PROTOCOL, COMPLETION_PROTOCOL):
        qualname = where[1]
        to_params = _to_params(tree, where)
        seen = {}
        for stream in (True, False):
            for progress in (True, False):
                params = to_params(_request_fields(stream, progress), 16, {})
                seen[stream, progress] = getattr(params, "return_progress", None)
        # Only a streaming request that asks for it.
        assert seen == {(True, True): True, (True, False): False, (False, True): False,
                        (False, False): False}, (qualname, seen)


def test_patched_requests_opt_in(patched_vllm: Path) -> None:
    _check_requests(patched_vllm)


def test_pristine_requests_have_no_opt_in(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_requests(pristine_vllm))


# --- the streaming generators -------------------------------------------------------------


_Model = ResponseModel


def _models(*names: str) -> dict[str, type[_Model]]:
    return {name: type(name, (_Model,), {}) for name in names}


class GenerationError(Exception):
    pass


def _serving_modules(tree: Path) -> dict[str, ModuleType]:
    """The modules both serving files import: vLLM's own usage and progress models
    (pydantic), the response models as stand-ins."""
    engine_protocol = load_with_auto_stubs(
        tree / "entrypoints/serve/engine/protocol.py",
        {"vllm.utils": make_module("vllm.utils", random_uuid=lambda: "0")})
    api_utils = load_with_auto_stubs(tree / "entrypoints/serve/utils/api_utils.py", {
        "vllm.logger": make_module("vllm.logger", init_logger=logging.getLogger,
                                   current_formatter_type=lambda: None)},
        prefixes=("vllm", "orjson"))  # 0.33.0 encodes with orjson (not installed here)

    class GenerateBaseServing:
        pass

    return {
        "vllm.entrypoints.generate.base.protocol": make_module(
            "vllm.entrypoints.generate.base.protocol",
            **_models("DeltaMessage", "FunctionCall", "PerRequestMetrics",
                      "RequestResponseMetadata", "ToolCall")),
        "vllm.entrypoints.generate.base.serving": make_module(
            "vllm.entrypoints.generate.base.serving",
            GenerateBaseServing=GenerateBaseServing,
            build_per_request_timing_metrics=lambda metrics, n: None,
            build_spec_decoding_metrics=lambda res: None,
            clamp_prompt_logprobs=lambda x: x, format_token_id_placeholder=str,
            # 0.33.0's
            chat_top_logprobs_limit=lambda top, return_all: top,
            completion_top_logprobs_limit=lambda top, return_all: top),
        "vllm.entrypoints.openai.chat_completion.protocol": make_module(
            "vllm.entrypoints.openai.chat_completion.protocol",
            **_models("ChatCompletionLogProb", "ChatCompletionLogProbs",
                      "ChatCompletionLogProbsContent", "ChatCompletionNamedToolChoiceParam",
                      "ChatCompletionRequest", "ChatCompletionResponse",
                      "ChatCompletionResponseChoice", "ChatCompletionResponseStreamChoice",
                      "ChatCompletionStreamResponse", "ChatMessage")),
        "vllm.entrypoints.openai.completion.protocol": make_module(
            "vllm.entrypoints.openai.completion.protocol",
            **_models("CompletionLogProbs", "CompletionRequest", "CompletionResponse",
                      "CompletionResponseChoice", "CompletionResponseStreamChoice",
                      "CompletionStreamResponse")),
        "vllm.entrypoints.serve.engine.protocol": engine_protocol,
        "vllm.entrypoints.serve.utils.api_utils": api_utils,
        "vllm.entrypoints.serve.utils.tool_calls_utils": make_module(
            "vllm.entrypoints.serve.utils.tool_calls_utils",
            maybe_filter_parallel_tool_calls=lambda choice, request: choice,
            resolve_finish_reason=lambda reason, request, calls: reason or "stop",
            keeps_tool_calls=lambda request, **kw: False),
        "vllm.exceptions": make_module("vllm.exceptions", GenerationError=GenerationError,
                                       VLLMValidationError=ValueError),
        "vllm.utils.collection_utils": make_module("vllm.utils.collection_utils",
                                                   as_list=list),
    }


def _engine_outputs(progress: bool) -> list[Any]:
    """What AsyncLLM.generate yields for a 100-token prompt (20 cached) prefilled in three
    chunks: two progress outputs when asked for, then two one-token steps."""
    def output(token_ids: list[int], text: str, finish: str | None, cached: int | None,
               prompt_progress: Any = None) -> Any:
        outputs = [] if prompt_progress else [SimpleNamespace(
            index=0, text=text, token_ids=token_ids, logprobs=None, stop_reason=None,
            finish_reason=finish)]
        return SimpleNamespace(
            prompt_token_ids=list(range(PROMPT)), encoder_prompt_token_ids=None,
            num_cached_tokens=cached, num_cache_creation_tokens=None, prompt=None,
            metrics=None, outputs=outputs, prompt_progress=prompt_progress,
            prompt_logprobs=None, kv_transfer_params=None)  # the latter: read by 0.33.0

    out = []
    if progress:
        out += [output([], "", None, None, SimpleNamespace(
            total=PROMPT, cache=CACHED, processed=done, time_ms=5 * done))
                for done in (50, 80)]
    return [*out, output([7], "Hi", None, CACHED), output([8], "!", "stop", CACHED)]


def _collect(lines: AsyncIterator[str]) -> list[Any]:
    """The SSE payloads, parsed; the chunks' ``created`` second (the clock's) left out,
    so two runs compare equal."""
    async def run() -> list[Any]:
        out = []
        async for line in lines:
            assert line.startswith("data: ") and line.endswith("\n\n"), line
            payload = line[len("data: "):].strip()
            if payload == "[DONE]":
                out.append(payload)
                continue
            chunk = json.loads(payload)
            assert isinstance(chunk.pop("created"), int)
            out.append(chunk)
        return out
    return asyncio.run(run())


def _unexpected_error(e: Exception) -> str:
    raise AssertionError(f"the generator reported an error: {e!r}")


def _chat(tree: Path, asked: bool, engine_sends: bool) -> list[Any]:
    async def engine() -> AsyncIterator[Any]:
        for res in _engine_outputs(engine_sends):
            yield res

    return _chat_over(tree, asked, engine())


def _chat_over(tree: Path, asked: bool, engine: AsyncIterator[Any]) -> list[Any]:
    modules = _serving_modules(tree)
    processor = tree / "entrypoints/openai/chat_completion/stream_processor.py"
    if processor.exists():  # 0.33.0 turns each choice's chunks into deltas there
        name = "vllm.entrypoints.openai.chat_completion.stream_processor"
        modules[name] = load_with_auto_stubs(processor, modules)
    module = load_with_auto_stubs(tree / "entrypoints/openai/chat_completion/serving.py",
                                  modules)
    serving = module.OpenAIServingChat.__new__(module.OpenAIServingChat)
    serving.__dict__.update(
        parser_cls=None, enable_force_include_usage=False,
        _include_reasoning_tokens_details=False, enable_log_outputs=False,
        request_logger=None, system_fingerprint=None, enable_prompt_tokens_details=True,
        enable_per_request_metrics=False,
        get_chat_request_role=lambda request: "assistant",
        _raise_if_error=lambda finish_reason, request_id: None,
        create_streaming_error_response=_unexpected_error,
        # 0.33.0's
        enable_auto_tools=False, create_error_response=_unexpected_error)
    request = SimpleNamespace(
        n=1, tool_choice="auto", echo=False, logprobs=False, include_reasoning=True,
        return_token_ids=False, return_prompt_text=False, return_progress=asked,
        return_weight_versions=False,  # 0.33.0's
        stream_options=SimpleNamespace(include_usage=True, continuous_usage_stats=False))
    return _collect(serving.chat_completion_stream_generator(
        request, engine, "req-1", "qwen", [], object(), SimpleNamespace()))


def _completion(tree: Path, asked: bool, engine_sends: bool) -> list[Any]:
    module = load_with_auto_stubs(tree / "entrypoints/openai/completion/serving.py",
                                  _serving_modules(tree))
    serving = module.OpenAIServingCompletion.__new__(module.OpenAIServingCompletion)
    serving.__dict__.update(
        enable_force_include_usage=False, system_fingerprint=None,
        enable_prompt_tokens_details=True, enable_per_request_metrics=False,
        _extract_prompt_text=lambda engine_input: "the prompt",
        _raise_if_error=lambda finish_reason, request_id: None,
        create_streaming_error_response=_unexpected_error,
        enable_log_outputs=False, request_logger=None)  # 0.33.0's
    request = SimpleNamespace(
        n=1, echo=False, logprobs=None, max_tokens=16, return_token_ids=False,
        return_progress=asked, return_weight_versions=False,  # the latter: 0.33.0's
        stream_options=SimpleNamespace(include_usage=True, continuous_usage_stats=False))

    async def engine() -> AsyncIterator[tuple[int, Any]]:
        for res in _engine_outputs(engine_sends):
            yield 0, res

    return _collect(serving.completion_stream_generator(
        request, [SimpleNamespace()], engine(), "cmpl-1", 1234, "qwen", 1, None,
        SimpleNamespace()))


def _progress_chunks(chunks: list[Any]) -> list[dict[str, Any]]:
    return [c for c in chunks if c != "[DONE]" and "prompt_progress" in c]


def _check_stream(tree: Path, run: Any, first_choice: str) -> None:
    chunks = run(tree, True, True)
    assert chunks[-1] == "[DONE]"
    # The two progress chunks come first, with no choices.
    head, rest = chunks[:2], chunks[2:-1]
    assert _progress_chunks(chunks) == head, chunks
    assert [c["choices"] for c in head] == [[], []]
    assert [c["prompt_progress"] for c in head] == [
        {"total": PROMPT, "cache": CACHED, "processed": 50, "time_ms": 250},
        {"total": PROMPT, "cache": CACHED, "processed": 80, "time_ms": 400}]
    assert all(c["model"] == "qwen" and "id" in c for c in head)
    # Then the stream a request without progress gets, its usage counting the cache hit
    # of the first real output (not the progress output's).
    plain = run(tree, False, False)
    assert rest == plain[:-1]
    assert first_choice in json.dumps(rest[0]["choices"][0])
    assert rest[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == CACHED


def _check_chat_stream(tree: Path) -> None:
    _check_stream(tree, _chat, '"role": "assistant"')


def _check_completion_stream(tree: Path) -> None:
    _check_stream(tree, _completion, '"text": "Hi"')


def _check_not_asked(tree: Path, run: Any) -> None:
    # A request that did not ask gets no progress chunk, whatever reaches the generator.
    assert _progress_chunks(run(tree, False, True)) == []
    assert run(tree, False, True) == run(tree, False, False)


def test_patched_chat_stream_sends_progress_before_first_token(patched_vllm: Path) -> None:
    _check_chat_stream(patched_vllm)
    _check_not_asked(patched_vllm, _chat)


def test_patched_completion_stream_sends_progress_before_first_token(
        patched_vllm: Path) -> None:
    _check_completion_stream(patched_vllm)
    _check_not_asked(patched_vllm, _completion)


def _pipeline(tree: Path, asked: bool) -> list[Any]:
    """A streaming chat request end to end: its to_sampling_params, the scheduler through
    the chunked prefill, the output processor (its collector drained after each step, as
    the generate() task would be), then the chat streaming generator."""
    v = _vllm(tree)
    fields = _request_fields(stream=True, progress=asked)
    fields.max_tokens = 3
    params = _to_params(tree, CHAT_PROTOCOL)(fields, 3, {})
    front = _Frontend(v, params=params)
    results = []
    for outputs in _Steps(v, asked, params=params).prefill():
        front.feed(outputs)
        if (out := front.queue.get_nowait()) is not None:
            results.append(out)

    async def engine() -> AsyncIterator[Any]:
        for res in results:
            yield res

    return _chat_over(tree, asked, engine())


def _check_pipeline(tree: Path) -> None:
    chunks = _pipeline(tree, asked=True)
    progress = [c["prompt_progress"] for c in _progress_chunks(chunks)]
    assert [(p["total"], p["cache"], p["processed"]) for p in progress] == [
        (PROMPT, CACHED, 50), (PROMPT, CACHED, 80)], chunks
    assert chunks[:2] == _progress_chunks(chunks)
    assert chunks[2]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == CACHED
    assert chunks[2:] == _pipeline(tree, asked=False)


def test_patched_pipeline_streams_progress(patched_vllm: Path) -> None:
    _check_pipeline(patched_vllm)


def test_pristine_pipeline_streams_no_progress(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_pipeline(pristine_vllm))
    assert_pristine_lacks(lambda: _check_chat_stream(pristine_vllm))
    assert_pristine_lacks(lambda: _check_completion_stream(pristine_vllm))

"""continuous-stream-usage: with stream_options.continuous_usage_stats, a step whose delta a
tool parser buffers (parse_delta returns None) still streams a chunk carrying the usage;
without continuous usage, buffered steps are still skipped.

The chat streaming generator cannot run without the engine, so the test evaluates the
patched file's own skip condition (the `continue` guard under `if delta_message is None`
in chat_completion_stream_generator) for each combination of its inputs."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks

pytestmark = pytest.mark.e2e


def _skip_condition(tree: Path) -> Any:
    path = tree / "entrypoints/openai/chat_completion/serving.py"
    module = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(module) if isinstance(n, ast.AsyncFunctionDef)
              and n.name == "chat_completion_stream_generator")
    outer = [n for n in ast.walk(fn) if isinstance(n, ast.If)
             and ast.unparse(n.test) == "delta_message is None"]
    assert len(outer) == 1
    guard = next(n for n in outer[0].body if isinstance(n, ast.If)
                 and any(isinstance(s, ast.Continue) for s in n.body))
    code = compile(ast.Expression(guard.test), str(path), "eval")

    def skips(**names: Any) -> bool:
        env = {"include_continuous_usage": False, **names}
        return bool(eval(code, {}, env))

    return skips


def _check(tree: Path) -> None:
    skips = _skip_condition(tree)
    running = SimpleNamespace(finish_reason=None)
    plain = SimpleNamespace(return_token_ids=False)
    # Buffered delta, continuous usage on: a chunk must go out (with the usage).
    for hide in (False, True):
        assert not skips(output=running, logprobs=None, request=plain,
                         hide_stream_metadata=hide, include_continuous_usage=True), hide
    # Continuous usage off: the buffered step is still skipped, as before.
    assert skips(output=running, logprobs=None, request=plain, hide_stream_metadata=False,
                 include_continuous_usage=False)
    # The existing reasons to send a chunk are unchanged.
    for finish, lp, tok, usage in itertools.product((None, "stop"), (None, [1]),
                                                    (False, True), (False, True)):
        sent = finish is not None or lp is not None or tok or usage
        assert skips(output=SimpleNamespace(finish_reason=finish), logprobs=lp,
                     request=SimpleNamespace(return_token_ids=tok),
                     hide_stream_metadata=False, include_continuous_usage=usage) != sent


def test_patched_buffered_steps_carry_usage(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_drops_usage_while_buffering(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))

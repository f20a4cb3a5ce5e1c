"""why: which inputs of a step changed since its last build (bitbake-diffsigs, nix-diff).

Compares the step's derivation now with the one recorded when a step of the same name was
last built, and follows a changed dependency down to the input that moved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwen38build.store.records import Derivation

from qwen38build.engine.step import Step
from qwen38build.store.record import derivation_of, last_built
from qwen38build.store.store import Store


def explain(store: Store, step: Step) -> list[str]:
    if store.get(step.digest) is not None:
        return [f"{step.kind} {step.name} ({step.short}) is built; nothing changed."]
    last = last_built(store, step.name)
    if last is None:
        return [f"{step.kind} {step.name} ({step.short}) has never been built in this store."]
    lines = [f"{step.kind} {step.name}: was {last['digest'][:12]}, now {step.short}"]
    deps = {d.digest: d for _, d in step.deps}
    lines += _diff(store, step.derivation(), last["derivation"], deps)
    return lines


def _diff(
    store: Store, now: Derivation, was: Derivation, deps_now: dict[str, Step],
    indent: str = "  ",
) -> list[str]:
    out: list[str] = []
    impl_was, impl_now = was["implementation"], now["implementation"]
    if impl_now != impl_was:
        out.append(f"{indent}implementation of {now['kind']} changed: "
                   f"{_short(impl_was)} -> {_short(impl_now)}")
    for key in sorted(set(now["params"]) | set(was["params"])):
        a, b = was["params"].get(key), now["params"].get(key)
        if a != b:
            out.append(f"{indent}parameter {key}: {_short(a)} -> {_short(b)}")
    inputs_was, inputs_now = dict(was["inputs"]), dict(now["inputs"])
    for name, sha in inputs_now.items():
        if name not in inputs_was:
            out.append(f"{indent}input added: {name}")
        elif inputs_was[name] != sha:
            out.append(f"{indent}input changed: {name} ({inputs_was[name][:12]} -> {sha[:12]})")
    out += [f"{indent}input removed: {n}" for n in inputs_was if n not in inputs_now]
    deps_was = dict(was["deps"])
    for name, digest in now["deps"]:
        old = deps_was.get(name)
        if old == digest:
            continue
        out.append(f"{indent}dependency {name} changed: {str(old)[:12]} -> {digest[:12]}")
        dep_now = deps_now.get(digest)
        dep_was = derivation_of(store, old) if old else None
        if dep_now is not None and dep_was is not None:
            out += _diff(store, dep_now.derivation(), dep_was,
                         {d.digest: d for _, d in dep_now.deps}, indent + "  ")
    return out or [f"{indent}no recorded difference (the store entry was removed or changed)"]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."

"""Build records: each build's closure, kept in the store so it can be reproduced and
explained after the recipe has moved on; roots that gc keeps; per-step history for ``why``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, cast

from qwen38build.errors import StoreError, UsageError

if TYPE_CHECKING:
    from qwen38build.engine.executor import Outcome
    from qwen38build.engine.step import Step
    from qwen38build.store.records import BuildRecord, BuildStep, Derivation, HistoryRecord
    from qwen38build.store.store import Store

# 2: derivations hold ``implementation`` (a source hash), where 1 held a hand-bumped version.
RECORD_FORMAT = 2
HASH_RE = re.compile(r"[0-9a-f]{8,64}")


def write_build(store: Store, top: Step, outcomes: dict[str, Outcome], root_name: str,
                waived: list[str] | None = None, groups: list[str] | None = None) -> Path:
    """Record ``top``'s closure under builds/<hash>.json and make it the root ``root_name``;
    ``waived`` lists the lint findings the recipe's waivers let through, with the reasons;
    ``groups`` the series groups the build applied (None: it applied no series)."""
    from qwen38build.engine.step import closure
    from qwen38build.engine.tools import built_with

    steps: list[BuildStep] = []
    for s in closure(top):
        if s.digest not in outcomes:
            # A build input of a substituted step: not needed, so not fetched. Its
            # derivation is kept (reproduce rebuilds it); it has no outputs here.
            steps.append({"digest": s.digest, "derivation": s.derivation(), "tree": None,
                          "outputs": None})
            continue
        entry = outcomes[s.digest].entry
        step: BuildStep = {
            "digest": s.digest,
            "derivation": s.derivation(),
            "tree": entry.meta["tree"],
            "outputs": {k: v["sha256"] for k, v in entry.outputs.items()},
        }
        if outcomes[s.digest].built:  # the machine's programs that made it, this time
            step["built_with"] = built_with(s.kind)
        steps.append(step)
        store.write_json(store.root / "history" / f"{_safe(s.name)}.json",
                         {"digest": s.digest, "derivation": s.derivation()})
    for s in closure(top):
        for name, path in s.input_paths.items():
            sha = dict(s.inputs)[name]
            if store.source(sha) is None:
                store.add_source(path)
    path = store.builds / f"{top.digest}.json"
    rec: BuildRecord = {"format": RECORD_FORMAT, "build": top.digest, "steps": steps,
                        "waived": list(waived or [])}
    if groups is not None:
        rec["groups"] = list(groups)
    store.write_json(path, rec)
    store.write_json(store.roots / f"{_safe(root_name)}.json", {"build": top.digest})
    return path


def check_build_hash(value: str) -> str:
    """``value`` if it is a build hash or a prefix of one: 8 to 64 lowercase hex digits.

    Never a glob and never a path: it is compared with the names in ``builds/`` only.
    """
    if not HASH_RE.fullmatch(value):
        raise UsageError(
            f"command line: {value!r} is not a build hash (8 to 64 lowercase hex digits).",
            hint="give a build hash printed by `qwen38build build`",
        )
    return value


def read_build(store: Store, build_hash: str) -> BuildRecord:
    """The record of a build, by its full hash or an unambiguous prefix (8+ hex digits).

    The prefix is matched against the listing of ``builds/`` as plain text: no glob, no path.
    """
    check_build_hash(build_hash)
    try:
        names = [n for n in os.listdir(store.builds) if n.endswith(".json")]
    except FileNotFoundError:
        names = []
    except OSError as exc:
        from qwen38build.errors import from_os_error

        raise from_os_error(exc, "listing the build records") from None
    matches = sorted(n for n in names if n.startswith(build_hash)
                     and HASH_RE.fullmatch(n[: -len(".json")]))
    if not matches:
        raise UsageError(
            f"no build {build_hash!r} is recorded in the store {store.root}.",
            hint="give a build hash printed by `qwen38build build`",
        )
    if len(matches) > 1:
        raise UsageError(f"build hash prefix {build_hash!r} is ambiguous; give more characters.")
    path = store.builds / matches[0]
    try:
        data = json.loads(path.read_bytes())
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list) \
                or data.get("build") != matches[0][: -len(".json")]:
            raise ValueError("not a build record of this hash")
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable build record: {exc}.",
                         hint="remove it, and rebuild or reproduce that build") from None
    return cast("BuildRecord", data)


def roots(store: Store, problems: list[str] | None = None) -> dict[str, str]:
    """The named gc roots: name → build hash. The one reader of ``roots/``: a malformed
    root is skipped, and said in ``problems`` when given (gc names it)."""
    out: dict[str, str] = {}
    if not store.roots.is_dir():
        return out
    for p in sorted(store.roots.glob("*.json")):
        try:
            build = json.loads(p.read_bytes())["build"]
            if not isinstance(build, str):
                raise TypeError("build is not a string")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if problems is not None:
                problems.append(f"{p}: malformed root ({exc}); ignored")
            continue
        out[p.stem] = build
    return out


def last_built(store: Store, name: str) -> HistoryRecord | None:
    """The last recorded build of step ``name``; None if never built or the file is torn."""
    p = store.root / "history" / f"{_safe(name)}.json"
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("derivation"), dict) and \
        isinstance(data.get("digest"), str)
    return cast("HistoryRecord", data) if ok else None


def derivation_of(store: Store, digest: str) -> Derivation | None:
    entry = store.lookup(digest)
    return entry.derivation if entry is not None else None


def steps_from_record(record: BuildRecord) -> list[Step]:
    """Rebuild the Step objects of a recorded closure; digests must come out the same."""
    from qwen38build.engine.step import Step

    if record.get("format") != RECORD_FORMAT:
        raise UsageError(
            f"build {str(record.get('build'))[:12]} was recorded by an older qwen38build "
            f"(record format {record.get('format')}, this one reads {RECORD_FORMAT}); its "
            "steps' code is not this code, so rebuilding it here would prove nothing.",
            hint="reproduce it with the qwen38build release that built it",
        )
    by_digest: dict[str, Step] = {}
    out = []
    for rec in record["steps"]:
        drv = rec["derivation"]
        step = Step(
            kind=drv["kind"], implementation=drv["implementation"], name=drv["name"],
            params=drv["params"],
            inputs=tuple((k, v) for k, v in drv["inputs"]),
            deps=tuple((k, by_digest[d]) for k, d in drv["deps"]),
        )
        if step.digest != rec["digest"]:
            raise UsageError(f"the record of {drv['name']} does not hash to its digest.")
        by_digest[step.digest] = step
        out.append(step)
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in name)

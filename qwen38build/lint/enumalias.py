"""The enum-alias rule: a member a patch adds to an enum must not take a value the enum has.

In a Python ``Enum`` (``IntEnum``, ``IntFlag``, ...) a second name bound to a value already
taken is no member of its own: it becomes an alias of the first (``KVQuantMode.KVARN is
KVQuantMode.ULTRAQUANT_4BIT``), silently, and every ``match``, dict key and ``==`` then
treats the two as one. vLLM 0.32.0 gave 11 to ``ULTRAQUANT_4BIT`` (#57057), the value the
KVarN group's ``KVQuantMode.KVARN`` had: the reason that member moved to 100. This rule
reads each enum class of a file a patch touches, before and after the patch (as the earlier
patches leave it, on the pinned wheel), and flags every member the patch adds whose value
another member of the same class holds.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

from qwen38build.lint.finding import Context, Finding
from qwen38build.series.diff import Hunk
from qwen38build.series.patchfile import PatchFile

RULE = "enum-alias"
# The enum base classes whose duplicate values alias (by the name they are written with).
ENUM_BASES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag", "ReprEnum"})
Members = dict[str, dict[str, tuple[object, int]]]  # class → member → (value, line)


def enum_aliases(
    ctx: Context, pf: PatchFile, before: dict[str, bytes | None] | None,
    after: dict[str, bytes | None] | None,
) -> Iterator[Finding]:
    """``before``/``after``: the touched files just before and after ``pf`` applied (None
    when unknown: the pristine wheel was not read, or the patch did not apply)."""
    if before is None or after is None:
        return
    for fd in pf.files:
        rel = fd.new_path
        if rel is None or not rel.endswith(".py"):
            continue
        new = enum_members(after.get(rel))
        old = enum_members(before.get(rel))
        for cls, members in new.items():
            had = old.get(cls, {})
            for name, (value, line) in members.items():
                if name in had:
                    continue
                # The member written later is the alias; two the patch adds are said once.
                same = [(o, ln) for o, (v, ln) in members.items() if o != name and _same(v, value)]
                first = next((o for o, ln in same if ln < line), None)
                later = next((o for o, ln in same if ln > line and o in had), None)
                if first is None and later is None:
                    continue
                alias, member = (name, first) if first is not None else (later, name)
                yield ctx.finding(
                    pf.path, _added_line(fd.hunks, name), RULE,
                    f"{rel}: {cls}.{alias} = {value!r} takes the value of {cls}.{member}; in "
                    f"an enum that makes {alias} an alias of {member}, not a member of its "
                    "own.",
                    f"give {cls}.{name} a value no member of {cls} has (upstream's own "
                    "values grow from the bottom: pick one well clear of them), and re-export",
                )


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


def enum_members(data: bytes | None) -> Members:
    """Each enum class of a module (by dotted name inside the module) and its members whose
    value is a literal; an unparsable or absent file has none."""
    if data is None:
        return {}
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return {}
    out: Members = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                if any(_base_name(b) in ENUM_BASES for b in child.bases):
                    out[name] = _members(child)
                visit(child, f"{name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _members(cls: ast.ClassDef) -> dict[str, tuple[object, int]]:
    members: dict[str, tuple[object, int]] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if not isinstance(target, ast.Name) or target.id.startswith("_"):
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue  # auto(), a call, a name: not a value this rule can compare
        members.setdefault(target.id, (literal, stmt.lineno))
    return members


def _added_line(hunks: Sequence[Hunk], name: str) -> int:
    """The patch file's line adding ``name = ...``, or the first hunk's."""
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*[:=]")
    first = 1
    for h in hunks:
        for line, text in h.added():
            first = first if first > 1 else line
            if pattern.match(text):
                return line
    return first

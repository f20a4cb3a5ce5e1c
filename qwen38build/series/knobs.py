"""Every environment read a patch adds, read from code: the env-knob rule's evidence.

The ledger's rule is about every variable a patch makes vLLM read, however it is spelled.
So each touched Python file of the patched tree is parsed with :mod:`ast`, and every read
of the process environment found in it, in any of these forms (the module or function
imported under any alias):

- ``os.environ[NAME]``, ``os.environ.get/setdefault/pop(NAME)``, ``NAME in os.environ``,
  also through ``from os import environ``, a name bound to ``os.environ``, or a copy of it
  (``os.environ.copy()``, ``dict(os.environ)``);
- ``os.getenv(NAME)``, also as ``from os import getenv``;
- ``envs.NAME``, ``vllm.envs.NAME``, ``envs.is_set(NAME)``, ``from vllm.envs import NAME``.

Each read is attributed to the patch whose added lines hold it (the line with the name,
else the first added line of the expression); reads on pristine lines are vLLM's own.
Writes (``os.environ[X] = ...``, ``del``) are not reads. A read whose name is computed
cannot be checked and is not reported.

Without the pristine wheel (or for a file that does not parse, or a patch that does not
apply) each hunk's new side (added and context lines) is read instead, and the reads whose
name stands on an added line kept: by :mod:`ast` where the side, or a run of added lines,
parses on its own, and by patterns that span line breaks.
"""

from __future__ import annotations

import ast
import bisect
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass

from qwen38build.series.diff import FileDiff, Hunk
from qwen38build.series.knobtext import Read, reads_in_text
from qwen38build.series.lineage import Lineage, Origin
from qwen38build.series.patchfile import PatchFile

PACKAGE = "vllm"
_ENVIRON_METHODS = ("get", "setdefault", "pop")
_KNOB_ATTR_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_BINDS_RE = re.compile(  # a name bound to os, os.environ, os.getenv or vllm.envs
    r"(?:\bimport\s+(?:os|vllm\.envs)\s+as\s+|\b(?:environ|getenv|envs)\s+as\s+)(?P<as>\w+)"
    r"|^\s*(?P<as2>\w+)\s*(?::[^=]*)?=\s*(?:dict\()?\s*\w+\.(?:environ|getenv)\b",
    re.M,
)


@dataclass(frozen=True)
class KnobRead:
    """A read a patch adds: the patch's series index, the file (package-relative), the line
    in the patch file, the variable and how it was read."""

    patch: int
    file: str
    patch_line: int
    name: str
    form: str


# -- reading a source text ----------------------------------------------------------------


class _Visitor:
    """Collects reads; aliases are bound as the module binds them (flow-insensitive)."""

    def __init__(self) -> None:
        self.os: dict[str, str] = {"os": ""}  # name → what it stands for ("" for itself)
        self.environ: dict[str, str] = {}
        self.getenv: dict[str, str] = {}
        self.envs: dict[str, str] = {"envs": ""}
        self.reads: list[Read] = []

    # bindings ---------------------------------------------------------------------------

    def bind(self, nodes: list[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "os" or a.name.startswith("os."):
                        name = a.asname or "os"
                        self.os[name] = "" if name == "os" else f"import os as {name}"
                    elif a.name == f"{PACKAGE}.envs" and a.asname:
                        self.envs[a.asname] = "" if a.asname == "envs" else \
                            f"import vllm.envs as {a.asname}"
            elif isinstance(node, ast.ImportFrom):
                self._bind_from(node)
        # Names bound to the environment (or a copy) by assignment, to a fixed point.
        assigns = [n for n in nodes if isinstance(n, ast.Assign | ast.AnnAssign)]
        for _ in range(3):
            for node in assigns:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if not isinstance(target, ast.Name) or target.id in self.environ:
                    continue
                spelled = self.environ_expr(value)
                if spelled is not None:
                    self.environ[target.id] = f"{target.id} = {spelled}"
                elif self.getenv_expr(value) is not None:
                    self.getenv[target.id] = f"{target.id} = {ast.unparse(value)}"

    def _bind_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for a in node.names:
            local = a.asname or a.name
            if module == "os" and a.name == "environ":
                self.environ[local] = "from os import environ" + \
                    (f" as {local}" if a.asname else "")
            elif module == "os" and a.name == "getenv":
                self.getenv[local] = "from os import getenv" + \
                    (f" as {local}" if a.asname else "")
            elif a.name == "envs" and local != "envs" and (
                module == PACKAGE or (node.level and not module)
            ):
                self.envs[local] = f"from {'.' * node.level}{module} import envs as {local}"

    # expressions ------------------------------------------------------------------------

    def environ_expr(self, node: ast.expr) -> str | None:
        """How ``node`` spells the environment mapping (or a copy of it), or None."""
        if (
            isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id in self.os
        ):
            return f"{node.value.id}.environ"
        if isinstance(node, ast.Name) and node.id in self.environ:
            return node.id
        if isinstance(node, ast.Call) and not node.keywords:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "copy" and not node.args:
                inner = self.environ_expr(f.value)
                return f"{inner}.copy()" if inner else None
            if isinstance(f, ast.Name) and f.id == "dict" and len(node.args) == 1:
                inner = self.environ_expr(node.args[0])
                return f"dict({inner})" if inner else None
        return None

    def getenv_expr(self, node: ast.expr) -> str | None:
        if (
            isinstance(node, ast.Attribute) and node.attr == "getenv"
            and isinstance(node.value, ast.Name) and node.value.id in self.os
        ):
            return f"{node.value.id}.getenv"
        if isinstance(node, ast.Name) and node.id in self.getenv:
            return node.id
        return None

    def envs_expr(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.envs:
            return node.id
        if (
            isinstance(node, ast.Attribute) and node.attr == "envs"
            and isinstance(node.value, ast.Name) and node.value.id == PACKAGE
        ):
            return f"{PACKAGE}.envs"
        return None

    def explain(self, spelled: str) -> str:
        """``spelled`` with what its alias stands for, when it uses one."""
        for word in re.findall(r"(?<![.\w])\w+", spelled):
            for table in (self.os, self.environ, self.getenv, self.envs):
                note = table.get(word)
                if note:
                    return f"{spelled}, {note}"
        return spelled

    def add(self, name: ast.expr, form: str, node: ast.expr) -> None:
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            self.reads.append(Read(name.value, self.explain(form), name.lineno, node.lineno,
                                   node.end_lineno or node.lineno))

    # reads ------------------------------------------------------------------------------

    def visit(self, nodes: list[ast.AST]) -> None:
        """Look at each of ``nodes`` (already walked) once; no recursion of its own."""
        for node in nodes:
            method = getattr(self, f"visit_{type(node).__name__}", None)
            if method is not None:
                method(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        spelled = self.environ_expr(node.value)
        if spelled is not None and isinstance(node.ctx, ast.Load):
            self.add(node.slice, f"{spelled}[...]", node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if node.args:
            arg = node.args[0]
            spelled = self.getenv_expr(f)
            if spelled is not None:
                self.add(arg, spelled, node)
            elif isinstance(f, ast.Attribute):
                if f.attr in _ENVIRON_METHODS and (env := self.environ_expr(f.value)):
                    self.add(arg, f"{env}.{f.attr}", node)
                elif f.attr == "is_set" and (envs := self.envs_expr(f.value)):
                    self.add(arg, f"{envs}.is_set", node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if (
            len(node.ops) == 1 and isinstance(node.ops[0], ast.In | ast.NotIn)
            and (env := self.environ_expr(node.comparators[0]))
        ):
            op = "not in" if isinstance(node.ops[0], ast.NotIn) else "in"
            self.add(node.left, f"{op} {env}", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        envs = self.envs_expr(node.value)
        if envs is not None and _KNOB_ATTR_RE.fullmatch(node.attr) \
                and isinstance(node.ctx, ast.Load):
            const = ast.Constant(node.attr)
            const.lineno = node.end_lineno or node.lineno
            self.add(const, f"{envs}.NAME", node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == f"{PACKAGE}.envs" or (node.level and node.module == "envs"):
            for a in node.names:
                if _KNOB_ATTR_RE.fullmatch(a.name):
                    self.reads.append(Read(a.name, f"from {node.module} import",
                                           node.lineno, node.lineno,
                                           node.end_lineno or node.lineno))


def reads_in_source(
    text: str, context: str = "", lines: list[int] | None = None
) -> list[Read] | None:
    """Every environment read in ``text``; None when it does not parse.

    Imports among the lines of ``context`` (the rest of a file's added lines, when
    ``text`` is only a part of it) bind aliases too. With ``lines`` (sorted 1-based line
    numbers), only reads touching them are wanted, and only the statements around them and
    the module-level ones (where aliases are bound) are looked at: a 3,000-line file with
    a 10-line change is not walked whole.
    """
    if lines is not None and not lines:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    nodes = _walk(tree, lines)
    v = _Visitor()
    v.bind(nodes)
    for line in context.split("\n"):
        if re.match(r"\s*(?:import|from)\s", line):
            try:
                v.bind(list(ast.walk(ast.parse(line.strip()))))
            except (SyntaxError, ValueError):
                continue
    v.visit(nodes)
    if lines is None:
        return v.reads
    return [r for r in v.reads if _touches(lines, r.first, r.last)]


_MODULE_LEVEL = (ast.Module, ast.If, ast.Try, ast.With)


def _walk(tree: ast.Module, lines: list[int] | None) -> list[ast.AST]:
    """The nodes of ``tree``; with ``lines``, only those on or around them, and the
    statements at module level (through if/try/with)."""
    if lines is None:
        return list(ast.walk(tree))
    out: list[ast.AST] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, True)]
    while stack:
        node, module_level = stack.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            lo = getattr(child, "lineno", None)
            if lo is None or _touches(lines, lo, getattr(child, "end_lineno", None) or lo):
                stack.append((child, module_level and isinstance(child, _MODULE_LEVEL)))
            elif module_level and isinstance(child, ast.stmt):
                stack.append((child, isinstance(child, _MODULE_LEVEL)))
    return out


def _touches(lines: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_left(lines, lo)
    return i < len(lines) and lines[i] <= hi


# -- the series -----------------------------------------------------------------------------


def series_reads(patches: list[PatchFile], lineage: Lineage | None) -> list[KnobRead]:
    """Every environment read the series adds, in series order, each with its patch.

    With the ``lineage`` of the touched files (the pristine wheel patched through the
    series) the ``.py`` files are parsed whole; without it, each patch's added lines are
    read.
    """
    if lineage is None:
        return sorted(
            (r for k, pf in enumerate(patches) for r in _hunk_reads(k, pf)),
            key=lambda r: (r.patch, r.patch_line),
        )
    out: list[KnobRead] = []
    for k in lineage.failed:
        out += _hunk_reads(k, patches[k])
    unparsed: set[str] = set()
    for rel in sorted(lineage.text):
        if not rel.endswith(".py") or lineage.data.get(rel) is None:
            continue
        text = "\n".join(lineage.text[rel])
        origin = lineage.origin[rel]
        if not _may_read(text, [h for pf in patches for fd in pf.files
                                if fd.new_path == rel for h in fd.hunks]):
            continue
        added = [i + 1 for i, o in enumerate(origin) if o.patch is not None]
        reads = reads_in_source(text, lines=added)
        if reads is None:
            unparsed.add(rel)
            continue
        out += _attributed(rel, reads, origin, set(lineage.failed))
    for k, pf in enumerate(patches):
        if k not in lineage.failed and unparsed & set(pf.touched_paths):
            out += _hunk_reads(k, pf, only=unparsed)
    return sorted(set(out), key=lambda r: (r.patch, r.patch_line, r.name))


def _may_read(text: str, hunks: list[Hunk]) -> bool:
    """Whether a read can stand on a line the series adds to a file: some hunk's lines
    (added and context, so a call wrapped over a few lines counts) name the environment,
    ``getenv``, ``envs`` or a name the file binds to one of them. Parsing a large file
    costs tens of milliseconds; most touched files are skipped here."""
    words = {"environ", "getenv", "envs"}
    words.update(m.group("as") or m.group("as2") for m in _BINDS_RE.finditer(text))
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(words))) + r")\b")
    return any(pattern.search("\n".join(h.new_lines)) for h in hunks)


def _attributed(rel: str, reads: Iterable[Read], origin: list[Origin],
                failed: set[int]) -> list[KnobRead]:
    out = []
    for r in reads:
        at = origin[r.line - 1] if r.line - 1 < len(origin) else Origin(None, 0)
        if at.patch is None:
            span = origin[r.first - 1:r.last]
            at = next((o for o in span if o.patch is not None), at)
        if at.patch is not None and at.patch not in failed:
            out.append(KnobRead(at.patch, rel, at.line, r.name, r.form))
    return out


def _hunk_reads(k: int, pf: PatchFile, only: set[str] | None = None) -> list[KnobRead]:
    out: list[KnobRead] = []
    for fd in pf.files:
        if fd.new_path is None or not fd.new_path.endswith(".py") or (
            only is not None and fd.new_path not in only
        ):
            continue
        context = "\n".join(t for h in fd.hunks for _, t in h.added())
        for h in fd.hunks:
            out += _hunk_new_side_reads(k, fd, h, context)
    return out


def _hunk_new_side_reads(k: int, fd: FileDiff, h: Hunk, context: str) -> list[KnobRead]:
    """Reads whose name stands on an added line of ``h``, read from the hunk's new side
    (context included, so a call wrapped over a context line is seen): by ast where the
    side parses; else by ast for each run of added lines that parses, and by patterns
    over the whole side."""
    side: list[tuple[int | None, str]] = [
        (h.patch_line + 1 + i if ln.startswith("+") else None, ln[1:])
        for i, ln in enumerate(h.lines) if ln[:1] in (" ", "+")
    ]
    text = "\n".join(t for _, t in side)
    reads = reads_in_source(textwrap.dedent(text), context)
    if reads is None:
        reads = []
        pattern_reads = reads_in_text(text, context)
        start = 0
        while start < len(side):  # runs of added lines, each parsed on its own
            if side[start][0] is None:
                start += 1
                continue
            end = start
            while end < len(side) and side[end][0] is not None:
                end += 1
            run = textwrap.dedent("\n".join(t for _, t in side[start:end]))
            got = reads_in_source(run, context) or []
            reads += [Read(r.name, r.form, r.line + start, r.first + start,
                           r.last + start) for r in got]
            start = end
        # After the runs' own reads: what only the context makes a read (a wrapped call).
        reads += pattern_reads
    found: dict[tuple[str, int], KnobRead] = {}
    for r in reads:
        line = side[r.line - 1][0] if 0 < r.line <= len(side) else None
        if line is not None:
            found.setdefault((r.name, line), KnobRead(k, fd.path, line, r.name, r.form))
    return list(found.values())

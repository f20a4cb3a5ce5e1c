"""The env-knob rule: every environment variable a patch makes vLLM read is registered."""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

from qwen38build.errors import PatchFileError
from qwen38build.lint.finding import Context, Finding
from qwen38build.series import knobs
from qwen38build.series.patchfile import PatchFile
from qwen38build.wheels import wheelzip

ENVS_PY = "envs.py"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REGISTER_RE = re.compile(rf"""^\s*(["'])(?P<name>{_NAME})\1\s*:""")




# -- env knobs ---------------------------------------------------------------------------


def registered_knobs(pf: PatchFile) -> set[str]:
    """Knobs the patch registers: keys its added lines put in ``envs.py``."""
    names: set[str] = set()
    for fd in pf.files:
        if fd.new_path != ENVS_PY:
            continue
        for hunk in fd.hunks:
            for _, text in hunk.added():
                m = _REGISTER_RE.match(text)
                if m:
                    names.add(m.group("name"))
    return names


def read_pristine_knobs(source: Path) -> frozenset[str]:
    """The knobs vLLM's own ``envs.py`` registers; ``source`` is the wheel or the envs.py."""
    try:
        if source.suffix == ".whl":
            text = wheelzip.read(source, f"vllm/{ENVS_PY}").decode("utf-8")
        else:
            text = source.read_text(encoding="utf-8")
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise PatchFileError(
            f"{source}: cannot read vLLM's envs.py: {exc}.",
            hint="pass the pinned vLLM wheel or its vllm/envs.py",
        ) from exc
    return frozenset(_envs_keys(text))


def _envs_keys(text: str) -> set[str]:
    """The string keys of the ``environment_variables`` dict (what ``vllm.envs`` serves)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {m.group("name") for ln in text.splitlines() if (m := _REGISTER_RE.match(ln))}
    keys: set[str] = set()
    for node in ast.walk(tree):
        target: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Dict)
        ):
            keys.update(
                k.value for k in node.value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return keys


def env_knobs(
    ctx: Context,
    pf: PatchFile,
    reads: list[knobs.KnobRead],
    registered: dict[str, set[str]],
    registry: str,
    pristine: frozenset[str] | None,
) -> Iterator[Finding]:
    own = registered.get(pf.topic, set())
    from_registry = registered.get(registry, set())
    known = own | from_registry | (pristine or frozenset()) | set(ctx.recipe.lint.env_allow)
    for r in reads:
        if r.name in known:
            continue
        others = sorted(t for t, names in registered.items() if r.name in names)
        elsewhere = (
            f" {', '.join(others)} registers it, but a patch may rely only on its "
            f"own hunks or on {registry}."
            if others else ""
        )
        unread = (
            " Pristine envs.py was not read (no wheel given), so a knob vLLM "
            "itself registers is reported too."
            if pristine is None else ""
        )
        yield ctx.finding(
            pf.path, r.patch_line, "env-knobs",
            f"{pf.topic} reads env knob {r.name} ({r.form}) in {r.file}, but no "
            f"envs.py hunk of {pf.topic} or {registry} registers it.{elsewhere}{unread}",
            f"register {r.name} in envs.py's environment_variables in a hunk of "
            f"{pf.topic} (or in {registry} for a local knob) and read it through "
            "vllm.envs, so it is in the torch.compile cache key; if it is another "
            "program's variable, list it in recipe.toml's [lint] env_allow",
        )

"""Environment reads found in text that does not parse as Python: the knob rule's fallback."""

from __future__ import annotations

import re
from dataclasses import dataclass

# -- the fallback for text that does not parse ----------------------------------------------


@dataclass(frozen=True)
class Read:
    """One environment read in a source text: the variable, how it was read (as written,
    with what an alias stands for), the 1-based line holding the name, and the lines the
    whole expression spans."""

    name: str
    form: str
    line: int
    first: int
    last: int



_STR = r"""(?P<q>["'])(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P=q)"""
_ENV = r"(?P<a>(?:{os})\s*\.\s*environ\b|\b(?:{environ})\b)"
_FALLBACK = (  # (form, pattern): {a} is the expression as the text spelled it
    ("{a}[...]", _ENV + r"\s*\[\s*" + _STR + r"\s*\](?!\s*=[^=])"),
    ("{a}.{m}", _ENV + r"\s*\.\s*(?P<m>get|setdefault|pop)\s*\(\s*" + _STR),
    ("in {a}", _STR + r"\s+(?:not\s+)?in\s+" + _ENV),
    ("{a}", r"(?P<a>(?:{os})\s*\.\s*getenv|\b(?:{getenv}))\s*\(\s*" + _STR),
    ("{a}.is_set", r"(?P<a>{envs})\s*\.\s*is_set\s*\(\s*" + _STR),
    ("{a}.NAME", r"(?P<a>{envs})\s*\.\s*(?P<name>[A-Z][A-Z0-9_]*)\b(?!\s*=[^=])"),
)
_IMPORT_AS_RE = re.compile(r"^\s*import\s+(?P<mod>os|vllm\.envs)\s+as\s+(?P<as>\w+)", re.M)
_FROM_RE = re.compile(
    r"^\s*from\s+(?P<mod>os|vllm|\.+)\s+import\s+(?:\((?P<wrapped>[\w\s,]+)|(?P<names>[\w \t,]+))",
    re.M,
)


def _aliases(text: str) -> dict[str, set[str]]:
    """The names ``text`` binds to os, os.environ, os.getenv and vllm.envs, by pattern."""
    out = {"os": {r"\bos"}, "environ": set(), "getenv": set(),
           "envs": {r"\benvs", r"\bvllm\s*\.\s*envs"}}
    for m in _IMPORT_AS_RE.finditer(text):
        out["os" if m.group("mod") == "os" else "envs"].add(r"\b" + m.group("as"))
    for m in _FROM_RE.finditer(text):
        for part in (m.group("wrapped") or m.group("names")).split(","):
            name, _, alias = part.strip().partition(" as ")
            local = (alias or name).strip()
            kind = {"environ": "environ", "getenv": "getenv"}.get(name.strip()) \
                if m.group("mod") == "os" else ("envs" if name.strip() == "envs" else None)
            if kind and local.isidentifier():
                out[kind].add(local if kind != "envs" else r"\b" + local)
    return out


def reads_in_text(text: str, context: str = "") -> list[Read]:
    """Environment reads in ``text`` that does not parse, by patterns spanning lines.

    Aliases bound in ``text`` or ``context`` (the rest of the file's added lines) count.
    Comment lines are blanked first, so a read in a comment is not one.
    """
    text = "\n".join("" if ln.lstrip().startswith("#") else ln for ln in text.split("\n"))
    aliases = _aliases(text + "\n" + context)
    found: list[Read] = []
    seen: set[tuple[str, int]] = set()
    for form, pattern in _FALLBACK:
        rx = re.compile(pattern.format(
            **{k: "|".join(sorted(v)) or "(?!)" for k, v in aliases.items()}
        ))
        for m in rx.finditer(text):
            line = text.count("\n", 0, m.start("name")) + 1
            before = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
            if (m.group("name"), line) in seen or before.strip() == "del":
                continue
            seen.add((m.group("name"), line))
            first = text.count("\n", 0, m.start()) + 1
            spelled = form.format(a=re.sub(r"\s+", "", m.group("a")),
                                  m=m.groupdict().get("m") or "")
            found.append(Read(m.group("name"), spelled, line, first, line))
    return found

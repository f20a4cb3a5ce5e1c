"""What moved between two environment locks (a bump's report)."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class EnvMove:
    """What moved between two environment locks."""

    changed: tuple[tuple[str, str, str], ...]  # name, old, new
    added: tuple[tuple[str, str], ...]
    removed: tuple[tuple[str, str], ...]
    unchanged: int

    def to_json(self) -> dict[str, object]:
        return {
            "changed": [{"name": n, "from": a, "to": b} for n, a, b in self.changed],
            "added": [{"name": n, "version": v} for n, v in self.added],
            "removed": [{"name": n, "version": v} for n, v in self.removed],
            "unchanged": self.unchanged,
        }

    def lines(self) -> list[str]:
        out = [f"- {n} {a} → {b}" for n, a, b in self.changed]
        out += [f"- added {n} {v}" for n, v in self.added]
        out += [f"- removed {n} {v}" for n, v in self.removed]
        return [*out, f"- {self.unchanged} package(s) unchanged"]


_FIRST = ("torch", "triton")


def _order(name: str) -> tuple[int, str]:
    return (_FIRST.index(name) if name in _FIRST else len(_FIRST), name)


def diff(old: dict[str, str], new: dict[str, str]) -> EnvMove:
    """Packages whose version moved (torch and triton first), added and removed."""
    changed = tuple((n, old[n], new[n]) for n in sorted(old.keys() & new.keys(), key=_order)
                    if _version_key(old[n]) != _version_key(new[n]))
    added = tuple((n, new[n]) for n in sorted(new.keys() - old.keys(), key=_order))
    removed = tuple((n, old[n]) for n in sorted(old.keys() - new.keys(), key=_order))
    same = len(old.keys() & new.keys()) - len(changed)
    return EnvMove(changed, added, removed, same)


def _version_key(v: str) -> Version | str:
    try:
        return Version(v)
    except InvalidVersion:
        return v

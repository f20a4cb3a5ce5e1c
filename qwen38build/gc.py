"""gc: remove store entries that no root's build reaches."""

from __future__ import annotations

import json

from qwen38build.record import roots
from qwen38build.store import Store


def live_digests(store: Store) -> set[str]:
    """Every step digest of every rooted build's closure."""
    live: set[str] = set()
    for build in roots(store).values():
        path = store.builds / f"{build}.json"
        if path.exists():
            live.update(s["digest"] for s in json.loads(path.read_text())["steps"])
    return live


def collect(store: Store, *, dry_run: bool = False) -> list[str]:
    live = live_digests(store)
    dead = [d for d in store.entries() if d not in live]
    if not dry_run:
        for digest in dead:
            with store.lock(digest):
                store.remove(digest)
        store.clean_tmp()
    return dead

"""stack: one directory holding every output of the build (Nix: a derivation's outputs).

Its outputs are links, one per top-level output of each part (the patched vLLM wheel and
its manifest, the pthfa wheel, the environment lock), each ``../<digest>/<name>`` into the
part's own entry: nothing is copied, the parts keep their own digests and records, and
``./result`` (a link to this entry) shows all of them. The store keeps only links of that
shape and checks each against its record like any output.
"""

from __future__ import annotations

import os

from qwen38build.engine.executor import Context
from qwen38build.errors import StoreError
from qwen38build.steps import ALL, ENGINE

KIND = "stack"
IMPLEMENTATION = ENGINE
# The parts are what the stack's links point at: needed wherever the stack is.
RUNTIME = ALL


def run(ctx: Context) -> None:
    seen: dict[str, str] = {}
    for part, dep in ctx.step.deps:
        entry = ctx.dep_entry(part)
        for name in sorted(entry.outputs):
            if "/" in name:
                continue  # a part's inner files stay in its entry (the patch tree, say)
            if name in seen:
                raise StoreError(f"parts {seen[name]} and {part} both have an output {name}; "
                                 "the stack cannot hold both.")
            seen[name] = part
            os.symlink(f"../{dep.digest}/{name}", ctx.out / name)

"""The signed record of one cache entry: what ``<digest>.json`` holds, made and checked here.

    {"format": 1,
     "digest": "<step digest>",
     "derivation": {kind, version, name, params, inputs, deps},
     "outputs": {"<relative path>": {"sha256": "<hex>", "size": N, "executable": false}},
     "signatures": ["<key name>:<base64 ed25519 signature>"]}

The signature covers everything but ``signatures`` (see :mod:`qwen38build.cache.signing`). A
reader trusts nothing in a record until :func:`check` passes: well formed, the digest the
reader asked for, a derivation that hashes to it, output paths that stay below the entry,
and a valid signature by a key the reader trusts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qwen38build.cache.signing import PublicKey, SecretKey, sign_record, trusted_signer
from qwen38build.engine.step import derivation_digest
from qwen38build.errors import CacheError, UntrustedEntry

if TYPE_CHECKING:
    from qwen38build.store.entry import Entry

FORMAT = 1
MAX_RECORD = 4 << 20  # bytes; a record lists outputs, it is never large
# A record carries one signature per key that signed it: a handful. A longer list is
# refused before any is checked, so a record cannot cost seconds of signature checks.
MAX_SIGNATURES = 16
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PART = re.compile(r"^[A-Za-z0-9_.+@=,~-]+$")


@dataclass(frozen=True)
class Output:
    name: str
    sha256: str
    size: int
    executable: bool


@dataclass(frozen=True)
class CacheRecord:
    digest: str
    signer: str
    outputs: tuple[Output, ...]


def make(entry: Entry, key: SecretKey) -> bytes:
    """The signed record of a local store entry, as the bytes to upload."""
    outputs = {}
    for name, rec in sorted(entry.outputs.items()):
        mode = (entry.path / name).stat().st_mode
        outputs[name] = {"sha256": rec["sha256"], "size": rec["size"],
                         "executable": bool(mode & 0o111)}
    record = {"format": FORMAT, "digest": entry.digest,
              "derivation": entry.meta["derivation"], "outputs": outputs}
    return json.dumps(sign_record(record, key), indent=1, sort_keys=True).encode() + b"\n"


def safe_name(name: object) -> bool:
    """A relative POSIX path that stays below the entry: no '..', '.', empty or odd parts."""
    if not isinstance(name, str) or not 0 < len(name) < 1024:
        return False
    parts = name.split("/")
    return all(_PART.match(p) and p not in (".", "..") for p in parts)


def check(data: bytes, digest: str, trusted: list[PublicKey]) -> CacheRecord:
    """The record in ``data`` if it may be used for step ``digest``; else UntrustedEntry."""
    try:
        rec: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        # Not an entry gone bad: the server answers something else than a cache.
        raise CacheError(f"{digest[:12]}.json is not JSON") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise UntrustedEntry(f"the record is not a format-{FORMAT} cache record")
    if rec.get("digest") != digest:
        raise UntrustedEntry(f"the record is for another digest ({str(rec.get('digest'))[:12]})")
    drv = rec.get("derivation")
    if not isinstance(drv, dict) or derivation_digest(drv) != digest:
        raise UntrustedEntry("the record's derivation does not hash to its digest")
    sigs = rec.get("signatures")
    if isinstance(sigs, list) and len(sigs) > MAX_SIGNATURES:
        raise UntrustedEntry(f"the record carries {len(sigs)} signatures; at most "
                             f"{MAX_SIGNATURES} are read")
    signer = trusted_signer(rec, trusted)
    if signer is None:
        names = [s.partition(":")[0] for s in rec.get("signatures") or [] if isinstance(s, str)]
        raise UntrustedEntry("no valid signature by a trusted key (signed by: "
                             + (", ".join(names) or "nobody") + ")")
    outs = rec.get("outputs")
    if not isinstance(outs, dict):
        raise UntrustedEntry("the record lists no outputs")
    outputs = []
    for name, o in sorted(outs.items()):
        ok = (safe_name(name) and isinstance(o, dict)
              and isinstance(o.get("sha256"), str) and _HEX64.match(o["sha256"])
              and type(o.get("size")) is int and o["size"] >= 0
              and isinstance(o.get("executable"), bool))
        if not ok:
            raise UntrustedEntry(f"the record's output {str(name)[:80]!r} is malformed")
        outputs.append(Output(name, o["sha256"], o["size"], o["executable"]))
    files = {o.name for o in outputs}
    for o in outputs:  # a file may not also be a folder of another output
        head = o.name
        while "/" in head:
            head = head.rsplit("/", 1)[0]
            if head in files:
                raise UntrustedEntry(f"the record's output {o.name!r} lies inside {head!r}")
    return CacheRecord(digest, signer, tuple(outputs))

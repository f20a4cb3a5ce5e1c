"""ed25519 keys and signatures for cache records, in Nix's ``name:base64`` spelling.

A secret key file holds one line ``NAME:BASE64`` of the 32-byte ed25519 seed; a public key
is ``NAME:BASE64`` of the 32-byte public key; a signature is ``NAME:BASE64`` of the 64-byte
signature. The name says which trusted key to check a signature with, so a record may carry
signatures by several keys and a reader tries only those it trusts.

What is signed is :func:`signed_bytes` of a record: a fixed domain line, then the record's
canonical JSON without its ``signatures`` field. The domain line keeps a signature over a
cache record from being valid for anything else the same key might sign.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from qwen38build.digest import canonical_json
from qwen38build.errors import InputError

DOMAIN = b"qwen38build-cache-record-v1\n"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def signed_bytes(record: dict[str, object]) -> bytes:
    """The exact bytes a record's signatures are over."""
    body = {k: v for k, v in record.items() if k != "signatures"}
    return DOMAIN + canonical_json(body)


def check_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise InputError(
            f"{where}: key name {name!r} is not valid; use letters, digits and . _ + - "
            "(at most 128), starting with a letter or digit.",
            hint="name keys after the cache and a number, e.g. q38-ci-1",
        )
    return name


def _split(text: str, size: int, where: str, what: str) -> tuple[str, bytes]:
    name, sep, b64 = text.strip().partition(":")
    if not sep:
        raise InputError(f"{where}: a {what} must read NAME:BASE64; found no ':'.",
                         hint="make keys with `qwen38build cache keygen NAME`")
    check_name(name, where)
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise InputError(f"{where}: the {what} {name!r} is not base64 of {size} bytes.",
                         hint="make keys with `qwen38build cache keygen NAME`")
    return name, raw


@dataclass(frozen=True)
class PublicKey:
    name: str
    raw: bytes

    @classmethod
    def parse(cls, text: str, where: str) -> PublicKey:
        name, raw = _split(text, 32, where, "public key")
        return cls(name, raw)

    def __str__(self) -> str:
        return f"{self.name}:{base64.b64encode(self.raw).decode()}"

    def verifies(self, data: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class SecretKey:
    name: str
    seed: bytes

    @classmethod
    def parse(cls, text: str, where: str) -> SecretKey:
        name, seed = _split(text, 32, where, "secret key")
        return cls(name, seed)

    @classmethod
    def load(cls, path: Path) -> SecretKey:
        """The secret key of ``path``. Refused (InputError) before it signs anything: a
        public key file (``.pub``: both read NAME:BASE64 of 32 bytes, and its "signatures"
        would verify under no key), and a key others may read (group or world bits, as ssh
        refuses a private key): a key anyone could have copied vouches for nothing."""
        if path.name.endswith(".pub"):
            raise InputError(f"{path}: a public key file; push signs with the secret key.",
                             hint="give the .sec file `qwen38build cache keygen NAME` wrote "
                             "beside it")
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read the signing key: {exc}.",
                             hint="give a file written by `qwen38build cache keygen NAME`"
                             ) from exc
        if mode & 0o077:
            raise InputError(f"{path}: the secret key is readable by others (mode {mode:03o}); "
                             "refused, as a key others could have copied proves nothing.",
                             hint=f"chmod 600 {path} (and make a new key if others read it)")
        return cls.parse(text, str(path))

    @classmethod
    def generate(cls, name: str) -> SecretKey:
        return cls(check_name(name, "cache keygen"), os.urandom(32))

    def __str__(self) -> str:
        return f"{self.name}:{base64.b64encode(self.seed).decode()}"

    def public(self) -> PublicKey:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        key = Ed25519PrivateKey.from_private_bytes(self.seed)
        return PublicKey(self.name, key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def sign(self, data: bytes) -> str:
        """``NAME:BASE64`` of the ed25519 signature over ``data``."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        sig = Ed25519PrivateKey.from_private_bytes(self.seed).sign(data)
        return f"{self.name}:{base64.b64encode(sig).decode()}"


def sign_record(record: dict[str, object], key: SecretKey) -> dict[str, object]:
    """``record`` with ``key``'s signature as its one signature."""
    body = {k: v for k, v in record.items() if k != "signatures"}
    return {**body, "signatures": [key.sign(signed_bytes(body))]}


def trusted_signer(record: dict[str, object], trusted: list[PublicKey]) -> str | None:
    """The name of a trusted key whose signature on ``record`` holds, else None.

    Signatures by keys not trusted, or not well formed, are ignored, never an error: a
    record may be signed by keys this machine does not know.
    """
    sigs = record.get("signatures")
    if not isinstance(sigs, list):
        return None
    by_name = {k.name: k for k in trusted}
    data = signed_bytes(record)
    for sig in sigs[:64]:  # bounded here too; cache/record.py refuses a longer list
        if not isinstance(sig, str):
            continue
        name, _, b64 = sig.partition(":")
        key = by_name.get(name)
        if key is None:
            continue
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(raw) == 64 and key.verifies(data, raw):
            return name
    return None


def write_key_pair(key: SecretKey, secret: Path, public: Path) -> None:
    """Write the secret key (mode 0600, never over an existing file) and its public key."""
    for p in (secret, public):
        if p.exists() or p.is_symlink():
            raise InputError(f"{p}: exists; keygen never overwrites a key file.",
                             hint="choose another name or remove the old file first")
    try:
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{key}\n")
        public.write_text(f"{key.public()}\n")
    except OSError as exc:
        raise InputError(f"{exc.filename or secret}: cannot write the key: {exc.strerror}.",
                         hint="give --dir a folder you can write") from exc

"""A cache record is trusted only when every part of it checks out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qwen38build.cache import record as cacherecord
from qwen38build.cache.signing import SecretKey, sign_record
from qwen38build.digest import sha256_json
from qwen38build.errors import CacheError, UntrustedEntry

KEY = SecretKey.generate("q38-t-1")
DRV: dict[str, Any] = {"kind": "wheel", "version": 1, "params": {}, "inputs": [], "deps": []}
DIGEST = sha256_json(DRV)
GOOD_OUT = {"sha256": "0" * 64, "size": 3, "executable": False}


def record(**change: Any) -> dict[str, Any]:
    rec = {"format": 1, "digest": DIGEST, "derivation": {**DRV, "name": "w"},
           "outputs": {"a.whl": GOOD_OUT, "tree/vllm/x.py": GOOD_OUT}}
    rec.update(change)
    return sign_record(rec, KEY)


def check(rec: dict[str, Any]) -> cacherecord.CacheRecord:
    return cacherecord.check(json.dumps(rec).encode(), DIGEST, [KEY.public()])


def test_a_good_record_gives_its_outputs_and_signer() -> None:
    got = check(record())
    assert got.signer == "q38-t-1"
    assert [o.name for o in got.outputs] == ["a.whl", "tree/vllm/x.py"]


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a//b", "./a", "a/..", "", "a\\b",
                                  "a\x00b", "sp ace", "a/../../b"])
def test_an_output_path_that_could_leave_the_entry_is_refused(name: str) -> None:
    with pytest.raises(UntrustedEntry, match="malformed"):
        check(record(outputs={name: GOOD_OUT}))


@pytest.mark.parametrize("out", [{"sha256": "0" * 63, "size": 1, "executable": False},
                                 {"sha256": "0" * 64, "size": -1, "executable": False},
                                 {"sha256": "0" * 64, "size": True, "executable": False},
                                 {"sha256": "0" * 64, "size": 1}, "x"])
def test_a_malformed_output_is_refused(out: Any) -> None:
    with pytest.raises(UntrustedEntry, match="malformed"):
        check(record(outputs={"a": out}))


def test_a_file_that_is_also_a_folder_is_refused() -> None:
    with pytest.raises(UntrustedEntry, match="lies inside"):
        check(record(outputs={"a": GOOD_OUT, "a/b": GOOD_OUT}))


def test_a_derivation_that_does_not_hash_to_the_digest_is_refused() -> None:
    with pytest.raises(UntrustedEntry, match="does not hash"):
        check(record(derivation={**DRV, "params": {"x": 1}}))


def test_another_digest_and_another_format_are_refused() -> None:
    with pytest.raises(UntrustedEntry, match="another digest"):
        check(record(digest="f" * 64))
    with pytest.raises(UntrustedEntry, match="format-1"):
        check(record(format=2))


def test_not_json_is_a_broken_cache_not_a_bad_entry() -> None:
    with pytest.raises(CacheError) as info:
        cacherecord.check(b"<html>", DIGEST, [KEY.public()])
    assert not isinstance(info.value, UntrustedEntry)


@pytest.mark.parametrize("where", ["bogus only", "the good one last"])
def test_a_long_signature_list_is_refused_before_any_is_checked(where: str) -> None:
    """20,000 signatures under the trusted key's name, each a well-formed but wrong ed25519
    signature: checking them all cost seconds of CPU per step. The list is bounded and
    the record refused at once, the good signature at its end included."""
    import base64
    import time

    good = record()
    bogus = f"{KEY.name}:{base64.b64encode(bytes(64)).decode()}"
    sigs = [bogus] * 20_000 + (good["signatures"] if where == "the good one last" else [])
    start = time.process_time()
    with pytest.raises(UntrustedEntry, match=r"200\d\d signatures; at most 16"):
        check({**good, "signatures": sigs})
    assert time.process_time() - start < 0.5
    # A few signatures by unknown keys beside the good one still pass.
    assert check({**good, "signatures": [bogus.replace(KEY.name, "other")] * 3
                  + good["signatures"]}).signer == KEY.name


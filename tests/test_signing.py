"""ed25519 key files, the canonical signed form, and which signatures count."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from qwen38build.cache.signing import (
    DOMAIN,
    PublicKey,
    SecretKey,
    sign_record,
    signed_bytes,
    trusted_signer,
)
from qwen38build.cli import main
from qwen38build.errors import InputError

RECORD = {"format": 1, "digest": "ab" * 32, "outputs": {"x": {"sha256": "cd" * 32}}}


def test_a_signature_holds_for_its_key_and_record_only() -> None:
    key = SecretKey.generate("q38-a-1")
    signed = sign_record(RECORD, key)
    assert trusted_signer(signed, [key.public()]) == "q38-a-1"
    # Another key, even under the same name, does not verify it.
    assert trusted_signer(signed, [SecretKey.generate("q38-a-1").public()]) is None
    assert trusted_signer(signed, []) is None
    # Any change to any signed field breaks it.
    edited = {**signed, "outputs": {"x": {"sha256": "ce" * 32}}}
    assert trusted_signer(edited, [key.public()]) is None


def test_the_signed_form_is_the_domain_line_and_canonical_json_without_signatures() -> None:
    data = signed_bytes({**RECORD, "signatures": ["x:y"]})
    assert data.startswith(DOMAIN)
    assert data[len(DOMAIN):] == (
        b'{"digest":"' + b"ab" * 32 + b'","format":1,"outputs":{"x":{"sha256":"'
        + b"cd" * 32 + b'"}}}')


def test_unknown_and_malformed_signatures_are_skipped_not_errors() -> None:
    key = SecretKey.generate("q38-a-1")
    signed: Any = sign_record(RECORD, key)
    good = signed["signatures"][0]
    record = {**RECORD, "signatures": [7, "nocolon", "q38-a-1:%%%", "other:AAAA", good]}
    assert trusted_signer(record, [key.public()]) == "q38-a-1"
    assert trusted_signer({**RECORD, "signatures": "q38-a-1:x"}, [key.public()]) is None


def test_keys_round_trip_through_their_text_form() -> None:
    key = SecretKey.generate("q38-a-1")
    assert SecretKey.parse(str(key), "here") == key
    assert PublicKey.parse(str(key.public()), "here") == key.public()


@pytest.mark.parametrize("text", ["", "nocolon", "q38:AAAA", ":" + "A" * 44,
                                  "bad name:" + "A" * 43 + "=", "q38:" + "!" * 44])
def test_malformed_keys_are_input_errors_naming_where(text: str) -> None:
    with pytest.raises(InputError, match=r"^somewhere: "):
        PublicKey.parse(text, "somewhere")


def test_keygen_writes_a_private_secret_and_its_public_key_and_never_overwrites(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "keygen", "q38-ci-1", "--dir", str(tmp_path)]) == 0
    secret, public = tmp_path / "q38-ci-1.sec", tmp_path / "q38-ci-1.pub"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    key = SecretKey.load(secret)
    assert public.read_text().strip() == str(key.public())
    assert str(key.public()) in capsys.readouterr().out
    before = secret.read_bytes()
    assert main(["cache", "keygen", "q38-ci-1", "--dir", str(tmp_path)]) == 2
    assert "never overwrites" in capsys.readouterr().err
    assert secret.read_bytes() == before


def test_keygen_refuses_a_name_that_cannot_prefix_a_signature(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "keygen", "a:b", "--dir", str(tmp_path)]) == 2
    assert "key name 'a:b' is not valid" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_keygen_into_a_missing_folder_is_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "keygen", "k", "--dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the key" in err and "Traceback" not in err


@pytest.mark.parametrize("xdg", [False, True])
def test_keygen_writes_into_the_user_config_dir_never_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        xdg: bool) -> None:
    home, work = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))  # a fresh HOME: no ~/.config yet
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    if xdg:
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(work)
    assert main(["cache", "keygen", "q38-ci-1"]) == 0
    where = (tmp_path / "xdg" if xdg else home / ".config") / "qwen38build"
    secret, public = where / "q38-ci-1.sec", where / "q38-ci-1.pub"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert public.read_text().strip() == str(SecretKey.load(secret).public())
    assert str(secret) in capsys.readouterr().out
    assert list(work.iterdir()) == []

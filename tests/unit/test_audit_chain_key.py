"""The audit chain key: HMAC hashes under a secret file that must be owner-only and long enough."""

import os

import pytest

from shared.infra.audit_chain import GENESIS, ChainKeyError, find_break, load_chain_key, row_hash, write_new_chain_key

ROW = {"id": 1, "event_id": "e1", "ts": "2026-01-01T00:00:00+00:00", "source": "api", "kind": "k", "reason": "r"}


def test_a_new_key_is_owner_only_and_kept_once_written(tmp_path):
    path = write_new_chain_key(tmp_path / "secrets" / "chain.key")
    assert os.stat(path).st_mode & 0o777 == 0o600
    key = load_chain_key(path)
    assert len(key) == 64 and write_new_chain_key(path) == path and load_chain_key(path) == key


def test_keyed_hashes_differ_from_plain_ones_and_need_the_key_to_verify(tmp_path):
    key = load_chain_key(write_new_chain_key(tmp_path / "k"))
    row = ROW | {"prev_hash": GENESIS, "hash": row_hash(GENESIS, ROW, key)}
    assert row["hash"] != row_hash(GENESIS, ROW)
    assert find_break([row], key=key) is None
    assert find_break([row]) == (1, "content does not match its hash (the row was altered)")
    assert find_break([row], key=b"x" * 32) is not None


def _file(text: str, mode: int):
    def make(path):
        path.write_text(text)
        path.chmod(mode)

    return make


@pytest.mark.parametrize(
    "setup,says",
    [
        (_file("k" * 64, 0o644), "readable by others"),
        (_file("short", 0o600), "shorter than 32 bytes"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: None, "No such file"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_setting(tmp_path, setup, says):
    path = tmp_path / "chain.key"
    setup(path)
    with pytest.raises(ChainKeyError, match=says) as err:
        load_chain_key(path)
    assert str(err.value).startswith("audit.chain_key_file ")

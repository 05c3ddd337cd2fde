"""The audit log's hash chain: each row's hash covers its content and the previous row's hash.

With a chain key (`audit.chain_key_file`, a secret kept outside Postgres) each hash is an
HMAC, so someone who can write the database, a superuser included, cannot rewrite a row and
recompute the chain after it: only holders of the key (the audit sink, which writes, and the
api, which verifies) can. Rows cut from the very end leave a valid shorter chain; an anchor kept
outside Postgres (`adc audit verify --anchor FILE`) catches that.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
CHAINED_FIELDS = (
    "event_id",
    "ts",
    "source",
    "kind",
    "actor",
    "job_id",
    "node",
    "decision_id",
    "rule",
    "action",
    "reason",
    "evidence",
    "data",
)


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


class ChainKeyError(ValueError):
    pass


MIN_KEY_BYTES = 32


def load_chain_key(path: str | Path) -> bytes:
    """The key from its file: a regular file, of at least 32 bytes, readable by its owner only."""
    p = Path(path)
    try:
        info = p.stat()
    except OSError as err:
        raise ChainKeyError(f"audit.chain_key_file {p}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ChainKeyError(f"audit.chain_key_file {p}: not a regular file")
    if info.st_mode & 0o077:
        raise ChainKeyError(f"audit.chain_key_file {p}: readable by others (mode {info.st_mode & 0o777:o}); chmod 600")
    key = p.read_bytes()[:4096].strip()
    if len(key) < MIN_KEY_BYTES:
        raise ChainKeyError(f"audit.chain_key_file {p}: shorter than {MIN_KEY_BYTES} bytes")
    return key


def write_new_chain_key(path: str | Path) -> Path:
    """A fresh random key (64 hex characters), created owner-only; an existing key is kept."""
    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    return p


def row_hash(prev_hash: str, row: dict[str, Any], key: bytes | None = None) -> str:
    body = json.dumps(
        {f: _canonical(row.get(f)) for f in CHAINED_FIELDS},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    message = (prev_hash + body).encode()
    if key is not None:
        return hmac.new(key, message, hashlib.sha256).hexdigest()
    return hashlib.sha256(message).hexdigest()


def find_break(
    rows: list[dict[str, Any]], prev_hash: str = GENESIS, key: bytes | None = None
) -> tuple[int, str] | None:
    """The first row whose chain does not hold, as (id, why); None if all hold."""
    for row in rows:
        if row["prev_hash"] != prev_hash:
            return row["id"], "prev_hash does not match the hash of the row before it"
        expected = row_hash(prev_hash, row, key)
        if not hmac.compare_digest(row["hash"], expected):
            return row["id"], "content does not match its hash (the row was altered)"
        prev_hash = row["hash"]
    return None

"""Commands a worker can trust: the executor signs each one, the worker checks the signature.

Bus permissions already keep other roles off a node's command subject; the signature also
holds against anything that gets past them (a misconfigured server, a stolen non-executor
credential). The executor signs with its own bus nkey (ed25519) over the subject and the exact
payload bytes, so a command cannot be moved to another node nor altered; the signature goes in
the `Adc-Signature` header (base64). A worker knows only the executor's public key
(`<credentials_dir>/executor.pub`).
"""
from __future__ import annotations

import base64
import binascii

import nacl.exceptions
import nacl.signing
import nkeys

from shared.bus_auth import CredentialStore

SIGNATURE_HEADER = "Adc-Signature"


def signed_bytes(subject: str, payload: bytes) -> bytes:
    return subject.encode() + b"\n" + payload


def sign(keypair: nkeys.KeyPair, subject: str, payload: bytes) -> dict[str, str]:
    """The header that carries the executor's signature of this command."""
    return {SIGNATURE_HEADER: base64.b64encode(keypair.sign(signed_bytes(subject, payload))).decode()}


def verify_key(public_key: str) -> nacl.signing.VerifyKey:
    """An nkey user public key (`U...`) as an ed25519 verify key, its prefix and checksum checked."""
    try:
        raw = base64.b32decode(public_key.encode() + b"=" * (-len(public_key) % 8))
    except binascii.Error:
        raise ValueError("not an nkey public key") from None
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if len(body) != 33 or body[0] != nkeys.PREFIX_BYTE_USER or nkeys.crc16(bytearray(body)) != crc:
        raise ValueError("not an nkey user public key")
    return nacl.signing.VerifyKey(bytes(body[1:]))


class CommandVerifier:
    """A worker's check that a command was signed by the executor; says why when it was not."""

    def __init__(self, executor_public_key: str) -> None:
        self.key = verify_key(executor_public_key)

    @classmethod
    def from_store(cls, store: CredentialStore) -> "CommandVerifier":
        return cls(store.public_key("executor"))

    def refusal(self, subject: str, payload: bytes, headers: dict[str, str] | None) -> str | None:
        """None if the executor signed exactly this; else why the command is refused."""
        signature = (headers or {}).get(SIGNATURE_HEADER)
        if not signature:
            return "unsigned command"
        try:
            self.key.verify(signed_bytes(subject, payload), base64.b64decode(signature, validate=True))
        except (binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
            return "command not signed by the executor"
        return None

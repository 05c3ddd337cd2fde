"""Messages whose sender matters, signed by it: the executor's commands to workers, and the
api's cancel requests to the executor (on the job's event subject, where any worker may publish).

Bus permissions keep other roles off a node's command subject; the signature also holds against
anything that gets past them (a misconfigured server, a stolen non-executor credential). The
sender signs with its own bus nkey (ed25519) over the subject and the exact payload bytes, so a
message cannot be moved to another subject nor altered; the signature goes in the
`Adc-Signature` header (base64). A receiver knows only the sender's public key
(`<credentials_dir>/<role>.pub`).
"""

from __future__ import annotations

import base64
import binascii

import nacl.exceptions
import nacl.signing
import nkeys

from shared.infra.bus_auth import CredentialStore

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


class SignatureVerifier:
    """A receiver's check that a message was signed by one role (the executor, for a worker); says why not."""

    def __init__(self, public_key: str, signer: str = "executor") -> None:
        self.key = verify_key(public_key)
        self.signer = signer

    @classmethod
    def from_store(cls, store: CredentialStore, signer: str = "executor") -> SignatureVerifier:
        return cls(store.public_key(signer), signer)

    def refusal(self, subject: str, payload: bytes, headers: dict[str, str] | None) -> str | None:
        """None if the signer signed exactly this; else why the message is refused."""
        signature = (headers or {}).get(SIGNATURE_HEADER)
        if not signature:
            return "unsigned"
        try:
            self.key.verify(signed_bytes(subject, payload), base64.b64decode(signature, validate=True))
        except (binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
            return f"not signed by the {self.signer}"
        return None

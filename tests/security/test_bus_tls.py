"""TLS on the bus, against the session's real nats-server (tests/conftest.py starts it as `adc up` does,
cli/local_services.LocalNats, with the CA and certificate of shared/infra/bus_tls.py).

A role's credential comes with the CA (`ca.pem` beside the keys) and connects over TLS; a plaintext
client is refused before it speaks the protocol (the server wants TLS first); a client that trusts
another CA, or dials a name the certificate does not hold, refuses the server.
"""

from __future__ import annotations

import socket
import ssl

import nats
import nats.errors
import pytest

from shared.infra.bus import Bus
from shared.infra.bus_tls import client_context, ensure_tls
from tests.conftest import Isolated


@pytest.fixture(scope="module")
def env():
    e = Isolated().open()
    yield e
    e.close()


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    return host, int(port)


async def test_a_role_connects_over_tls_verified_against_the_installations_ca(env):
    credential = env.credential("decider")
    assert credential.ca_file == env.keys.directory / "ca.pem"
    bus = await Bus.connect(env.nats_url, env.prefix, "tls-test", credential)
    try:
        ssl_object = bus.nc._transport._io_writer.get_extra_info("ssl_object")  # the socket nats-py really uses
        assert ssl_object is not None and ssl_object.version() in ("TLSv1.2", "TLSv1.3")
        assert ssl_object.getpeercert()["issuer"] == ((("organizationName", "ADC"),), (("commonName", "ADC bus CA"),))
        await bus.nc.publish(bus.subjects.decisions, b"{}")
        await bus.nc.flush(timeout=3)  # a round trip over the TLS connection
    finally:
        await bus.close()


def test_a_plaintext_client_is_refused_before_the_protocol(env):
    """A plain socket speaking NATS: no INFO comes back, its CONNECT and PING get no PONG, the server hangs up."""
    with socket.create_connection(_host_port(env.nats_url), timeout=5) as sock:
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    assert b"INFO" not in received and b"PONG" not in received, received


async def test_a_plaintext_nats_client_with_a_valid_key_is_refused(env):
    with pytest.raises((nats.errors.Error, OSError, TimeoutError)):
        await nats.connect(
            env.nats_url,
            nkeys_seed=str(env.credential("decider").seed_file),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )


async def test_a_client_trusting_another_ca_refuses_the_server(env, tmp_path):
    other = ensure_tls(tmp_path / "other-ca")  # a CA of someone else's, as an impostor server would have
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        await nats.connect(
            env.nats_url,
            nkeys_seed=str(env.credential("decider").seed_file),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
            tls=client_context(other.ca_file),
            tls_handshake_first=True,
        )


async def test_a_name_the_certificate_does_not_hold_is_refused(env):
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|doesn't match|not valid for"):
        await nats.connect(
            env.nats_url,
            nkeys_seed=str(env.credential("decider").seed_file),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
            tls=client_context(env.keys.directory / "ca.pem"),
            tls_hostname="nats.elsewhere.example",
            tls_handshake_first=True,
        )


def test_the_ca_key_never_reaches_the_role_keys_folder(env):
    assert not list(env.keys.directory.glob("*.key")), list(env.keys.directory.iterdir())
    assert "PRIVATE KEY" not in (env.keys.directory / "ca.pem").read_text()

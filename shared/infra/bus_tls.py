"""TLS for the bus: a CA of the installation's own, a server certificate it signs, and the client side
that trusts only that CA.

`adc secrets init` and `adc up` make them (`ensure_tls`): the CA's key stays in the TLS folder
(owner-only) and signs the server's certificate; the CA's certificate (no secret) is copied into the
role-keys folder as `ca.pem`, so every process that is given a role key is given the CA to check the
server against (shared/infra/bus.py: a credential whose folder holds `ca.pem` connects only over TLS,
verifying the server's name and chain). nats-server runs with `handshake_first`: the TLS handshake
comes before anything else, so a plaintext client is refused before it can send a byte of protocol
and a man in the middle cannot strip TLS off by rewriting the server's first line.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

CA_FILE = "ca.pem"  # the name of the CA's certificate beside the role keys
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
_VALID_DAYS = 825  # what browsers and most TLS stacks accept for a leaf; the CA lives ten years


@dataclass(frozen=True)
class ServerTls:
    """The files nats-server's `tls {}` block names."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def config_block(self) -> str:
        return (
            "tls {\n"
            f'  cert_file: "{self.cert_file}"\n'
            f'  key_file: "{self.key_file}"\n'
            "  handshake_first: true  # TLS before any protocol: plaintext and downgrades are refused\n"
            "  timeout: 5\n"
            "}\n"
        )


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ADC"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


def _san(hosts) -> list:
    from cryptography import x509

    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _new_ca(folder: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("ADC bus CA"))
        .issuer_name(_name("ADC bus CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(
        folder / "ca.key",
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    _write_public(folder / CA_FILE, cert.public_bytes(serialization.Encoding.PEM))


def _server_hosts(cert_file: Path) -> set[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))


def _new_server_cert(folder: Path, hosts: tuple[str, ...]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((folder / CA_FILE).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(
        folder / "server.key",
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    _write_public(folder / "server.pem", cert.public_bytes(serialization.Encoding.PEM))


def ensure_tls(folder: str | os.PathLike, hosts: tuple[str, ...] = DEFAULT_HOSTS) -> ServerTls:
    """The installation's CA and nats-server's certificate in `folder`, made if missing. An existing CA is
    kept (clients already trust it); the server certificate is made again when it lacks one of `hosts`."""
    folder = Path(folder).resolve()  # nats-server's config names these files: absolute, whatever its cwd
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    if not (folder / "ca.key").exists() or not (folder / CA_FILE).exists():
        _new_ca(folder)
        (folder / "server.pem").unlink(missing_ok=True)
    if not (folder / "server.pem").exists() or not set(hosts) <= _server_hosts(folder / "server.pem"):
        _new_server_cert(folder, tuple(hosts))
    return ServerTls(folder / "server.pem", folder / "server.key", folder / CA_FILE)


def give_ca(tls: ServerTls, keys_dir: str | os.PathLike) -> Path:
    """Put the CA's certificate beside the role keys, where every client finds it."""
    target = Path(keys_dir) / CA_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_public(target, tls.ca_file.read_bytes())
    return target


def client_context(ca_file: str | os.PathLike) -> ssl.SSLContext:
    """A client's TLS: only servers whose certificate chains to `ca_file` and names the host dialled."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context

"""egressd's own CA: an ECDSA P-256 key and certificate that mitmproxy signs leaf certificates with.

The files use mitmproxy's names so the CA directory doubles as mitmproxy's confdir:
`mitmproxy-ca.pem` (key and certificate, mode 0600) and `mitmproxy-ca-cert.pem` (certificate, for clients).
"""

import datetime
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from egressd.files import write_atomic

KEY_AND_CERT = "mitmproxy-ca.pem"
CERT = "mitmproxy-ca-cert.pem"
VALIDITY = datetime.timedelta(days=3650)


class CAError(RuntimeError):
    pass


def ensure_ca(ca_dir: Path, common_name: str = "egressd CA") -> Path:
    """The CA directory, with a CA made on first use; refuses a key that others can read."""
    key_file = ca_dir / KEY_AND_CERT
    if not key_file.exists():
        _create(ca_dir, common_name)
    mode = stat.S_IMODE(key_file.stat().st_mode)
    if mode & 0o077:
        raise CAError(f"{key_file}: the CA key is readable by others (mode {mode:04o}); chmod 600 it")
    cert_file = ca_dir / CERT
    if not cert_file.exists():
        cert = x509.load_pem_x509_certificate(key_file.read_bytes())
        write_atomic(cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return ca_dir


def _create(ca_dir: Path, common_name: str) -> None:
    ca_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "egressd")])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    write_atomic(ca_dir / KEY_AND_CERT, key_pem + cert_pem, 0o600)
    write_atomic(ca_dir / CERT, cert_pem, 0o644)


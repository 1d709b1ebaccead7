"""The run's TLS bundle: mutual TLS between actors and learners (`--transport_tls`), no set-up.

A run that asks for it gets its own certificate authority, made once with one certificate
(name `TARGET_NAME`, for servers and clients alike) that the learners serve with and the actors
connect with; each side accepts only a peer whose certificate that authority signed. The
authority's private key is thrown away once it has signed: nobody, not even the run's owner,
can make another certificate for the run, so holding the bundle is being part of the run, as
holding the run secret (`impala/run_secret.py`) is. The secret still authenticates every call;
the bundle adds encryption, and keeps out whoever lacks the file.

One file, `tls.pem`, beside the run secret (in the run folder, or beside `--secret_file`), holds
the certificate, its private key and the authority's certificate, in that order. It is handled
as the secret is: owner-only from its first byte, written whole before it appears, and refused
when it is a link, belongs to someone else or others can read it. Launchers make it beside the
secret and copy it wherever they copy the secret; learner 0 makes it if it is missing.

This module needs only the standard library and `cryptography` (as paramiko does): launchers
use it too. The gRPC credentials import `grpc` when asked for.

  python -m impala.run_tls new runs/pong/tls.pem           # create (refuses to overwrite)
  python -m impala.run_tls new runs/pong/tls.pem --force   # replace (stop the run first)
  python -m impala.run_tls check runs/pong/tls.pem         # is it usable?
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import secrets
import sys

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from impala import owner_only

FILE_NAME = "tls.pem"  # beside the run secret
# The name in the run's certificate. Actors dial learners by address or host name and check
# the learner's certificate for this name instead (`CHANNEL_OPTIONS`).
TARGET_NAME = "impala-run"
CHANNEL_OPTIONS = (("grpc.ssl_target_name_override", TARGET_NAME),)
# Back-dated a day, so that a host whose clock is behind accepts a bundle made just now.
_VALID_DAYS = 3650
_BACKDATE = datetime.timedelta(days=1)
_MAX_BYTES = 64 * 1024  # a bundle is about 2 KB
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----\r?\n[A-Za-z0-9+/=\r\n]*?-----END \1-----")
_LABELS = ["CERTIFICATE", "PRIVATE KEY", "CERTIFICATE"]


class TlsError(ValueError):
    """A TLS bundle that cannot be used; the message names the file and says why."""


@dataclasses.dataclass(frozen=True)
class Material:
    """A run's TLS bundle, each part as PEM bytes.

    Attributes:
      ca: the run's certificate authority's certificate: a peer is trusted if it signed its.
      certificate: the run's certificate (name `TARGET_NAME`), which the authority signed.
      private_key: the certificate's private key (not shown in the repr).
    """

    ca: bytes
    certificate: bytes
    private_key: bytes = dataclasses.field(repr=False)

    def pem(self) -> str:
        """The bundle as its file holds it: certificate, private key, authority."""
        return b"".join((self.certificate, self.private_key, self.ca)).decode("ascii")


def path_in(run_dir: str) -> str:
    """Where a run folder keeps its TLS bundle (beside its secret)."""
    return os.path.join(run_dir, FILE_NAME)


def beside(secret_file: str) -> str:
    """The TLS bundle in the folder of the run secret `secret_file`: where every process of a
    run looks for it, so that it needs no flag of its own."""
    return os.path.join(os.path.dirname(secret_file), FILE_NAME)


def create(path: str, *, overwrite: bool = False) -> Material:
    """Makes a new certificate authority and certificate for a run, and writes the bundle to
    `path` (owner-only, written in full before it appears). The authority's key is not kept.

    Args:
      path: the file to write; its folder must exist.
      overwrite: replace an existing bundle; otherwise an existing file is an error.

    Raises:
      TlsError: `path` exists (and not `overwrite`) or cannot be written.
    """
    material = _new_material()
    _write(path, material.pem(), overwrite)
    return material


def write(path: str, pem_text: str) -> None:
    """Writes the bundle `pem_text` (another file's, e.g. a launcher copying it) to `path`,
    replacing what is there, owner-only and in full before it appears.

    Raises:
      TlsError: `pem_text` is not a run's TLS bundle, or `path` cannot be written.
    """
    try:
        _parse(pem_text.encode("ascii"))
    except (TlsError, UnicodeEncodeError):
        raise TlsError(
            f"{path}: refusing to write something that is not a run's TLS bundle"
        ) from None
    _write(path, pem_text, overwrite=True)


def ensure(path: str) -> tuple[Material, bool]:
    """The bundle at `path`, created first if there is none. Returns (material, created)."""
    try:
        return create(path), True
    except TlsError:
        if not os.path.lexists(path):
            raise
    return load(path), False


def load(path: str) -> Material:
    """Reads and checks the bundle at `path`.

    Raises:
      TlsError: naming the file and what is wrong: missing, a link or not a regular file,
        owned by someone else, readable or writable by others, or not a bundle whose
        certificate its authority signed.
    """
    try:
        content = owner_only.read(path, _MAX_BYTES + 1)
    except FileNotFoundError:
        raise TlsError(
            f"{path}: no TLS bundle here (--transport_tls); the learner's run folder has it, "
            f"beside the run secret (copy it there, owner-only), or create one with "
            f"`python -m impala.run_tls new {path}`"
        ) from None
    except owner_only.UnsafeFileError as error:
        raise TlsError(f"{path}: the TLS bundle {error}") from None
    except OSError as error:
        raise TlsError(f"{path}: cannot read the TLS bundle: {error.strerror}") from None
    try:
        return _parse(content)
    except TlsError as error:
        raise TlsError(
            f"{path}: not a run's TLS bundle ({error}); write a new one with "
            f"`python -m impala.run_tls new {path} --force` and copy it beside every copy of "
            "the run secret"
        ) from None


def server_credentials(material: Material):
    """A learner's `grpc.ServerCredentials`: serves with the run's certificate and accepts only
    clients that show a certificate the run's authority signed."""
    import grpc  # here: launchers use this module without gRPC

    return grpc.ssl_server_credentials(
        [(material.private_key, material.certificate)],
        root_certificates=material.ca,
        require_client_auth=True,
    )


def channel_credentials(material: Material):
    """An actor's `grpc.ChannelCredentials`: shows the run's certificate and accepts only a
    server whose certificate the run's authority signed. Open the channel with
    `options=CHANNEL_OPTIONS`: the learner's certificate names `TARGET_NAME`, not its host."""
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=material.ca,
        private_key=material.private_key,
        certificate_chain=material.certificate,
    )


def _new_material() -> Material:
    """A fresh authority, and a certificate for servers and clients that it signed."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    # A name of its own, so that an error can tell two runs' authorities apart.
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"{TARGET_NAME} CA {secrets.token_hex(4)}")]
    )
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TARGET_NAME)])
    leaf = (
        _builder(leaf_name, ca_name, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(TARGET_NAME)]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    del ca_key  # never written: no further certificate can be made for the run
    return Material(
        ca=ca.public_bytes(serialization.Encoding.PEM),
        certificate=leaf.public_bytes(serialization.Encoding.PEM),
        private_key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _builder(subject, issuer, public_key, now) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _parse(content: bytes) -> Material:
    """The bundle in `content`, checked: its three parts in order, the key the certificate's,
    the certificate signed by the authority, for `TARGET_NAME` and not expired.

    Raises:
      TlsError: saying what is wrong, without the file's name.
    """
    if len(content) > _MAX_BYTES:
        raise TlsError(f"larger than {_MAX_BYTES} bytes")
    blocks = list(_PEM_BLOCK.finditer(content))
    labels = [block[1].decode() for block in blocks]
    leftover = _PEM_BLOCK.sub(b"", content).strip()
    if labels != _LABELS or leftover:
        raise TlsError("expected a certificate, its private key and the authority's certificate")
    certificate, private_key, ca = (_with_newline(block[0]) for block in blocks)
    try:
        leaf = x509.load_pem_x509_certificate(certificate)
        authority = x509.load_pem_x509_certificate(ca)
        key = serialization.load_pem_private_key(private_key, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise TlsError("a part does not parse") from None
    if _public_der(key.public_key()) != _public_der(leaf.public_key()):
        raise TlsError("the private key is not the certificate's")
    try:
        leaf.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        raise TlsError("the certificate is not signed by the authority in the file") from None
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = x509.SubjectAlternativeName([])
    if TARGET_NAME not in names.get_values_for_type(x509.DNSName):
        raise TlsError(f"the certificate is not for {TARGET_NAME}")
    expiry = min(leaf.not_valid_after_utc, authority.not_valid_after_utc)
    if expiry <= datetime.datetime.now(datetime.UTC):
        raise TlsError(f"expired on {expiry:%Y-%m-%d}")
    return Material(ca=ca, certificate=certificate, private_key=private_key)


def _with_newline(block: bytes) -> bytes:
    return block.replace(b"\r\n", b"\n") + b"\n"


def _public_der(public_key) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _write(path: str, text: str, overwrite: bool) -> None:
    try:
        owner_only.write(path, text.encode("ascii"), overwrite=overwrite)
    except FileExistsError:
        raise TlsError(
            f"{path}: a TLS bundle exists already (replace it with "
            f"`python -m impala.run_tls new {path} --force`)"
        ) from None
    except OSError as error:
        raise TlsError(f"{path}: cannot write the TLS bundle: {error.strerror}") from None


def main(argv: list[str]) -> int:
    usage = "usage: python -m impala.run_tls {new FILE [--force] | check FILE}"
    args = [a for a in argv[1:] if a != "--force"]
    force = "--force" in argv[1:]
    if len(args) != 2 or args[0] not in ("new", "check") or (force and args[0] != "new"):
        print(usage, file=sys.stderr)
        return 2
    command, path = args
    try:
        if command == "new":
            create(path, overwrite=force)
            print(f"{path}: new TLS bundle written (owner-only), the run's own authority")
        else:
            authority = x509.load_pem_x509_certificate(load(path).ca)
            print(
                f"{path}: a usable TLS bundle ({authority.subject.rfc4514_string()}, valid "
                f"until {authority.not_valid_after_utc:%Y-%m-%d})"
            )
    except TlsError as error:
        print(f"run_tls: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

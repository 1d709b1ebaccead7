"""The run's TLS bundle: real gRPC servers and clients on loopback accept the run's own
certificate and nothing else, and the file is handled as the run secret is."""

import contextlib
import os
import stat
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from impala import run_tls
from tests.helpers import ROOT

_METHOD = "/impala.test.Echo/Echo"
_CALL_SECS = 5.0


def _echo(request: bytes, context) -> bytes:
    return b"echo " + request


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    return run_tls.create(str(tmp_path_factory.mktemp("a") / run_tls.FILE_NAME))


@pytest.fixture(scope="module")
def run_b(tmp_path_factory):
    return run_tls.create(str(tmp_path_factory.mktemp("b") / run_tls.FILE_NAME))


@contextlib.contextmanager
def _server(material):
    """A learner-like server on 127.0.0.1 with `material`'s credentials; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(_echo)  # raw bytes: no (de)serializer
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("impala.test.Echo", {"Echo": handler}),)
    )
    port = server.add_secure_port("127.0.0.1:0", run_tls.server_credentials(material))
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def _call(channel: grpc.Channel) -> bytes:
    with channel:
        return channel.unary_unary(_METHOD)(b"hello", timeout=_CALL_SECS)


def _tls_channel(address, credentials):
    return grpc.secure_channel(address, credentials, options=run_tls.CHANNEL_OPTIONS)


def test_a_client_with_the_runs_bundle_is_answered(run_a):
    with _server(run_a) as address:
        assert _call(_tls_channel(address, run_tls.channel_credentials(run_a))) == b"echo hello"


def test_the_client_checks_the_runs_name_not_the_address_it_dials(run_a):
    # Without CHANNEL_OPTIONS it checks the certificate for "127.0.0.1", which it does not name.
    with _server(run_a) as address, pytest.raises(grpc.RpcError):
        _call(grpc.secure_channel(address, run_tls.channel_credentials(run_a)))


def test_a_plaintext_client_is_refused(run_a):
    with _server(run_a) as address, pytest.raises(grpc.RpcError) as refused:
        _call(grpc.insecure_channel(address))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_without_a_certificate_is_refused(run_a):
    # It trusts the server (the run's authority), but shows no certificate of its own.
    credentials = grpc.ssl_channel_credentials(root_certificates=run_a.ca)
    with _server(run_a) as address, pytest.raises(grpc.RpcError) as refused:
        _call(_tls_channel(address, credentials))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_of_another_run_is_refused(run_a, run_b):
    # It trusts the server (this run's authority), but shows another run's certificate.
    credentials = grpc.ssl_channel_credentials(
        root_certificates=run_a.ca,
        private_key=run_b.private_key,
        certificate_chain=run_b.certificate,
    )
    with _server(run_a) as address, pytest.raises(grpc.RpcError) as refused:
        _call(_tls_channel(address, credentials))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_refuses_the_server_of_another_run(run_a, run_b):
    # A server that would take any client: only the client's check can refuse it.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    handler = grpc.unary_unary_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("impala.test.Echo", {"Echo": handler}),)
    )
    credentials = grpc.ssl_server_credentials([(run_b.private_key, run_b.certificate)])
    address = f"127.0.0.1:{server.add_secure_port('127.0.0.1:0', credentials)}"
    server.start()
    try:
        with pytest.raises(grpc.RpcError) as refused:
            _call(_tls_channel(address, run_tls.channel_credentials(run_a)))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert _call(_tls_channel(address, run_tls.channel_credentials(run_b))) == b"echo hello"
    finally:
        server.stop(grace=None)


def test_a_new_bundle_is_owner_only_whole_and_holds_no_authority_key(tmp_path):
    path = tmp_path / run_tls.FILE_NAME
    material = run_tls.create(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == [run_tls.FILE_NAME]  # no temporary file left
    content = path.read_bytes()
    assert content.decode() == material.pem() and run_tls.load(str(path)) == material
    assert content.count(b"PRIVATE KEY-----") == 2  # one key: BEGIN and END
    leaf, ca = (x509.load_pem_x509_certificate(p) for p in (material.certificate, material.ca))
    key = serialization.load_pem_private_key(material.private_key, password=None)
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(*der) == leaf.public_key().public_bytes(*der)
    assert key.public_key().public_bytes(*der) != ca.public_key().public_bytes(*der)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [run_tls.TARGET_NAME]
    assert run_tls.create(str(tmp_path / "other.pem")).ca != material.ca
    assert "PRIVATE" not in repr(material)  # a logged bundle shows no key


def test_creating_never_overwrites_but_forcing_does_and_ensure_reads(tmp_path):
    path = str(tmp_path / run_tls.FILE_NAME)
    material, created = run_tls.ensure(path)
    assert created and run_tls.ensure(path) == (material, False)
    with pytest.raises(run_tls.TlsError, match="a TLS bundle exists already"):
        run_tls.create(path)
    replaced = run_tls.create(path, overwrite=True)
    assert replaced != material and run_tls.load(path) == replaced


def test_write_copies_a_bundle_owner_only_and_refuses_anything_else(tmp_path):
    material = run_tls.create(str(tmp_path / "made.pem"))
    copy = tmp_path / "copy" / run_tls.FILE_NAME
    copy.parent.mkdir()
    run_tls.write(str(copy), material.pem())
    assert run_tls.load(str(copy)) == material and stat.S_IMODE(copy.stat().st_mode) == 0o600
    with pytest.raises(run_tls.TlsError, match="refusing to write"):
        run_tls.write(str(copy), "0123" * 16 + "\n")  # a run secret, say
    assert run_tls.load(str(copy)) == material


def test_a_bundle_others_can_read_a_link_and_a_folder_are_refused(tmp_path):
    path = tmp_path / run_tls.FILE_NAME
    run_tls.create(str(path))
    os.chmod(path, 0o644)
    with pytest.raises(run_tls.TlsError, match=r"open to other users \(mode 0644\); chmod 600"):
        run_tls.load(str(path))
    os.chmod(path, 0o600)
    (tmp_path / "link.pem").symlink_to(path)
    with pytest.raises(run_tls.TlsError, match="is a link"):
        run_tls.load(str(tmp_path / "link.pem"))
    with pytest.raises(run_tls.TlsError, match="regular file"):
        run_tls.load(str(tmp_path))
    with pytest.raises(run_tls.TlsError, match=r"no TLS bundle here.*impala\.run_tls new"):
        run_tls.load(str(tmp_path / "missing.pem"))


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_a_bundle_of_another_user_is_refused(tmp_path):
    path = tmp_path / run_tls.FILE_NAME
    run_tls.create(str(path))
    os.chown(path, 65534, 65534)  # nobody
    with pytest.raises(run_tls.TlsError, match=r"belongs to another user \(uid 65534\)"):
        run_tls.load(str(path))


def _bundles(tmp_path):
    """Bundles that are not a run's: (test id, content)."""
    a = run_tls.create(str(tmp_path / "a.pem"))
    b = run_tls.create(str(tmp_path / "b.pem"))
    whole = a.pem().encode()
    return {
        "empty": b"",
        "garbage": b"not a bundle\n",
        "truncated": whole[: len(whole) // 2],
        "no-authority": a.certificate + a.private_key,
        "reordered": a.private_key + a.certificate + a.ca,
        "another-authority": a.certificate + a.private_key + b.ca,
        "another-key": a.certificate + b.private_key + a.ca,
        "trailing-junk": whole + b"junk\n",
        "broken-base64": whole.replace(b"MII", b"MIX", 1),
        "huge": whole + b"\n" * 70_000,
    }


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "garbage",
        "truncated",
        "no-authority",
        "reordered",
        "another-authority",
        "another-key",
        "trailing-junk",
        "broken-base64",
        "huge",
    ],
)
def test_a_file_that_holds_no_bundle_is_refused_in_one_line(tmp_path, case):
    path = tmp_path / run_tls.FILE_NAME
    path.write_bytes(_bundles(tmp_path)[case])
    os.chmod(path, 0o600)
    with pytest.raises(run_tls.TlsError) as refused:
        run_tls.load(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}: not a run's TLS bundle (") and "\n" not in message
    assert f"python -m impala.run_tls new {path} --force" in message


def test_the_bundle_is_found_beside_the_secret():
    assert run_tls.beside("/w/runs/pong/secret") == "/w/runs/pong/tls.pem"
    assert run_tls.beside("pong.secret") == "tls.pem"
    assert run_tls.path_in("/w/runs/pong") == "/w/runs/pong/tls.pem"


def test_the_command_line_creates_checks_and_replaces(tmp_path):
    path = str(tmp_path / run_tls.FILE_NAME)

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "impala.run_tls", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("new", path).returncode == 0
    material = run_tls.load(path)
    checked = run("check", path)
    assert checked.returncode == 0 and "a usable TLS bundle" in checked.stdout
    assert "PRIVATE" not in checked.stdout + checked.stderr
    again = run("new", path)
    assert again.returncode == 1 and "exists already" in again.stderr
    assert run("new", path, "--force").returncode == 0 and run_tls.load(path) != material
    missing = run("check", str(tmp_path / "none.pem"))
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert run("check", path, "--force").returncode == 2

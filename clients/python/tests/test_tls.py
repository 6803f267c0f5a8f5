"""TLS and client certificates.

`oncekv serve` has no TLS listener yet, so these run the client against a
gRPC server of the same `Kv` service in this process, over TLS with
certificates made by `openssl`: they check the channel credentials (the
CA, the server's name, the client certificate), not the node.
"""

from __future__ import annotations

import subprocess
from concurrent import futures

import grpc
import pytest

from oncekv import Client, Unreachable
from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc


def openssl(folder, *args):
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)


def issue(folder, name, ca, subject, san=None):
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(folder, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
    extra = []
    if san:
        (folder / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        extra = ["-extfile", f"{name}.ext"]
    openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1", "-subj", f"/CN={ca}")  # fmt: skip
    issue(folder, "server", "ca", "/CN=node", "IP:127.0.0.1,DNS:localhost")
    issue(folder, "alice", "ca", "/CN=alice")
    return folder


class Echo(kv_pb2_grpc.KvServicer):
    """Answers a GET with the client certificate's Common Name."""

    def Read(self, request, context):
        names = context.auth_context().get("x509_common_name", [b"none"])
        return pb.ReadResponse(reply=pb.Reply(get=pb.OptionalValue(value=names[0])))


@pytest.fixture
def tls_server(pki):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    kv_pb2_grpc.add_KvServicer_to_server(Echo(), server)
    credentials = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_a_client_certificate_over_tls(pki, tls_server):
    with Client([f"https://{tls_server}"], ca_cert=pki / "ca.pem", cert=pki / "alice.pem",
                key=pki / "alice.key", timeout=5) as client:  # fmt: skip
        assert client.uses_tls
        assert client.get("k") == b"alice"
    # Plain host:port with ca_cert is TLS too; PEM bytes work as well as files.
    with Client([tls_server], ca_cert=(pki / "ca.pem").read_bytes(), cert=(pki / "alice.pem").read_bytes(),
                key=(pki / "alice.key").read_bytes(), timeout=5) as client:  # fmt: skip
        assert client.get("k") == b"alice"


def test_a_server_the_ca_did_not_sign_is_unreachable_and_nothing_is_sent(pki, tls_server):
    with Client([tls_server], ca_cert=pki / "other-ca.pem", cert=pki / "alice.pem",
                key=pki / "alice.key", timeout=1) as client:  # fmt: skip
        with pytest.raises(Unreachable) as unreachable:
            client.put("k", "v")
        assert unreachable.value.not_applied
    with Client([tls_server], ca_cert=pki / "ca.pem", timeout=1) as client:  # no client certificate
        with pytest.raises(Unreachable):
            client.put("k", "v")

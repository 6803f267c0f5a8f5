"""TLS and client certificates against a real node: certificates made at
test time by `oncekv certs`, one `oncekv serve` with TLS on its client
port and client certificates required (`--client-ca-file`)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import Node, eventually, node_env
from oncekv import Client, Unreachable


def oncekv(binary, *args):
    return subprocess.run(
        [str(binary), *args], env=node_env(), capture_output=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def pki(oncekv_bin, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    for args in (
        ["create-ca", "--dir", str(folder / "ca")],
        ["create-node", "--dir", str(folder / "ca"), "--id", "1", "--host", "127.0.0.1"],
        ["create-client", "--dir", str(folder / "ca"), "--user", "alice"],
        ["create-ca", "--dir", str(folder / "other")],
    ):
        made = oncekv(oncekv_bin, "certs", *args)
        assert made.returncode == 0, made.stderr.decode()
    return folder


@pytest.fixture(scope="module")
def tls_node(oncekv_bin, pki, tmp_path_factory):
    ca = pki / "ca"
    node = Node(oncekv_bin, 1, tmp_path_factory.mktemp("tls-node"))
    node.args = [
        "serve", "--id", "1", "--data-dir", str(node.data_dir),
        "--listen-client", node.client, "--listen-peer", node.peer,
        "--cert-file", str(ca / "node-1.pem"), "--key-file", str(ca / "node-1-key.pem"),
        "--client-ca-file", str(ca / "ca.pem"),
    ]  # fmt: skip
    node.start()

    def healthy():
        asked = oncekv(
            oncekv_bin, "endpoint", "health", "--endpoints", node.client,
            "--cacert", str(ca / "ca.pem"), "--cert", str(ca / "client-alice.pem"),
            "--key", str(ca / "client-alice-key.pem"), "--timeout", "2s",
        )  # fmt: skip
        return asked.returncode == 0

    try:
        eventually(healthy, 20, "the TLS node to serve")
        yield node
    finally:
        node.stop()


def test_a_client_certificate_over_tls(pki, tls_node):
    ca = pki / "ca"
    with Client([f"https://{tls_node.client}"], ca_cert=ca / "ca.pem", cert=ca / "client-alice.pem",
                key=ca / "client-alice-key.pem", timeout=10) as client:  # fmt: skip
        assert client.uses_tls
        client.put("k", "v")
        assert client.get("k") == b"v"
    # Plain host:port with ca_cert is TLS too; PEM bytes work as well as files.
    with Client([tls_node.client], ca_cert=(ca / "ca.pem").read_bytes(),
                cert=(ca / "client-alice.pem").read_bytes(),
                key=(ca / "client-alice-key.pem").read_bytes(), timeout=10) as client:  # fmt: skip
        assert client.get("k") == b"v"


def test_a_node_the_ca_did_not_sign_is_unreachable_and_nothing_is_sent(pki, tls_node):
    ca = pki / "ca"
    with Client([tls_node.client], ca_cert=pki / "other" / "ca.pem", cert=ca / "client-alice.pem",
                key=ca / "client-alice-key.pem", timeout=1) as client:  # fmt: skip
        with pytest.raises(Unreachable) as unreachable:
            client.put("k", "w")
        assert unreachable.value.not_applied
    with Client([tls_node.client], ca_cert=ca / "ca.pem", timeout=1) as client:  # no client certificate
        with pytest.raises(Unreachable):
            client.put("k", "w")

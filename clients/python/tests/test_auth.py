"""Users and permissions, set up with the oncekv command line."""

from __future__ import annotations

import os
import subprocess

import pytest

from oncekv import Client, PermissionDenied, Unauthenticated


def test_a_user_writes_inside_her_grants_only(make_cluster, oncekv_bin):
    cluster = make_cluster(1)
    endpoint = cluster.endpoints[0]
    env = {k: v for k, v in os.environ.items() if k not in ("ONCEKV_USER", "ONCEKV_PASSWORD")}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [str(oncekv_bin), *args, "--endpoints", endpoint],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"oncekv {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    cli("user", "add", "root", "--password", "pw")
    cli("user", "grant-role", "root", "admin")
    cli("role", "add", "app")
    cli("role", "grant", "app", "readwrite", "app/", "--prefix")
    cli("user", "add", "alice", "--password", "apw")
    cli("user", "grant-role", "alice", "app")
    cli("auth", "enable")

    with Client(endpoint, user="alice", password="apw", timeout=10) as alice:
        assert alice.put("app/x", "1").value is None
        assert alice.get("app/x") == b"1"
        with pytest.raises(PermissionDenied) as denied:
            alice.put("other/x", "1")
        assert denied.value.not_applied
        with pytest.raises(PermissionDenied):
            alice.get("other/x")
        with alice.open_session() as session:
            assert session.incr("app/n").value == 1
        # A token the node does not accept (expired, forged): the client
        # logs in again once and the call goes through.
        alice._token = "forged"
        assert alice.incr("app/n").value == 2
        # Watches: inside her grants (a forged token logs in again once),
        # and a definite refusal outside them.
        start = alice.put("app/w", "1").applied_index
        alice._token = "forged"
        with alice.watch("app/", prefix=True, start_revision=start) as watcher:
            changes = watcher.next(timeout=10)
            assert (changes.revision, changes.events[0].key) == (start, b"app/w")
        with alice.watch("other/", prefix=True) as watcher:
            with pytest.raises(PermissionDenied) as denied:
                watcher.next(timeout=10)
            assert denied.value.not_applied

    with Client(endpoint, timeout=10) as nobody:
        with pytest.raises(Unauthenticated) as unauthenticated:
            nobody.put("app/x", "2")
        assert unauthenticated.value.not_applied
    with Client(endpoint, user="alice", password="wrong", timeout=10) as impostor:
        with pytest.raises(Unauthenticated):
            impostor.get("app/x")
    with Client(endpoint, user="root", password="pw", timeout=10) as root:
        assert root.get("other/x") is None
        assert root.get("app/x") == b"1"

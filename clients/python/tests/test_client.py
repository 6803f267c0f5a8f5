"""The client's calls and outcomes against a real 3-node cluster."""

from __future__ import annotations

import threading

import pytest

from oncekv import (
    Client,
    Invalid,
    OutcomeUnknown,
    Rejected,
    RequestMismatch,
    SequenceGap,
    Stale,
    Unreachable,
)
from oncekv.client import incr_command, put_command

from conftest import free_port


@pytest.fixture
def client(cluster3):
    with Client(cluster3.endpoints, timeout=20) as client:
        yield client


def test_a_session_retry_with_the_same_seq_is_replayed_with_the_original_reply(client):
    # The lesson: the first attempt applied, its reply was lost; the retry
    # carries the same sequence number and gets the original answer back,
    # without applying the increment a second time.
    with client.open_session() as session:
        first = session.incr("lesson", by=5)
        assert (first.value, first.replayed) == (5, False)
        assert session.next_seq == 2
        retry = session.execute_seq(1, incr_command("lesson", 5))
        assert retry.replayed is True
        assert retry.value == 5
        assert retry.applied_index == first.applied_index
        assert client.get("lesson") == b"5"
        # The next new request applies once more, as it should.
        assert session.incr("lesson", by=5).value == 10


def test_a_one_shot_incr_rerun_with_its_idempotency_key_is_replayed(client):
    first = client.incr("visits", idempotency_key="run-1")
    assert (first.value, first.replayed) == (1, False)
    again = client.incr("visits", idempotency_key="run-1")
    assert (again.value, again.replayed) == (1, True)
    assert again.applied_index == first.applied_index
    assert client.get("visits") == b"1"
    # A fresh key is a new request.
    assert client.incr("visits").value == 2
    # The same key for another command is refused, not applied.
    with pytest.raises(RequestMismatch) as refused:
        client.incr("visits", by=7, idempotency_key="run-1")
    assert refused.value.not_applied
    assert client.get("visits") == b"2"


def test_plain_values_and_results(client):
    assert client.get("absent") is None
    put = client.put("fruit/apple", "red")
    assert put.value is None and not put.replayed and put.applied_index > 0
    assert client.put("fruit/apple", b"green").value == b"red"
    assert client.append("fruit/apple", "ish").value == len("greenish")
    assert client.get("fruit/apple") == b"greenish"
    client.put("fruit/banana", "yellow")
    client.put("vegetable/leek", "white")
    assert client.scan("fruit/") == [(b"fruit/apple", b"greenish"), (b"fruit/banana", b"yellow")]
    page = client.scan("fruit/", limit=1)
    assert page == [(b"fruit/apple", b"greenish")] and page.more
    swapped = client.cas("fruit/apple", "greenish", "ripe")
    assert swapped.swapped and swapped.value
    missed = client.cas("fruit/apple", "greenish", "rotten")
    assert not missed.swapped and missed.current == b"ripe"
    assert client.cas("fruit/cherry", None, "dark").swapped
    assert client.delete("fruit/banana").value == b"yellow"
    assert client.get("fruit/banana") is None


def test_a_definite_rejection_says_it_did_not_apply(client):
    client.put("text", "hello")
    with pytest.raises(Rejected) as rejected:
        client.incr("text")
    assert rejected.value.kind == "not_an_integer"
    assert rejected.value.not_applied
    with pytest.raises(Invalid) as invalid:
        client.put("k", "v", idempotency_key=b"x" * 129)
    assert invalid.value.not_applied


def test_leases(client):
    grant = client.lease_grant("worker", ttl_ms=30000)
    assert grant.name == "worker" and grant.ttl_ms == 30000 and grant.expires_at_ms > 0
    with pytest.raises(Rejected) as exists:
        client.lease_grant("worker", ttl_ms=30000)
    assert exists.value.kind == "lease_exists"
    client.put("lock/worker", "me", lease="worker")
    (lease,) = [lease for lease in client.lease_list() if lease.name == "worker"]
    assert lease.keys == 1
    kept = client.lease_keep_alive("worker")
    assert kept.expires_at_ms >= grant.expires_at_ms
    revoked = client.lease_revoke("worker")
    assert revoked.keys_deleted == 1
    assert client.get("lock/worker") is None
    with pytest.raises(Rejected) as gone:
        client.lease_revoke("worker")
    assert gone.value.kind == "lease_not_found"


def test_session_refusals_are_typed_and_not_applied(client):
    with client.open_session(window=4) as session:
        assert session.put("s/a", "1").value is None
        with pytest.raises(RequestMismatch):
            session.execute_seq(1, put_command("s/a", "2"))
        with pytest.raises(SequenceGap) as gap:
            session.execute_seq(50, put_command("s/b", "1"))
        assert gap.value.expected == 2 and gap.value.not_applied
        # Acknowledge seq 1 with seq 2, then seq 1 is stale: its record is gone.
        assert session.put("s/c", "1").value is None
        with pytest.raises(Stale) as stale:
            session.execute_seq(1, put_command("s/a", "1"))
        assert stale.value.floor == 2 and stale.value.not_applied
        assert client.get("s/b") is None


def test_a_session_window_bounds_requests_in_flight_from_many_threads(client):
    with client.open_session(window=2) as session:
        values, errors = [], []

        def work():
            try:
                for _ in range(5):
                    values.append(session.incr("window").value)
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert sorted(values) == list(range(1, 21))
        assert session.next_seq == 21
        assert session.first_incomplete == 21


def test_nothing_listening_is_unreachable_and_not_applied():
    with Client([f"127.0.0.1:{free_port()}"], timeout=1) as client:
        with pytest.raises(Unreachable) as unreachable:
            client.put("k", "v")
        assert unreachable.value.not_applied
        assert not isinstance(unreachable.value, OutcomeUnknown)

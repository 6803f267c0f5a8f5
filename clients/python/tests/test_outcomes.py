"""An outcome that is not known is never reported as a definite failure."""

from __future__ import annotations

import threading

import pytest

from oncekv import Client, OutcomeUnknown, SessionExpired
from oncekv.client import incr_command, put_command

from conftest import connections_to, eventually


def test_a_plain_mutation_that_may_have_been_sent_is_outcome_unknown(make_cluster):
    cluster = make_cluster(1)
    node = cluster.node(1)
    with Client(cluster.endpoints, timeout=5, attempt_timeout=1) as client:
        assert client.put("k", "before").value is None  # connected
        node.pause()  # every node unreachable once the request is on its way
        try:
            with pytest.raises(OutcomeUnknown) as unknown:
                client.execute_plain(put_command("k", "after"))
            # A plain request is not retried once it may have been sent, and
            # is not reported as a failure: it may still apply.
            assert unknown.value.not_applied is False
            assert unknown.value.attempts == 1
            assert unknown.value.request_id is None
        finally:
            node.resume()
        assert client.get("k") in (b"before", b"after")


def test_a_keyed_request_retried_until_the_deadline_is_outcome_unknown_and_resolved_by_its_key(make_cluster):
    cluster = make_cluster(1)
    node = cluster.node(1)
    with Client(cluster.endpoints, timeout=3, attempt_timeout=1) as client:
        assert client.get("n") is None
        node.pause()
        try:
            with pytest.raises(OutcomeUnknown) as unknown:
                client.incr("n", idempotency_key="job-7")
            assert not unknown.value.not_applied
            assert unknown.value.attempts >= 2  # a keyed request is retried
        finally:
            node.resume()
        # Re-running it under the same key answers what happened, once.
        client.timeout = 20
        settled = client.incr("n", idempotency_key="job-7")
        assert settled.value == 1
        assert client.get("n") == b"1"


def test_a_session_request_left_unknown_is_settled_by_its_sequence_number(make_cluster):
    cluster = make_cluster(1)
    node = cluster.node(1)
    with Client(cluster.endpoints, timeout=3, attempt_timeout=1) as client:
        session = client.open_session()
        assert session.incr("m").value == 1
        node.pause()
        try:
            with pytest.raises(OutcomeUnknown) as unknown:
                session.incr("m")
            assert unknown.value.request_id == (session.session_id, 2)
            assert not unknown.value.not_applied
        finally:
            node.resume()
        client.timeout = 20
        settled = session.execute_seq(2, incr_command("m"))
        assert settled.value == 2
        assert session.incr("m").value == 3
        session.close()


def test_a_session_expired_answer_after_an_attempt_that_may_have_applied_is_outcome_unknown(make_cluster):
    # The Rust client's rule: a refusal that forgets the past (expired,
    # stale, unauthorized) says nothing about an earlier attempt that may
    # have applied, so the call ends with an unknown outcome.
    cluster = make_cluster(1)
    node = cluster.node(1)
    with Client(cluster.endpoints, timeout=30, attempt_timeout=0.3) as client:
        session = client.open_session(ttl_ms=200, keep_alive=False)
        assert session.incr("e").value == 1
        # Left idle, the session expires (the client has not heard).
        eventually(lambda: cluster.status(node).sessions == 0, 20, "the session to expire")
        before = connections_to(node.client)  # the client's, the fixture's
        node.pause()
        outcome = []

        def second():
            try:
                outcome.append(session.incr("e"))
            except Exception as error:  # noqa: BLE001 - checked below
                outcome.append(error)

        worker = threading.Thread(target=second)
        try:
            worker.start()
            # The first attempt timed out (it may have been sent) and the
            # client dialled again for the next.
            eventually(lambda: connections_to(node.client) > before, 20, "the client dialling again")
        finally:
            node.resume()
        worker.join(timeout=60)
        assert not worker.is_alive()
        (error,) = outcome
        assert isinstance(error, OutcomeUnknown), error
        assert error.request_id == (session.session_id, 2)
        assert session.expired is False  # not reported as a definite expiry
        assert client.get("e") == b"1"  # here it had not applied: unknown is honest
        with pytest.raises(SessionExpired):
            session.execute_seq(3, incr_command("e"))
        assert session.expired is True

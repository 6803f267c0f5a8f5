"""A leader SIGKILLed in the middle of a session's increments."""

from __future__ import annotations

import threading

from oncekv import Client

from conftest import eventually

N = 30


def test_a_leader_killed_during_a_session_of_increments_gives_exactly_one_to_n(make_cluster):
    cluster = make_cluster(3)
    leader = cluster.leader()
    with Client(cluster.endpoints, timeout=30, attempt_timeout=2) as client:
        session = client.open_session()
        values, attempts, errors = [], [], []

        def run():
            try:
                for _ in range(N):
                    result = session.incr("counter")
                    attempts.append(result.attempts)
                    values.append(result.value)
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

        worker = threading.Thread(target=run)
        worker.start()
        eventually(lambda: len(values) >= N // 3 or errors, 30, "a third of the increments")
        leader.kill()
        worker.join(timeout=120)
        assert not worker.is_alive(), "the increments did not finish in 120 s"
        assert errors == [], cluster.logs()
        # Every reply distinct, in order, none lost and none applied twice.
        assert values == list(range(1, N + 1))
        # The request after the kill found the leader gone and was resent.
        assert max(attempts) > 1, attempts
        assert cluster.leader() is not leader
        assert client.get("counter") == str(N).encode()
        session.close()

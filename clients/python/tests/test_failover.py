"""A leader SIGKILLed in the middle of a session's increments."""

from __future__ import annotations

import threading

import grpc
import pytest

from oncekv import Client, Unreachable
from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc
from oncekv.client import put_command

from conftest import eventually

N = 30


def test_a_leader_killed_during_a_session_of_increments_gives_exactly_one_to_n(make_cluster):
    cluster = make_cluster(3)
    leader = cluster.leader()
    with Client(cluster.endpoints, timeout=30, attempt_timeout=2) as client:
        session = client.open_session()
        values, attempts, errors = [], [], []
        killed = threading.Event()

        def run():
            try:
                for i in range(N):
                    if i == N // 3:
                        # The kill comes here, in the middle, however fast
                        # the increments run.
                        assert killed.wait(30), "the leader was not killed within 30 s"
                    result = session.incr("counter")
                    attempts.append(result.attempts)
                    values.append(result.value)
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

        worker = threading.Thread(target=run)
        worker.start()
        eventually(lambda: len(values) >= N // 3 or errors, 30, "a third of the increments")
        leader.kill()
        killed.set()
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


def test_without_a_quorum_a_plain_write_is_definitely_not_applied(make_cluster):
    cluster = make_cluster(3)
    leader = cluster.leader()
    survivor = next(n for n in cluster.nodes if n is not leader)
    for node in cluster.nodes:
        if node is not survivor:
            node.kill()

    def knows_no_leader():
        status = cluster.status(survivor)
        return not status.is_leader and not status.HasField("leader_id")

    eventually(knows_no_leader, 30, "the survivor to know no leader")
    # The node proposes nothing and says so: `not_proposed`.
    with grpc.insecure_channel(survivor.client, options=[("grpc.enable_http_proxy", 0)]) as channel:
        stub = kv_pb2_grpc.KvStub(channel)
        answer = stub.Execute(pb.ExecuteRequest(command=put_command("k", "v")), timeout=5)
    assert answer.failure.unavailable.not_proposed, answer
    # So even a plain write, which is never resent once it may have been
    # sent, is retried and ends as a definite failure, not an unknown one.
    with Client([survivor.client], timeout=1.5) as client:
        with pytest.raises(Unreachable) as unreachable:
            client.execute_plain(put_command("k", "v"))
        assert unreachable.value.not_applied

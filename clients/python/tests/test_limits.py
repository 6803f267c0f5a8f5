"""Full tables and shed requests: refused for now, not applied, retried."""

from __future__ import annotations

import threading

import grpc
import pytest
from conftest import eventually

from oncekv import Client, Overloaded
from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc
from oncekv.client import _failed, _shed_by_server


def test_a_full_session_table_is_retried_until_the_deadline_then_overloaded(make_cluster):
    cluster = make_cluster(1, ["--sessions-max", "1"])
    with Client(cluster.endpoints, timeout=1.5) as client:
        session = client.open_session()
        with pytest.raises(Overloaded) as full:
            client.open_session()
        assert full.value.kind == "OVERLOAD_KIND_SESSIONS"
        assert full.value.not_applied
        session.close()
        # Room again: the open goes through.
        client.timeout = 20
        client.open_session().close()


def test_a_request_shed_by_the_server_is_known_unsent_and_retried(make_cluster):
    cluster = make_cluster(1, ["--client-max-in-flight", "1"])
    address = cluster.endpoints[0]
    options = [("grpc.enable_http_proxy", 0)]
    release = threading.Event()

    def nothing_until_released():
        release.wait(60)
        return
        yield  # a request stream that sends no message

    # One call whose request never ends takes the only slot and holds it;
    # then every read is refused at once, typed, as never handled.
    with grpc.insecure_channel(address, options=options) as holding, grpc.insecure_channel(
        address, options=options
    ) as channel:
        held = holding.stream_unary(
            "/oncekv.v1.Kv/Status",
            request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusResponse.FromString,
        ).future(nothing_until_released())
        stub = kv_pb2_grpc.KvStub(channel)
        shed, other = [], []

        def a_read_is_shed():
            try:
                stub.Read(pb.ReadRequest(query=pb.Query(get=pb.Get(key=b"k"))), timeout=10)
            except grpc.RpcError as error:
                (shed if _shed_by_server(error) else other).append(error)
            return shed

        try:
            eventually(a_read_is_shed, 30, "a read shed while the only slot is held")
            for _ in range(5):
                a_read_is_shed()
        finally:
            release.set()
            held.cancel()
        assert other == []
        assert len(shed) >= 6, "every read while the slot is held is shed"
        for error in shed:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _failed(error)[0] == "not_sent"

    # The client retries what was shed, as never sent: every increment
    # applies once.
    values, errors = [], []

    def increments():
        try:
            with Client([address], timeout=30) as client:
                for _ in range(10):
                    values.append(client.incr("n").value)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=increments) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(values) == list(range(1, 41))

"""The watcher's resume rules, against gRPC servers of the same service in
the test process that script their streams: a cancel that is not a
compaction resumes on the next endpoint from the revision after the last
delivered (a repeated revision is skipped); a compaction cancel is
``Compacted``; a refused start moves on."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from oncekv import Changes, Client, Compacted, Progress
from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc


def event(revision: int, key: bytes, value: bytes) -> pb.Event:
    meta = pb.KeyMeta(create_revision=1, mod_revision=revision, version=revision)
    return pb.Event(type=pb.EVENT_TYPE_PUT, key=key, value=value, meta=meta, revision=revision)


class Scripted(kv_pb2_grpc.KvServicer):
    """Answers each Watch with the next script (a list of responses),
    recording the requests; ``hold`` keeps the stream open at its end."""

    def __init__(self, scripts, hold: threading.Event):
        self.scripts = list(scripts)
        self.requests = []
        self.hold = hold

    def Watch(self, request, context):
        self.requests.append(request)
        script = self.scripts.pop(0) if self.scripts else []
        yield from script
        if not (script and script[-1].WhichOneof("kind") == "canceled"):
            self.hold.wait(30)


@pytest.fixture
def servers():
    made = []
    hold = threading.Event()

    def serve(*scripts) -> tuple:
        servicer = Scripted(scripts, hold)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        kv_pb2_grpc.add_KvServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        made.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield serve
    hold.set()
    for server in made:
        server.stop(0)


def test_a_cancel_that_is_not_a_compaction_resumes_on_the_next_endpoint_after_the_last_delivered(servers):
    first, a = servers(
        [
            pb.WatchResponse(started=pb.WatchStarted(revision=4)),
            pb.WatchResponse(events=pb.WatchEvents(events=[event(5, b"k", b"1")])),
            pb.WatchResponse(events=pb.WatchEvents(events=[event(6, b"k", b"2"), event(6, b"k/x", b"3")])),
            pb.WatchResponse(canceled=pb.WatchCanceled(reason="too slow")),
        ]
    )
    second, b = servers(
        [
            pb.WatchResponse(started=pb.WatchStarted(revision=6)),
            # A revision already delivered is skipped, not repeated.
            pb.WatchResponse(events=pb.WatchEvents(events=[event(6, b"k", b"2"), event(7, b"k", b"4")])),
            pb.WatchResponse(progress=9),
        ]
    )
    with Client([a, b], timeout=5) as client:
        with client.watch("k", prefix=True, start_revision=5, progress=True) as watcher:
            got = [watcher.next(timeout=10) for _ in range(4)]
            assert [type(u) for u in got] == [Changes, Changes, Changes, Progress]
            assert [u.revision for u in got] == [5, 6, 7, 9]
            assert [e.key for e in got[1].events] == [b"k", b"k/x"]
            assert got[2].events[0].value == b"4"
            assert watcher.next_revision == 10
            assert watcher.starts == 2
    assert [(r.key, r.prefix, r.start_revision) for r in first.requests] == [(b"k", True, 5)]
    assert [r.start_revision for r in second.requests] == [7]


def test_a_compaction_cancel_is_compacted_and_a_refused_start_moves_on(servers):
    first, a = servers(
        # Refused before starting (no leader to read from...): next endpoint.
        [pb.WatchResponse(failure=pb.Failure(unavailable=pb.Unavailable(reason="not ready")))]
    )
    second, b = servers(
        [
            pb.WatchResponse(
                canceled=pb.WatchCanceled(reason="revision 3 is compacted", compacted=8)
            )
        ]
    )
    with Client([a, b], timeout=5) as client:
        watcher = client.watch("k", start_revision=3)
        with pytest.raises(Compacted) as compacted:
            watcher.next(timeout=10)
        assert (compacted.value.revision, compacted.value.compacted) == (3, 8)
        assert compacted.value.not_applied
        with pytest.raises(StopIteration):
            watcher.next(timeout=1)
    assert len(first.requests) == 1 and [r.start_revision for r in second.requests] == [3]

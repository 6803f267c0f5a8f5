"""What a send may have done is never forgotten.

A request that changes state and may have been delivered, by an attempt of
this call or by an earlier send (``maybe_delivered=True``), ends with its
reply, a mismatch, or ``OutcomeUnknown``; never with an error that says
"not applied". And "never sent" is decided by whether a call was made on a
ready channel, never by the words of an error.

Real nodes, a TCP proxy that loses a reply, gRPC servers in the test
process that script their answers, and fake channels.
"""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from typing import List

import grpc
import pytest

from oncekv import (
    Backoff,
    Client,
    Invalid,
    OutcomeUnknown,
    Overloaded,
    PermissionDenied,
    Rejected,
    RequestMismatch,
    SequenceGap,
    Session,
    SessionExpired,
    Stale,
    Unauthenticated,
    Unreachable,
)
from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc
from oncekv.client import _Connection, _failed, incr_command, put_command

from conftest import eventually, free_port

# HTTP/2 frame types that carry a stream's answer (RFC 9113, 6.1 and 6.2).
_DATA, _HEADERS = 0, 1


class ReplyLosingProxy:
    """A TCP proxy in front of one node. Once armed, it forwards what the
    client sends but not the node's answer to it: at the first frame of an
    answer on a stream (HEADERS or DATA), it closes both connections and
    stops listening, so the request was delivered and applied, the reply is
    lost, and the address refuses every later connection."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = threading.Event()
        self.cut = threading.Event()
        self._sockets: List[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                node = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            node.settimeout(None)
            with self._lock:
                self._sockets += [client, node]
            for target in (self._to_node, self._to_client):
                thread = threading.Thread(target=target, args=(client, node), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _to_node(self, client: socket.socket, node: socket.socket) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                node.sendall(data)
        except OSError:
            pass
        finally:
            _shut(node)

    def _to_client(self, client: socket.socket, node: socket.socket) -> None:
        pending = b""
        try:
            while True:
                data = node.recv(65536)
                if not data:
                    break
                pending += data
                # Forward whole frames, up to an answer once armed.
                while len(pending) >= 9:
                    length = int.from_bytes(pending[0:3], "big")
                    if len(pending) < 9 + length:
                        break
                    kind = pending[3]
                    stream = int.from_bytes(pending[5:9], "big") & 0x7FFFFFFF
                    if self.armed.is_set() and stream != 0 and kind in (_DATA, _HEADERS):
                        self.close()
                        return
                    client.sendall(pending[: 9 + length])
                    pending = pending[9 + length :]
        except OSError:
            pass
        finally:
            _shut(client)

    def close(self) -> None:
        """Closes every connection and stops listening."""
        self.cut.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def test_a_resend_of_a_request_whose_reply_was_lost_never_says_not_applied(make_cluster):
    cluster = make_cluster(1)
    node = cluster.node(1)
    proxy = ReplyLosingProxy(node.client)
    try:
        with Client([proxy.address], timeout=1, attempt_timeout=0.5) as lossy:
            session = lossy.open_session(keep_alive=False)
            assert session.incr("n").value == 1
            seq = session.next_seq
            proxy.armed.set()
            # Delivered and applied; the reply is lost and the address then
            # refuses connections: the call cannot know.
            with pytest.raises(OutcomeUnknown) as first:
                session.incr("n")
            assert proxy.cut.is_set()
            assert first.value.request_id == (session.session_id, seq)
            # Sending it again to a cluster it cannot reach: the earlier send
            # may have applied, so this is still unknown, not unreachable.
            with pytest.raises(OutcomeUnknown) as again:
                session.execute_seq(seq, incr_command("n"), maybe_delivered=True)
            assert not again.value.not_applied
            assert again.value.request_id == (session.session_id, seq)
            assert "earlier send" in again.value.last_error
            # A first send that reaches nothing was never sent: unreachable.
            with pytest.raises(Unreachable) as never:
                session.execute_seq(seq + 1, incr_command("n"), maybe_delivered=False)
            assert never.value.not_applied
    finally:
        proxy.close()
    with Client([f"127.0.0.1:{free_port()}"], timeout=0.5, attempt_timeout=0.25) as nowhere:
        with pytest.raises(Unreachable):
            nowhere.execute_request(
                pb.ExecuteRequest(idempotency_key=b"job-1", command=incr_command("n")), maybe_delivered=False
            )
        with pytest.raises(OutcomeUnknown):
            nowhere.execute_request(
                pb.ExecuteRequest(idempotency_key=b"job-1", command=incr_command("n")), maybe_delivered=True
            )
    # Straight to the node, the resend learns what happened: it had applied
    # once, and its original reply comes back.
    with Client(cluster.endpoints, timeout=20) as direct:
        same = Session(direct, session.session_id, session.secret, next_seq=seq + 1)
        settled = same.execute_seq(seq, incr_command("n"), maybe_delivered=True)
        assert (settled.value, settled.replayed) == (2, True)
        assert direct.get("n") == b"2"
        same.close()


def test_a_resend_refused_by_the_session_is_outcome_unknown_but_its_reply_or_a_mismatch_is_definite(cluster3):
    with Client(cluster3.endpoints, timeout=20) as client:
        session = client.open_session(window=4, keep_alive=False)
        try:
            assert session.put("d/a", "1").value is None  # seq 1
            # Its own reply, replayed, and a mismatch stay definite.
            replayed = session.execute_seq(1, put_command("d/a", "1"), maybe_delivered=True)
            assert replayed.replayed is True
            with pytest.raises(RequestMismatch):
                session.execute_seq(1, put_command("d/a", "2"), maybe_delivered=True)
            # A sequence gap: exact on a first send, unknown after one that
            # may have been delivered.
            with pytest.raises(SequenceGap):
                session.execute_seq(50, put_command("d/b", "1"))
            with pytest.raises(OutcomeUnknown) as gap:
                session.execute_seq(50, put_command("d/b", "1"), maybe_delivered=True)
            assert gap.value.request_id == (session.session_id, 50)
            assert "sequence_gap" in gap.value.last_error
            # Acknowledged and freed: stale.
            assert session.put("d/c", "1").value is None  # seq 2, acknowledges 1
            with pytest.raises(Stale):
                session.execute_seq(1, put_command("d/a", "1"))
            with pytest.raises(OutcomeUnknown) as stale:
                session.execute_seq(1, put_command("d/a", "1"), maybe_delivered=True)
            assert "stale" in stale.value.last_error
            # An application-level rejection is the request's reply.
            session.put("d/text", "x")
            with pytest.raises(Rejected):
                session.execute_seq(session.next_seq, incr_command("d/text"), maybe_delivered=True)
            assert client.get("d/b") is None
        finally:
            session.close()


def test_a_resend_answered_session_expired_is_outcome_unknown(make_cluster):
    cluster = make_cluster(1)
    node = cluster.node(1)
    with Client(cluster.endpoints, timeout=10) as client:
        session = client.open_session(ttl_ms=200, keep_alive=False)
        assert session.incr("e").value == 1
        eventually(lambda: cluster.status(node).sessions == 0, 20, "the session to expire")
        with pytest.raises(OutcomeUnknown) as unknown:
            session.execute_seq(2, incr_command("e"), maybe_delivered=True)
        assert unknown.value.request_id == (session.session_id, 2)
        assert "session_expired" in unknown.value.last_error
        assert session.expired is False  # not reported as a definite expiry
        with pytest.raises(SessionExpired):
            session.execute_seq(2, incr_command("e"))
        assert session.expired is True
        assert client.get("e") == b"1"


# Scripted servers: each Execute (and Authenticate) takes the next answer;
# the last one repeats.


class Abort:
    """A call answered with a gRPC status instead of a message."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers=()):
        self.code, self.details, self.trailers = code, details, tuple(trailers)


class Scripted(kv_pb2_grpc.KvServicer):
    def __init__(self, execute, authenticate=()):
        self.execute = list(execute)
        self.authenticate = list(authenticate)
        self.requests: List[pb.ExecuteRequest] = []
        self.logins = 0

    @staticmethod
    def _next(answers, context):
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Abort):
            if answer.trailers:
                context.set_trailing_metadata(answer.trailers)
            context.abort(answer.code, answer.details)
        return answer

    def Execute(self, request, context):
        self.requests.append(request)
        return self._next(self.execute, context)

    def Authenticate(self, request, context):
        self.logins += 1
        return self._next(self.authenticate, context)


@pytest.fixture
def scripted():
    made = []

    def serve(execute, authenticate=()):
        servicer = Scripted(execute, authenticate)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        kv_pb2_grpc.add_KvServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        made.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield serve
    for server in made:
        server.stop(0)


def lost(details: str = "connection reset by peer") -> Abort:
    """A call that failed after it was made: it may have been delivered."""
    return Abort(grpc.StatusCode.UNAVAILABLE, details)


def applied(value: int) -> pb.ExecuteResponse:
    outcome = pb.Outcome(applied=pb.Reply(incr=pb.IncrReply(value=value)))
    return pb.ExecuteResponse(outcome=outcome, log_index=7)


def failure(**kind) -> pb.ExecuteResponse:
    return pb.ExecuteResponse(failure=pb.Failure(**kind))


def outcome(**kind) -> pb.ExecuteResponse:
    return pb.ExecuteResponse(outcome=pb.Outcome(**kind))


def quick(address: str, **options) -> Client:
    return Client([address], timeout=1, attempt_timeout=0.5, backoff=Backoff(0.005, 0.02), **options)


def session_on(client: Client) -> Session:
    return Session(client, 9, b"secret", next_seq=1)


REFUSALS_AFTER_A_LOST_ATTEMPT = {
    "invalid": failure(invalid=pb.Invalid(reason="too big")),
    "permission_denied": failure(permission_denied=pb.PermissionDenied(reason="not yours")),
    "unauthenticated": failure(unauthenticated=pb.Unauthenticated(reason="no token")),
    "refused by status": Abort(grpc.StatusCode.INVALID_ARGUMENT, "message too large"),
    "session_expired": outcome(session_expired=pb.Empty()),
    "sequence_gap": outcome(sequence_gap=pb.SequenceGap(expected=3)),
    "malformed": outcome(malformed=pb.Malformed(reason="bad")),
    "permission_denied outcome": outcome(permission_denied=pb.PermissionDenied(reason="not yours")),
    "still overloaded": outcome(overloaded=pb.Overloaded(max=1, reason="full")),
}


@pytest.mark.parametrize("answer", list(REFUSALS_AFTER_A_LOST_ATTEMPT), ids=str)
def test_a_refusal_after_an_attempt_that_may_have_been_delivered_is_outcome_unknown(scripted, answer):
    servicer, address = scripted([lost(), REFUSALS_AFTER_A_LOST_ATTEMPT[answer]])
    with quick(address) as client:
        with pytest.raises(OutcomeUnknown) as unknown:
            session_on(client).incr("k")
    assert unknown.value.request_id == (9, 1)
    assert unknown.value.attempts >= 2
    assert len(servicer.requests) >= 2
    assert unknown.value.last_error.startswith("attempt 1 may have been delivered")


@pytest.mark.parametrize(
    "answer, error",
    [
        ("invalid", Invalid),
        ("permission_denied", PermissionDenied),
        ("unauthenticated", Unauthenticated),
        ("sequence_gap", SequenceGap),
        ("still overloaded", Overloaded),
    ],
    ids=str,
)
def test_a_first_send_keeps_its_exact_answer_and_a_resend_does_not(scripted, answer, error):
    _, address = scripted([REFUSALS_AFTER_A_LOST_ATTEMPT[answer]])
    with quick(address) as client:
        with pytest.raises(error) as exact:
            session_on(client).execute_seq(1, incr_command("k"))
        assert exact.value.not_applied
        with pytest.raises(OutcomeUnknown) as unknown:
            session_on(client).execute_seq(1, incr_command("k"), maybe_delivered=True)
        assert unknown.value.last_error.startswith("an earlier send may have been delivered")


def test_a_failed_login_after_an_attempt_that_may_have_been_delivered_is_outcome_unknown(scripted):
    # The token from an earlier login expires between two attempts; logging
    # in again is refused (the password changed).
    refused = pb.AuthenticateResponse(failure=pb.Failure(unauthenticated=pb.Unauthenticated(reason="password changed")))
    servicer, address = scripted([lost(), failure(unauthenticated=pb.Unauthenticated(reason="token expired"))], [refused])
    with quick(address, user="alice", password="pw", token="earlier") as client:
        with pytest.raises(OutcomeUnknown) as unknown:
            session_on(client).incr("k")
    assert servicer.logins == 1 and len(servicer.requests) == 2
    assert "Unauthenticated: password changed" in unknown.value.last_error


def test_a_reply_after_a_lost_attempt_is_definite(scripted):
    servicer, address = scripted([lost(), applied(5)])
    with quick(address) as client:
        done = session_on(client).incr("k")
    assert (done.value, done.attempts) == (5, 2)
    assert [r.session.attempt for r in servicer.requests] == [1, 2]


def test_reads_are_unaffected(scripted):
    # A read through the log changes nothing: a refusal after a lost attempt
    # is reported as it is.
    _, address = scripted([lost(), failure(invalid=pb.Invalid(reason="bad query"))])
    read = pb.Command(read=pb.Query(get=pb.Get(key=b"k")))
    with quick(address) as client:
        with pytest.raises(Invalid):
            client.execute_request(pb.ExecuteRequest(command=read), maybe_delivered=True)


def test_the_words_of_a_failure_never_make_it_unsent(scripted):
    # The call was made: whatever its details say, it may have been
    # delivered, so a plain mutation is not sent again.
    servicer, address = scripted([lost("failed to connect to all addresses; connection refused"), applied(1)])
    with quick(address) as client:
        with pytest.raises(OutcomeUnknown) as unknown:
            client.execute_plain(incr_command("k"))
    assert unknown.value.attempts == 1
    assert len(servicer.requests) == 1


def test_a_request_shed_by_the_server_is_unsent_by_its_metadata(scripted):
    shed = Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", [("oncekv-overloaded", "in-flight")])
    servicer, address = scripted([shed, applied(1)])
    with quick(address) as client:
        assert client.execute_plain(incr_command("k")).value == 1
    assert len(servicer.requests) == 2


# Channels that are not ready: no call is made.


class FakeChannel:
    """Reports the connectivity states it is told to, as gRPC does (to each
    subscriber, from another thread)."""

    def __init__(self):
        self.callbacks = []

    def subscribe(self, callback, try_to_connect=False):
        self.callbacks.append(callback)

    def unsubscribe(self, callback):
        self.callbacks.remove(callback)

    def report(self, state: grpc.ChannelConnectivity) -> None:
        for callback in list(self.callbacks):
            callback(state)

    def unary_unary(self, *args, **kwargs):
        def never_called(*a, **k):
            raise AssertionError("a call was made on a channel that was not ready")

        return never_called

    unary_stream = stream_unary = stream_stream = unary_unary

    def close(self):
        pass


def test_a_ready_channel_is_used_at_once_and_a_failed_one_without_waiting():
    C = grpc.ChannelConnectivity
    channel = FakeChannel()
    connection = _Connection(channel)
    assert connection.wait_ready(0.01).startswith("not connected within")  # no state yet
    channel.report(C.CONNECTING)
    assert "CONNECTING" in connection.wait_ready(0.01)
    channel.report(C.READY)
    assert connection.wait_ready(0) is None and not connection.spent
    channel.report(C.TRANSIENT_FAILURE)
    assert connection.wait_ready(60).startswith("could not connect")  # at once
    channel.report(C.IDLE)  # connected before, then lost: made anew when next used
    assert connection.spent
    assert connection.wait_ready(60).startswith("the connection was lost")
    connection.release()
    assert channel.callbacks == []


def test_a_channel_that_becomes_ready_while_waited_for_is_used():
    C = grpc.ChannelConnectivity
    channel = FakeChannel()
    connection = _Connection(channel)
    channel.report(C.CONNECTING)
    waiting = threading.Event()

    class Watched(threading.Condition):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    connection._changed = Watched()
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(connection.wait_ready(30)))
    waiter.start()
    try:
        assert waiting.wait(10), "wait_ready did not wait"
        channel.report(C.READY)
        waiter.join(timeout=10)
        assert not waiter.is_alive()
        assert answers == [None]
    finally:
        channel.report(C.READY)
        waiter.join(timeout=10)


@pytest.mark.parametrize("maybe_delivered, error", [(False, Unreachable), (True, OutcomeUnknown)])
def test_no_call_is_made_on_a_channel_that_never_becomes_ready(monkeypatch, maybe_delivered, error):
    channels: List[FakeChannel] = []

    def connection(self, address):
        channels.append(FakeChannel())
        made = _Connection(channels[-1])
        channels[-1].report(grpc.ChannelConnectivity.TRANSIENT_FAILURE)
        return made

    monkeypatch.setattr(Client, "_connection", connection)
    with quick("127.0.0.1:1") as client:
        with pytest.raises(error) as raised:
            session_on(client).execute_seq(1, incr_command("k"), maybe_delivered=maybe_delivered)
    assert len(channels) >= 2  # tried again and again, never called
    assert "could not connect" in str(raised.value)


def test_a_transport_failure_is_maybe_sent_whatever_its_words():
    class Failed(grpc.RpcError):
        def __init__(self, code, details, trailers=()):
            self._code, self._details, self._trailers = code, details, trailers

        def code(self):
            return self._code

        def details(self):
            return self._details

        def trailing_metadata(self):
            return self._trailers

    for words in ("failed to connect to all addresses", "Connection refused", "DNS resolution failed"):
        assert _failed(Failed(grpc.StatusCode.UNAVAILABLE, words))[0] == "maybe_sent"
    assert _failed(Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"))[0] == "maybe_sent"
    shed = Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "x", (("oncekv-overloaded", "sessions"),))
    assert _failed(shed)[0] == "not_sent"
    kind, refusal = _failed(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "message too large"))
    assert kind == "refused" and isinstance(refusal, Invalid)

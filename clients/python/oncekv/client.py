"""``Client``: leader discovery and the retry loop.

A request goes to the node believed to lead; ``NotLeader`` hints redirect
it, unreachable nodes are skipped in turn, and transient failures are
retried with jittered backoff until the deadline. Only requests that are
deduplicated (on a session or under an idempotency key) or read-only are
retried after they may have been sent. This is a port of the Rust client
(``crates/oncekv-client/src/client.rs``); the comments name its pieces.

What an attempt may have done is never forgotten. An attempt is *never
sent* only when the client can prove it: its channel did not become ready
(so no call was made), or the node answered with a typed promise that
nothing was proposed (not the leader, no leader known, shed unhandled).
Every other failure of a call that was made *may have delivered* it; the
words of an error's details are never read to decide. A request that
changes state and had such an attempt, in this call or in an earlier one
(``maybe_delivered=True``), ends with its reply (applied or replayed), a
:class:`RequestMismatch`, or :class:`OutcomeUnknown`: never with an error
that says "not applied".
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
import weakref
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

import grpc

from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc
from oncekv.errors import (
    Compacted,
    ConfigError,
    FutureRevision,
    Invalid,
    Malformed,
    NotVersioned,
    OncekvError,
    OutcomeUnknown,
    Overloaded,
    PermissionDenied,
    Rejected,
    ReplyTooLarge,
    RequestMismatch,
    SequenceGap,
    SessionExpired,
    Stale,
    TxnConflict,
    TxnTooLarge,
    Unauthenticated,
    Unauthorized,
    Unreachable,
)
from oncekv.results import Completed, KeyMeta, KeyValue, LeaseInfo, ScanResult, TxnResult
from oncekv.txn import Txn, txn_command

Bytes = Union[bytes, str]

#: The metadata key a server sets on a request it shed unhandled because a
#: limit was full; its value names the limit.
OVERLOADED_METADATA = "oncekv-overloaded"

#: Largest message sent or received (as the Rust client).
MESSAGE_BYTES_MAX = 64 * 1024 * 1024

_random = secrets.SystemRandom()


def _bytes(value: Bytes, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def _key_hex() -> str:
    """A fresh 128-bit key as 32 hex digits (the Rust client's ``key_hex``)."""
    return secrets.token_hex(16)


class Backoff:
    """Exponential backoff: ``initial * 2^retry``, capped at ``maximum``, then
    jitter (a random point between half and all of it)."""

    def __init__(self, initial: float = 0.020, maximum: float = 1.0):
        self.initial = initial
        self.maximum = maximum

    def delay(self, retry: int) -> float:
        capped = min(self.initial * (1 << min(retry, 16)), self.maximum)
        return capped * (0.5 + 0.5 * _random.random())


# What one attempt learned (the Rust client's `Attempt`).
_DONE = "done"  # payload: the value
_REDIRECT = "redirect"  # definitely not proposed there; payload: a hint or None
_NOT_SENT = "not_sent"  # not proposed: no call was made (the channel was not ready), or the node shed it
_MAYBE_SENT = "maybe_sent"  # may have been proposed
_BUSY = "busy"  # refused for now by a full table: retried after a pause
_REFUSED = "refused"  # a definite refusal; payload: the exception
_UNAUTHENTICATED = "unauthenticated"  # no valid user; logging in again may help

#: The outcomes that stay definite after an attempt that may have been
#: delivered: the request's own reply (applied, or replayed from its
#: completion record), and "that id holds another command" (so this one
#: never applied under it). Every other refusal may have been decided
#: without looking at the earlier attempt (the session expired, its record
#: was freed, a table was full, ...).
_DEFINITE_AFTER_MAYBE_DELIVERED = ("applied", "replayed", "request_mismatch")

#: Refusals that forget the past, for requests that change nothing (their
#: rule is unchanged: a read through the log answered one of these after an
#: attempt that may have been delivered is an unknown outcome too).
_FORGETS_THE_PAST = ("session_expired", "stale", "unauthorized")


class _Tally:
    """What a call's attempts have learned so far."""

    __slots__ = ("attempts", "maybe_sent", "why", "last_error")

    def __init__(self, maybe_delivered: bool):
        self.attempts = 0
        #: Whether a send of the request (of this call, or an earlier one)
        #: may have been delivered.
        self.maybe_sent = maybe_delivered
        self.why = "an earlier send may have been delivered" if maybe_delivered else ""
        self.last_error = ""

    def sent_maybe(self, number: int) -> None:
        if not self.maybe_sent:
            self.why = f"attempt {number} may have been delivered"
        self.maybe_sent = True

    def unknown(self, last: str) -> str:
        """The detail of an unknown outcome: why it may have applied, and
        what the last attempt answered."""
        return f"{self.why}; the last attempt: {last}" if last else self.why


def _answer(error: OncekvError) -> str:
    """What an error says, named by its type, for an unknown outcome's
    detail (without its own "not applied" words, which no longer hold)."""
    reason = getattr(error, "reason", None) or getattr(error, "kind", None) or ""
    name = type(error).__name__
    return f"{name}: {reason}" if reason else name


_READY = grpc.ChannelConnectivity.READY
_IDLE = grpc.ChannelConnectivity.IDLE
_TRANSIENT_FAILURE = grpc.ChannelConnectivity.TRANSIENT_FAILURE
_SHUTDOWN = grpc.ChannelConnectivity.SHUTDOWN


class _Connection:
    """A channel to one node, its stub, and the channel's connectivity as
    gRPC last reported it.

    One subscription per channel (gRPC polls it in one thread of its own,
    for the channel's life), so checking a READY channel before a call is an
    attribute read: no round trip and no thread per call. A channel that is
    not READY is waited for; while it is not READY no call is made on it,
    which is what proves an attempt was never sent."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.stub = kv_pb2_grpc.KvStub(channel)
        self._state: Optional[grpc.ChannelConnectivity] = None
        #: Whether the channel has left IDLE since it was made.
        self._started = False
        self._changed = threading.Condition()
        # A weak reference: the subscription must not keep a forgotten
        # connection (and gRPC's polling thread) alive.
        ref = weakref.ref(self)

        def update(state, ref=ref):
            connection = ref()
            if connection is not None:
                connection._update(state)

        self._callback = update
        channel.subscribe(update, try_to_connect=True)

    def _update(self, state: grpc.ChannelConnectivity) -> None:
        with self._changed:
            if state is not _IDLE:
                self._started = True
            self._state = state
            self._changed.notify_all()

    @property
    def spent(self) -> bool:
        """Whether the channel will not connect unless asked: it went back
        to IDLE after connecting (a lost connection, an idle timeout) or was
        shut down. A fresh channel asks at once."""
        state = self._state
        return (state is _IDLE and self._started) or state is _SHUTDOWN

    def wait_ready(self, timeout: float) -> Optional[str]:
        """``None`` once the channel is READY (at once if it is); otherwise
        why it is not: it failed to connect, or did not connect within
        ``timeout`` seconds. Then nothing is sent on it."""
        if self._state is _READY:
            return None
        end = time.monotonic() + max(0.0, timeout)
        with self._changed:
            while True:
                state = self._state
                if state is _READY:
                    return None
                if state is _TRANSIENT_FAILURE:
                    return "could not connect (nothing sent)"
                if self.spent:
                    return "the connection was lost before sending (nothing sent)"
                left = end - time.monotonic()
                if left <= 0:
                    name = state.name if state is not None else "starting"
                    return f"not connected within {timeout:.3g}s ({name}; nothing sent)"
                self._changed.wait(left)

    def release(self) -> None:
        """Ends the subscription (the channel stays open for calls other
        threads have in flight on it)."""
        try:
            self.channel.unsubscribe(self._callback)
        except Exception:  # noqa: BLE001 - a closed channel has none left
            pass


def _metadata(error: grpc.RpcError) -> List[Tuple[str, str]]:
    entries = []
    for getter in ("trailing_metadata", "initial_metadata"):
        try:
            entries.extend(getattr(error, getter)() or ())
        except Exception:  # not a grpc.Call
            pass
    return entries


def _shed_by_server(error: grpc.RpcError) -> Optional[str]:
    """What was full, if the server shed the request unhandled: status
    RESOURCE_EXHAUSTED carrying the ``oncekv-overloaded`` metadata entry
    (never the message text). Such a request definitely did not apply."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in _metadata(error):
        if key.lower() == OVERLOADED_METADATA:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def _refused_by_transport(error: grpc.RpcError) -> Optional[OncekvError]:
    if _shed_by_server(error) is not None:
        return None  # not a refusal of the message: it is retried later
    code = error.code()
    details = error.details() or ""
    if code in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.INVALID_ARGUMENT,
    ):
        return Invalid(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(details)
    return None


def _failed(error: grpc.RpcError):
    """What the failure of a call that was made says about the attempt: not
    sent only when the server shed it unhandled (RESOURCE_EXHAUSTED with the
    ``oncekv-overloaded`` metadata); refused by a typed status (message too
    large or invalid, unauthenticated, permission denied); else maybe sent.
    A call is made only on a READY channel, so any other failure (a reset,
    a closed connection, a deadline, even a failed reconnect) may come after
    the request left: the details' words are never read to decide."""
    details = error.details() or str(error.code())
    full = _shed_by_server(error)
    if full is not None:
        return _NOT_SENT, f"server overloaded ({full} full), not handled"
    refusal = _refused_by_transport(error)
    if refusal is not None:
        return _REFUSED, refusal
    return _MAYBE_SENT, f"{error.code().name}: {details}"


# The texts of the transaction refusals the leader makes before proposing
# (the `Rejection` display strings of crates/oncekv-state/src/outcome.rs),
# carried by `Failure.invalid` as words only.
_TXN_TOO_LARGE = re.compile(r"a transaction may hold (\d+) compares and \d+ operations per branch, got (\d+)")
_TXN_CONFLICT = re.compile(r'a transaction writes key "((?:[^"\\]|\\.)*)" twice')


def _invalid(reason: str) -> Invalid:
    """A refusal before proposing: typed when it is a transaction's
    (:class:`TxnTooLarge`, :class:`TxnConflict`, both also ``Invalid``)."""
    match = _TXN_TOO_LARGE.search(reason)
    if match:
        return TxnTooLarge(int(match.group(2)), int(match.group(1)), reason)
    match = _TXN_CONFLICT.search(reason)
    if match:
        key = re.sub(r"\\(.)", r"\1", match.group(1))
        return TxnConflict(key, reason)
    return Invalid(reason)


def _call_failed(failure: pb.Failure):
    """What a call's ``Failure`` says about the attempt: the one place the
    client reads it."""
    kind = failure.WhichOneof("kind")
    if kind == "not_leader":
        return _REDIRECT, failure.not_leader.leader_client_address or None
    if kind == "unavailable":
        if failure.unavailable.not_proposed:
            # No leader known: definitely not proposed, retry later or elsewhere.
            return _NOT_SENT, failure.unavailable.reason
        return _MAYBE_SENT, failure.unavailable.reason
    if kind == "invalid":
        return _REFUSED, _invalid(failure.invalid.reason)
    if kind == "unauthenticated":
        return _UNAUTHENTICATED, failure.unauthenticated.reason
    if kind == "permission_denied":
        return _REFUSED, PermissionDenied(failure.permission_denied.reason)
    if kind == "shed":
        return _NOT_SENT, f"server overloaded ({failure.shed.what} full), not handled"
    return _MAYBE_SENT, "undecodable failure"


def _overloaded(message: pb.Overloaded) -> Overloaded:
    kind = pb.OverloadKind.Name(message.kind)
    return Overloaded(kind, message.max, message.reason)


def _malformed(message: pb.Malformed) -> Malformed:
    kind = pb.MalformedKind.Name(message.kind)
    reason = message.reason or kind
    if message.seq:
        reason += f" (seq {message.seq}, first_incomplete {message.first_incomplete})"
    return Malformed(kind, reason)


def _rejected(rejection: pb.Rejection) -> Rejected:
    """The exception of a rejection: a typed subclass of :class:`Rejected`
    for the revision and transaction refusals."""
    kind = rejection.WhichOneof("kind") or "unknown"
    message = rejection.message
    if kind == "compacted":
        r = rejection.compacted
        return Compacted(r.revision, r.compacted, message, rejection)
    if kind == "future_revision":
        r = rejection.future_revision
        return FutureRevision(r.revision, r.compacted, message, rejection)
    if kind == "not_versioned":
        return NotVersioned(message, rejection)
    if kind == "txn_too_large":
        r = rejection.txn_too_large
        return TxnTooLarge(r.bytes, r.max, message, rejection)
    if kind == "txn_conflict":
        return TxnConflict(rejection.txn_conflict.name, message, rejection)
    if kind == "reply_too_large":
        r = rejection.reply_too_large
        return ReplyTooLarge(r.bytes, r.max, message, rejection)
    return Rejected(kind, message, rejection)


def _meta(meta: pb.KeyMeta) -> KeyMeta:
    return KeyMeta(meta.create_revision, meta.mod_revision, meta.version)


def _key_value(entry: pb.KeyValue) -> KeyValue:
    return KeyValue(entry.key, entry.value, _meta(entry.meta))


def _optional(message, name: str):
    return getattr(message, name) if message.HasField(name) else None


def completed(outcome: pb.Outcome, index: int, attempts: int) -> Completed:
    """Turns an outcome into what the caller is told (raising the typed
    error of a refusal)."""
    kind = outcome.WhichOneof("kind")
    if kind == "applied":
        reply, replayed, applied_index = outcome.applied, False, index
    elif kind == "replayed":
        reply, replayed = outcome.replayed.reply, True
        applied_index = outcome.replayed.applied_index
    elif kind == "session_expired":
        raise SessionExpired()
    elif kind == "unauthorized":
        raise Unauthorized()
    elif kind == "stale":
        raise Stale(outcome.stale.floor)
    elif kind == "request_mismatch":
        raise RequestMismatch()
    elif kind == "sequence_gap":
        raise SequenceGap(outcome.sequence_gap.expected)
    elif kind == "malformed":
        raise _malformed(outcome.malformed)
    elif kind == "overloaded":
        raise _overloaded(outcome.overloaded)
    elif kind == "permission_denied":
        raise PermissionDenied(outcome.permission_denied.reason)
    else:
        raise OutcomeUnknown(None, attempts, f"an outcome this client does not know: {kind}")
    return _completed_reply(reply, replayed, applied_index, attempts)


def _completed_reply(reply: pb.Reply, replayed: bool, applied_index: int, attempts: int):
    kind = reply.WhichOneof("kind")
    if kind == "rejected":
        raise _rejected(reply.rejected)
    common = dict(replayed=replayed, applied_index=applied_index, attempts=attempts, kind=kind or "")
    if kind in ("put", "delete"):
        return Completed(value=_optional(getattr(reply, kind), "value"), reply=reply, **common)
    if kind == "get":
        value = _optional(reply.get, "value")
        meta = _meta(reply.get.meta) if value is not None else None
        return Completed(value=value, meta=meta, reply=reply, **common)
    if kind == "scan":
        entries = ScanResult([_key_value(e) for e in reply.scan.entries], reply.scan.more)
        return Completed(value=entries, reply=reply, **common)
    if kind == "delete_prefix":
        return Completed(value=reply.delete_prefix.deleted, keys_deleted=reply.delete_prefix.deleted, reply=reply, **common)
    if kind == "compacted":
        return Completed(value=reply.compacted.revision, reply=reply, **common)
    if kind == "append":
        return Completed(value=reply.append.length, reply=reply, **common)
    if kind == "incr":
        return Completed(value=reply.incr.value, reply=reply, **common)
    if kind == "cas":
        current = _optional(reply.cas, "current")
        return Completed(
            value=reply.cas.swapped, swapped=reply.cas.swapped, current=current, reply=reply, **common
        )
    if kind == "lease_granted":
        g = reply.lease_granted
        return Completed(
            value=g.expires_at_ms,
            name=g.name,
            ttl_ms=g.ttl_ms,
            expires_at_ms=g.expires_at_ms,
            reply=reply,
            **common,
        )
    if kind == "lease_kept_alive":
        k = reply.lease_kept_alive
        return Completed(
            value=k.expires_at_ms, name=k.name, expires_at_ms=k.expires_at_ms, reply=reply, **common
        )
    if kind == "lease_revoked":
        r = reply.lease_revoked
        return Completed(
            value=r.keys_deleted, name=r.name, keys_deleted=r.keys_deleted, reply=reply, **common
        )
    if kind == "session_kept_alive":
        return Completed(value=reply.session_kept_alive.ttl_ms, reply=reply, **common)
    return Completed(value=None, reply=reply, **common)


def txn_result(done: Completed) -> TxnResult:
    """A transaction's :class:`TxnResult` from its completed reply (the Rust
    ``txn_outcome``); each result as a :class:`Completed` of the same
    revision."""
    if done.kind != "txn":
        raise Invalid(f"unexpected reply to a transaction: {done.kind}")
    txn = done.reply.txn
    results = [_completed_reply(r, done.replayed, done.applied_index, done.attempts) for r in txn.results]
    return TxnResult(
        succeeded=txn.succeeded,
        results=results,
        revision=done.applied_index,
        replayed=done.replayed,
        attempts=done.attempts,
        reply=done.reply,
    )


# Commands (the wire's `Command`), shared by Client and Session.


def put_command(key: Bytes, value: Bytes, lease: Optional[str] = None) -> pb.Command:
    put = pb.Put(key=_bytes(key, "key"), value=_bytes(value, "value"))
    if lease is not None:
        put.lease = lease
    return pb.Command(put=put)


def delete_command(key: Bytes) -> pb.Command:
    return pb.Command(delete=pb.Delete(key=_bytes(key, "key")))


def append_command(key: Bytes, value: Bytes) -> pb.Command:
    return pb.Command(append=pb.Append(key=_bytes(key, "key"), value=_bytes(value, "value")))


def incr_command(key: Bytes, by: int = 1) -> pb.Command:
    return pb.Command(incr=pb.Incr(key=_bytes(key, "key"), by=int(by)))


def cas_command(key: Bytes, expected: Optional[Bytes], new: Bytes) -> pb.Command:
    cas = pb.Cas(key=_bytes(key, "key"), new_value=_bytes(new, "new value"))
    if expected is not None:
        cas.expected = _bytes(expected, "expected value")
    return pb.Command(cas=cas)


def compact_command(revision: int) -> pb.Command:
    return pb.Command(compact=pb.Compact(revision=int(revision)))


def lease_grant_command(name: str, ttl_ms: int) -> pb.Command:
    return pb.Command(lease_grant=pb.LeaseGrant(name=name, ttl_ms=int(ttl_ms)))


def lease_keep_alive_command(name: str) -> pb.Command:
    return pb.Command(lease_keep_alive=pb.LeaseRef(name=name))


def lease_revoke_command(name: str) -> pb.Command:
    return pb.Command(lease_revoke=pb.LeaseRef(name=name))


#: Commands that change nothing (the Rust `Command::is_mutating`).
_READ_ONLY = ("read",)


def is_mutating(command: pb.Command) -> bool:
    return command.WhichOneof("kind") not in _READ_ONLY


def _read_file(value) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    with open(os.fspath(value), "rb") as f:
        return f.read()


class Client:
    """A connection to an oncekv cluster.

    ``endpoints``: client addresses (``host:port``, ``http://host:port`` or
    ``https://host:port``), a list or a comma-separated string.
    ``timeout``: longest time a call may take in all, retries included
    (seconds). ``attempt_timeout``: longest wait for a node's connection to
    become ready before an attempt (nothing is sent on one that is not), and
    for one attempt's answer.
    ``user``/``password``: log in (``Authenticate``) before the first call
    and again when the token expires. ``ca_cert`` (PEM bytes or a file):
    TLS, checking the nodes against it; ``cert``/``key``: a client
    certificate (mutual TLS). ``token``: a token from an earlier login,
    sent as it is (the Rust ``Credentials::Token``). ``backoff``: the delay
    between retries. Connections are made lazily; the client is safe to use
    from several threads.
    """

    def __init__(
        self,
        endpoints: Union[str, Iterable[str]],
        timeout: float = 15.0,
        user: Optional[str] = None,
        password: Optional[str] = None,
        ca_cert=None,
        cert=None,
        key=None,
        attempt_timeout: float = 3.0,
        backoff: Optional[Backoff] = None,
        token: Optional[str] = None,
    ):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",")]
        endpoints = [e.strip() for e in endpoints if e and e.strip()]
        if not endpoints:
            raise ConfigError("no endpoints given")
        tls = ca_cert is not None
        self._endpoints: List[str] = []
        for endpoint in endpoints:
            if endpoint.startswith("https://"):
                tls = True
                endpoint = endpoint[len("https://") :]
            elif endpoint.startswith("http://"):
                endpoint = endpoint[len("http://") :]
            self._endpoints.append(endpoint.rstrip("/"))
        if (user is None) != (password is None):
            raise ConfigError("give both user and password, or neither")
        if (cert is None) != (key is None):
            raise ConfigError("give both cert and key, or neither")
        self._credentials = None
        if tls:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(ca_cert),
                private_key=_read_file(key),
                certificate_chain=_read_file(cert),
            )
        elif cert is not None:
            raise ConfigError("a client certificate needs TLS: give ca_cert or https:// endpoints")
        self.timeout = float(timeout)
        self.attempt_timeout = float(attempt_timeout)
        self.backoff = backoff or Backoff()
        self._user = user
        self._password = password
        self._lock = threading.Lock()
        self._leader: Optional[str] = None
        self._channels: Dict[str, _Connection] = {}
        self._token: Optional[str] = token
        self._closed = False

    # Connections.

    @property
    def endpoints(self) -> List[str]:
        return list(self._endpoints)

    @property
    def uses_tls(self) -> bool:
        return self._credentials is not None

    def _connection(self, address: str) -> _Connection:
        """The connection to ``address``: made on first use, and made anew
        when its channel will not reconnect unless asked (it lost its
        connection, or idled)."""
        spent = None
        with self._lock:
            if self._closed:
                raise ConfigError("the client is closed")
            entry = self._channels.get(address)
            if entry is not None and entry.spent:
                spent, entry = entry, None
                del self._channels[address]
            if entry is None:
                options = [
                    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
                    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
                    # One attempt is one send: the retry loop decides.
                    ("grpc.enable_retries", 0),
                    ("grpc.enable_http_proxy", 0),
                    # A channel of its own connection: a forgotten channel's
                    # successor dials anew instead of sharing it.
                    ("grpc.use_local_subchannel_pool", 1),
                    ("grpc.keepalive_time_ms", 2000),
                    ("grpc.keepalive_timeout_ms", 3000),
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ]
                if self._credentials is not None:
                    channel = grpc.secure_channel(address, self._credentials, options=options)
                else:
                    channel = grpc.insecure_channel(address, options=options)
                entry = _Connection(channel)
                self._channels[address] = entry
        if spent is not None:
            spent.release()
        return entry

    def _stub(self, address: str) -> kv_pb2_grpc.KvStub:
        return self._connection(address).stub

    def _forget_channel(self, address: str, connection: Optional[_Connection] = None) -> None:
        """Drops the channel to ``address`` (only if it is still
        ``connection``, when given) so the next attempt dials anew. It is
        not closed here: closing would cancel calls other threads have in
        flight on it (turning them into maybe-sent); it closes once no call
        holds it."""
        with self._lock:
            entry = self._channels.get(address)
            if entry is None or (connection is not None and entry is not connection):
                return
            del self._channels[address]
        entry.release()

    def close(self) -> None:
        """Closes every connection."""
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for entry in channels:
            entry.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call_metadata(self):
        token = self._token
        return [("authorization", f"Bearer {token}")] if token else None

    def _first_target(self) -> str:
        with self._lock:
            return self._leader or self._endpoints[0]

    def _set_leader(self, leader: Optional[str]) -> None:
        with self._lock:
            self._leader = leader

    def _next_target(self, current: str) -> str:
        try:
            position = self._endpoints.index(current)
            return self._endpoints[(position + 1) % len(self._endpoints)]
        except ValueError:
            return self._endpoints[0]

    def _pause(self, retries: List[int], deadline: float) -> None:
        delay = self.backoff.delay(retries[0])
        retries[0] += 1
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))

    # Authentication.

    def _needs_login(self) -> bool:
        return self._password is not None and self._token is None

    def _login(self, deadline: float) -> None:
        """Logs in with the configured password and keeps the token: at any
        node, following leader hints, until ``deadline``."""
        if self._password is None:
            return
        target = self._first_target()
        retries = [0]
        last_error = ""
        while time.monotonic() < deadline:
            connection = self._connection(target)
            not_ready = connection.wait_ready(min(self.attempt_timeout, deadline - time.monotonic()))
            remaining = deadline - time.monotonic()
            request = pb.AuthenticateRequest(user=self._user, password=self._password)
            if not_ready is not None or remaining <= 0:
                answer = (_NOT_SENT, not_ready or "the deadline passed")
            else:
                try:
                    response = connection.stub.Authenticate(request, timeout=min(self.attempt_timeout, remaining))
                    result = response.WhichOneof("result")
                    if result == "token":
                        self._token = response.token.token
                        return
                    answer = _call_failed(response.failure) if result == "failure" else (
                        _MAYBE_SENT,
                        "empty response",
                    )
                except grpc.RpcError as error:
                    answer = _failed(error)
            kind, payload = answer
            if kind == _UNAUTHENTICATED:
                raise Unauthenticated(payload)
            if kind == _REFUSED:
                raise payload
            if kind == _REDIRECT and payload and payload != target:
                target = payload
            elif kind == _REDIRECT:
                last_error = f"{target} is not the leader"
                target = self._next_target(target)
                self._pause(retries, deadline)
            elif kind in (_NOT_SENT, _MAYBE_SENT):
                last_error = f"{target}: {payload}"
                self._forget_channel(target, connection)
                target = self._next_target(target)
                self._pause(retries, deadline)
            else:  # _BUSY
                last_error = str(payload)
                self._pause(retries, deadline)
        raise Unreachable(f"login: {last_error}")

    # The retry loop.

    def _with_retries(
        self,
        retry_safe: bool,
        request_id: Optional[Tuple[int, int]],
        attempt: Callable[[kv_pb2_grpc.KvStub, float, int], Tuple[str, object]],
        mutating: bool = False,
        maybe_delivered: bool = False,
    ):
        """Runs ``attempt`` against the leader until it is done, the deadline
        passes, or it fails after maybe being sent when ``retry_safe`` is
        off. Returns the value, the attempts made, and why a send (an attempt
        of this call, or an earlier send: ``maybe_delivered``) may have
        reached the cluster (empty when none may have).

        Before each attempt the target's channel must be READY (waited for,
        within the attempt timeout and the deadline); when it is not, no
        call is made and the attempt was never sent.

        ``mutating``: the request may change the cluster's state. Once one
        of its sends may have been delivered, the call ends with the value or
        :class:`OutcomeUnknown`: an error this loop would raise (unreachable,
        unauthenticated, a refusal, a failed login, still overloaded at the
        deadline) says nothing of that send, so it becomes
        :class:`OutcomeUnknown`, naming what the last attempt answered."""
        tally = _Tally(maybe_delivered and mutating)
        try:
            return self._attempts(retry_safe, request_id, attempt, tally)
        except OutcomeUnknown:
            raise
        except OncekvError as error:
            if mutating and tally.maybe_sent:
                raise OutcomeUnknown(request_id, tally.attempts, tally.unknown(_answer(error))) from error
            raise

    def _attempts(self, retry_safe, request_id, attempt, tally: "_Tally"):
        deadline = time.monotonic() + self.timeout
        logged_in = False
        if self._needs_login():
            self._login(deadline)
            logged_in = True
        target = self._first_target()
        retries = [0]
        busy: Optional[OncekvError] = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if tally.maybe_sent:
                    raise OutcomeUnknown(request_id, tally.attempts, tally.unknown(tally.last_error))
                if busy is not None:
                    raise busy
                raise Unreachable(tally.last_error or "deadline passed")
            tally.attempts += 1
            connection = self._connection(target)
            not_ready = connection.wait_ready(min(self.attempt_timeout, remaining))
            timeout = min(self.attempt_timeout, deadline - time.monotonic())
            if not_ready is not None:
                kind, payload = _NOT_SENT, not_ready
            elif timeout <= 0:
                kind, payload = _NOT_SENT, "the deadline passed before sending"
            else:
                kind, payload = attempt(connection.stub, timeout, tally.attempts)
            if kind == _DONE:
                self._set_leader(target)
                return payload, tally.attempts, tally.why if tally.maybe_sent else ""
            if kind == _REFUSED:
                raise payload
            if kind == _UNAUTHENTICATED:
                # Not carried out. A password logs in again, once per call
                # (the token expired or the password changed).
                if self._password is None or logged_in:
                    raise Unauthenticated(payload)
                self._token = None
                self._login(deadline)
                logged_in = True
            elif kind == _BUSY:
                self._set_leader(target)
                if payload.kind == "OVERLOAD_KIND_NO_SPACE":
                    # The store's quota, or an alarm raised by hand, holds
                    # until an operator frees space: no retry would see it
                    # lifted before the deadline.
                    raise payload
                busy = payload
                tally.last_error = f"{target}: {payload}"
                self._pause(retries, deadline)
            elif kind == _REDIRECT:
                tally.last_error = f"{target} is not the leader"
                if payload and payload != target:
                    target = payload
                else:
                    self._pause(retries, deadline)
                    target = self._next_target(target)
                self._set_leader(None)
            elif kind == _NOT_SENT:
                tally.last_error = f"{target}: {payload}"
                self._forget_channel(target, connection)
                target = self._next_target(target)
                self._pause(retries, deadline)
            else:  # _MAYBE_SENT
                tally.sent_maybe(tally.attempts)
                tally.last_error = f"{target}: {payload}"
                if not retry_safe:
                    raise OutcomeUnknown(request_id, tally.attempts, tally.last_error)
                self._forget_channel(target, connection)
                self._set_leader(None)
                target = self._next_target(target)
                self._pause(retries, deadline)

    # Execute and read.

    def execute_request(
        self, request: pb.ExecuteRequest, maybe_delivered: bool = False
    ) -> Tuple[pb.Outcome, int, int]:
        """Sends a request through the log and returns what the state machine
        decided: ``(outcome, log_index, attempts)``. Retries follow the rules
        above.

        ``maybe_delivered``: an earlier send of this same request (the same
        session and sequence number, or idempotency key) may have been
        delivered, for example one that ended in :class:`OutcomeUnknown`.
        For a request that changes state, the call then ends with an outcome
        ``applied`` or ``replayed`` (an application-level rejection among
        them: it is the request's reply), ``request_mismatch``, or
        :class:`OutcomeUnknown`: never :class:`Unreachable` or another error
        or refusal outcome saying "not applied", which would say nothing of
        the earlier send. The same holds from the first attempt of this call
        that may have been delivered. Without it (the default) a first send
        keeps its exact answers. Reads (commands that change nothing) are
        unaffected."""
        origin = request.WhichOneof("origin")
        mutating = is_mutating(request.command)
        retry_safe = origin is not None or not mutating
        request_id = (request.session.session_id, request.session.seq) if origin == "session" else None

        def attempt(stub, timeout, number):
            wire = request
            if origin == "session":
                wire = pb.ExecuteRequest()
                wire.CopyFrom(request)
                wire.session.attempt = number
            try:
                response = stub.Execute(wire, timeout=timeout, metadata=self._call_metadata())
            except grpc.RpcError as error:
                return _failed(error)
            result = response.WhichOneof("result")
            if result == "outcome":
                if response.outcome.WhichOneof("kind") == "overloaded":
                    return _BUSY, _overloaded(response.outcome.overloaded)
                if response.outcome.WhichOneof("kind") is None:
                    return _MAYBE_SENT, "an outcome without a kind"
                return _DONE, (response.outcome, response.log_index)
            if result == "failure":
                return _call_failed(response.failure)
            return _MAYBE_SENT, "empty response"

        (outcome, index), attempts, earlier = self._with_retries(
            retry_safe, request_id, attempt, mutating=mutating, maybe_delivered=maybe_delivered
        )
        # After a send that may have been delivered, only the request's own
        # reply and a mismatch are definite. Any other refusal (the session
        # is gone, its record was freed, a table is full, the window moved,
        # ...) may have been decided without looking at that send: the
        # outcome is unknown, not "not applied".
        kind = outcome.WhichOneof("kind")
        if earlier and kind not in _DEFINITE_AFTER_MAYBE_DELIVERED and (mutating or kind in _FORGETS_THE_PAST):
            raise OutcomeUnknown(request_id, attempts, f"{earlier}; the last attempt was answered {kind}")
        return outcome, index, attempts

    def execute(self, command: pb.Command, idempotency_key: Optional[Bytes] = None) -> Completed:
        """Runs a command as a one-shot request under an idempotency key
        (random unless given), so retries and re-runs with the same key
        apply it once."""
        key = _bytes(idempotency_key, "idempotency key") if idempotency_key is not None else _key_hex().encode()
        request = pb.ExecuteRequest(idempotency_key=key, command=command)
        outcome, index, attempts = self.execute_request(request)
        return completed(outcome, index, attempts)

    def execute_plain(self, command: pb.Command) -> Completed:
        """Runs a command as a plain request (at-least-once: never retried
        once it may have been sent, if it changes anything)."""
        outcome, index, attempts = self.execute_request(pb.ExecuteRequest(command=command))
        return completed(outcome, index, attempts)

    def read(self, query: pb.Query, serializable: bool = False) -> pb.Reply:
        """Answers a query (linearizable unless ``serializable``); retried
        like any read."""
        request = pb.ReadRequest(query=query, serializable=serializable)

        def attempt(stub, timeout, _number):
            try:
                response = stub.Read(request, timeout=timeout, metadata=self._call_metadata())
            except grpc.RpcError as error:
                return _failed(error)
            result = response.WhichOneof("result")
            if result == "reply":
                return _DONE, response.reply
            if result == "failure":
                return _call_failed(response.failure)
            return _MAYBE_SENT, "empty response"

        reply, _, _ = self._with_retries(True, None, attempt)
        if reply.WhichOneof("kind") == "rejected":
            raise _rejected(reply.rejected)
        return reply

    def status(self, address: Optional[str] = None) -> pb.StatusResponse:
        """The status of one node (``address``), or of the first reachable
        endpoint."""
        candidates = [address] if address else list(self._endpoints)
        if self._needs_login():
            self._login(time.monotonic() + self.timeout)
        last = ""
        for candidate in candidates:
            try:
                return self._stub(candidate).Status(
                    pb.StatusRequest(), timeout=self.attempt_timeout, metadata=self._call_metadata()
                )
            except grpc.RpcError as error:
                refusal = _refused_by_transport(error)
                if isinstance(refusal, (PermissionDenied, Unauthenticated)):
                    raise refusal
                last = f"{candidate}: {error.details()}"
        raise Unreachable(last)

    # Plain values.

    def get(self, key: Bytes, serializable: bool = False, revision: Optional[int] = None) -> Optional[bytes]:
        """The value of ``key`` (``None`` when absent); at ``revision`` if
        given (a past state: :class:`Compacted` once the history no longer
        reaches back to it, :class:`FutureRevision` beyond the last applied
        one)."""
        reply = self._get(key, serializable, revision)
        return _optional(reply.get, "value")

    def get_kv(self, key: Bytes, revision: Optional[int] = None, serializable: bool = False) -> Optional[KeyValue]:
        """``key`` with its value and revisions (a :class:`KeyValue`:
        ``.value``, ``.create_revision``, ``.mod_revision``, ``.version``),
        ``None`` when absent; at ``revision`` if given (as :meth:`get`)."""
        key = _bytes(key, "key")
        reply = self._get(key, serializable, revision)
        if not reply.get.HasField("value"):
            return None
        return KeyValue(key, reply.get.value, _meta(reply.get.meta))

    def _get(self, key: Bytes, serializable: bool, revision: Optional[int]) -> pb.Reply:
        get = pb.Get(key=_bytes(key, "key"), revision=int(revision or 0))
        return self.read(pb.Query(get=get), serializable)

    def scan(
        self, prefix: Bytes = b"", limit: int = 0, serializable: bool = False, revision: Optional[int] = None
    ) -> ScanResult:
        """The ``(key, value)`` pairs under ``prefix`` in key order (at most
        ``limit``; 0: the server's maximum). ``.more`` says whether it was
        cut short. At ``revision`` if given (as :meth:`get`)."""
        reply = self._scan(prefix, limit, serializable, revision)
        return ScanResult([(e.key, e.value) for e in reply.scan.entries], reply.scan.more)

    def scan_kv(
        self, prefix: Bytes = b"", limit: int = 0, serializable: bool = False, revision: Optional[int] = None
    ) -> ScanResult:
        """As :meth:`scan`, each entry a :class:`KeyValue` with its
        revisions."""
        reply = self._scan(prefix, limit, serializable, revision)
        return ScanResult([_key_value(e) for e in reply.scan.entries], reply.scan.more)

    def _scan(self, prefix: Bytes, limit: int, serializable: bool, revision: Optional[int]) -> pb.Reply:
        scan = pb.Scan(prefix=_bytes(prefix, "prefix"), limit=int(limit), revision=int(revision or 0))
        return self.read(pb.Query(scan=scan), serializable)

    # Transactions, compaction, watches.

    def txn(self, txn: Union[Txn, pb.Txn], idempotency_key: Optional[Bytes] = None) -> TxnResult:
        """Runs a transaction once, under an idempotency key (random unless
        given): retries and re-runs with the same key return its original
        result (``.replayed``). ``.succeeded`` says which branch ran,
        ``.results`` holds one :class:`Completed` per operation of it, and
        ``.revision`` is the revision it applied at. One refused operation
        undoes the whole transaction (:class:`Rejected`); a transaction
        refused for its shape raises :class:`TxnConflict` or
        :class:`TxnTooLarge`. Nothing changed in either case."""
        return txn_result(self.execute(txn_command(txn), idempotency_key))

    def compact(self, revision: int, idempotency_key: Optional[Bytes] = None) -> Completed:
        """Drops the history at and below ``revision`` (admin once users are
        enforced): reads of those revisions then raise :class:`Compacted`.
        ``.value`` is the compacted revision now. :class:`FutureRevision`
        beyond the last applied revision."""
        return self.execute(compact_command(revision), idempotency_key)

    def watch(
        self,
        key: Bytes,
        prefix: bool = False,
        start_revision: int = 0,
        previous: bool = False,
        progress_interval_ms: int = 0,
        progress: bool = False,
    ):
        """Watches ``key`` (or every key under it, with ``prefix``) from
        ``start_revision`` (0: changes after the watch starts): a
        :class:`~oncekv.watch.Watcher`, an iterator of :class:`Changes`
        (one revision's events, in revision order, each exactly once,
        across broken streams and node failures) and, with ``progress``,
        :class:`Progress` notices. It raises :class:`Compacted` when the
        history no longer holds the next revision. Close it (or use it as a
        context manager) to stop it."""
        from oncekv.watch import Watcher

        return Watcher(
            self,
            _bytes(key, "key"),
            prefix=prefix,
            start_revision=start_revision,
            previous=previous,
            progress_interval_ms=progress_interval_ms,
            progress=progress,
        )

    def lease_list(self) -> List[LeaseInfo]:
        """The live leases."""
        reply = self.read(pb.Query(lease_list=pb.Empty()))
        return [LeaseInfo(l.name, l.ttl_ms, l.expires_at_ms, l.keys) for l in reply.leases.leases]

    def put(self, key: Bytes, value: Bytes, lease: Optional[str] = None, idempotency_key=None) -> Completed:
        """Sets ``key``; ``.value`` is the previous value or ``None``."""
        return self.execute(put_command(key, value, lease), idempotency_key)

    def delete(self, key: Bytes, idempotency_key=None) -> Completed:
        """Deletes ``key``; ``.value`` is the previous value or ``None``."""
        return self.execute(delete_command(key), idempotency_key)

    def append(self, key: Bytes, value: Bytes, idempotency_key=None) -> Completed:
        """Appends to ``key``'s value; ``.value`` is the new length."""
        return self.execute(append_command(key, value), idempotency_key)

    def incr(self, key: Bytes, by: int = 1, idempotency_key=None) -> Completed:
        """Adds ``by`` to the integer at ``key`` (absent: 0); ``.value`` is
        the result."""
        return self.execute(incr_command(key, by), idempotency_key)

    def cas(self, key: Bytes, expected: Optional[Bytes], new: Bytes, idempotency_key=None) -> Completed:
        """Sets ``key`` to ``new`` if its value is ``expected`` (``None``: if
        it is absent). ``.swapped``; ``.current`` when it did not swap."""
        return self.execute(cas_command(key, expected, new), idempotency_key)

    def lease_grant(self, name: str, ttl_ms: int, idempotency_key=None) -> Completed:
        """Grants lease ``name`` for ``ttl_ms``; ``.expires_at_ms``."""
        return self.execute(lease_grant_command(name, ttl_ms), idempotency_key)

    def lease_keep_alive(self, name: str, idempotency_key=None) -> Completed:
        """Renews lease ``name`` once; ``.expires_at_ms``."""
        return self.execute(lease_keep_alive_command(name), idempotency_key)

    def lease_revoke(self, name: str, idempotency_key=None) -> Completed:
        """Revokes lease ``name``, deleting its keys; ``.keys_deleted``."""
        return self.execute(lease_revoke_command(name), idempotency_key)

    def open_session(self, ttl_ms: int = 60000, window: int = 128, keep_alive: bool = True):
        """Opens a session through the replicated log (itself sent under an
        idempotency key, so a retried open does not open two)."""
        from oncekv.session import Session

        return Session._open(self, ttl_ms, window, keep_alive)

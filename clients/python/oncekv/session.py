"""``Session``: a client session of the replicated log.

It numbers requests, sends the lowest sequence number still awaited as the
acknowledgement watermark (``first_incomplete``), keeps up to ``window``
requests in flight from any number of threads, retries each with its own
sequence number until it completes or its deadline passes, and keeps itself
alive every ``ttl/4`` in a background thread. A port of the Rust client's
``crates/oncekv-client/src/session.rs``.
"""

from __future__ import annotations

import threading
import weakref
from typing import List, Optional, Set

from oncekv._proto import kv_pb2 as pb
from oncekv.client import (
    Bytes,
    Client,
    _key_hex,
    append_command,
    cas_command,
    completed,
    delete_command,
    incr_command,
    lease_grant_command,
    lease_keep_alive_command,
    lease_revoke_command,
    put_command,
    txn_result,
)
from oncekv.errors import Invalid, OncekvError, SessionExpired, Unauthorized
from oncekv.results import Completed, KeyValue, LeaseInfo, ScanResult, TxnResult
from oncekv.txn import txn_command


def _keep_alive_loop(session_ref, stop: threading.Event, period: float) -> None:
    """Keeps the session alive every ``period`` seconds until it is closed,
    dropped or reported expired."""
    while not stop.wait(period):
        session = session_ref()
        if session is None:
            return
        try:
            session.keep_alive()
        except (SessionExpired, Unauthorized):
            return
        except OncekvError:
            pass  # will retry at the next period
        finally:
            del session


class Session:
    """Exactly-once requests from any number of threads.

    Open one with :meth:`Client.open_session`; use it as a context manager
    to close it at the end.
    """

    def __init__(
        self,
        client: Client,
        session_id: int,
        secret: bytes,
        ttl_ms: int = 60000,
        window: int = 128,
        next_seq: int = 1,
    ):
        """A handle on an existing session (for example one saved
        elsewhere), whose next new sequence number is ``next_seq``. No
        keep-alive runs unless :meth:`start_keep_alive` is called."""
        self.client = client
        self.session_id = int(session_id)
        self.secret = bytes(secret)
        self.ttl_ms = int(ttl_ms)
        self.window = max(1, int(window))
        self._next_seq = max(1, int(next_seq))
        #: Sequence numbers sent and not yet answered.
        self._incomplete: Set[int] = set()
        #: Notified whenever a request completes (the window may slide).
        self._slid = threading.Condition()
        self._expired = False
        self._closed = False
        self._stop = threading.Event()
        self._keep_alive_thread: Optional[threading.Thread] = None

    @classmethod
    def _open(cls, client: Client, ttl_ms: int, window: int, keep_alive: bool) -> "Session":
        key = f"open-{_key_hex()}".encode()
        request = pb.ExecuteRequest(
            idempotency_key=key,
            command=pb.Command(open_session=pb.OpenSession(ttl_ms=int(ttl_ms), window=int(window))),
        )
        outcome, index, attempts = client.execute_request(request)
        result = completed(outcome, index, attempts)
        if result.kind != "session_opened":
            raise Invalid(f"unexpected reply to a session open: {result.kind}")
        opened = result.reply.session_opened
        session = cls(client, opened.session_id, opened.secret, opened.ttl_ms or ttl_ms, opened.window or window)
        if keep_alive:
            session.start_keep_alive()
        return session

    # State.

    @property
    def next_seq(self) -> int:
        """The next sequence number a new request will take."""
        with self._slid:
            return self._next_seq

    @property
    def first_incomplete(self) -> int:
        """The lowest sequence number still awaited (the next one when none
        is)."""
        with self._slid:
            return min(self._incomplete) if self._incomplete else self._next_seq

    @property
    def expired(self) -> bool:
        """Whether the cluster reported the session expired."""
        return self._expired

    def _ref(self) -> pb.SessionRef:
        return pb.SessionRef(session_id=self.session_id, secret=self.secret)

    # Keep-alive and close.

    def start_keep_alive(self) -> None:
        """Sends keep-alives every ``ttl/4`` (at least 50 ms) in a daemon
        thread until the session is closed, dropped or reported expired."""
        if self._keep_alive_thread is not None:
            return
        period = max(self.ttl_ms / 4000.0, 0.05)
        thread = threading.Thread(
            target=_keep_alive_loop,
            args=(weakref.ref(self), self._stop, period),
            name=f"oncekv-session-{self.session_id}-keep-alive",
            daemon=True,
        )
        self._keep_alive_thread = thread
        thread.start()

    def keep_alive(self) -> None:
        """Keeps the session alive once."""
        command = pb.Command(keep_alive=self._ref())
        outcome, index, attempts = self.client.execute_request(pb.ExecuteRequest(command=command))
        try:
            completed(outcome, index, attempts)
        except SessionExpired:
            self._expired = True
            raise

    def close(self) -> None:
        """Closes the session, freeing its completion records."""
        self._closed = True
        self._stop.set()
        command = pb.Command(close_session=self._ref())
        outcome, index, attempts = self.client.execute_request(pb.ExecuteRequest(command=command))
        completed(outcome, index, attempts)

    def detach(self) -> None:
        """Stops the keep-alive and leaves the session open (it expires by
        TTL unless resumed and kept alive elsewhere)."""
        self._closed = True
        self._stop.set()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        if not self._closed and not self._expired:
            try:
                self.close()
            except OncekvError:
                pass  # an unclosed session expires by its TTL

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # Execute.

    def execute(self, command: pb.Command) -> Completed:
        """Runs a command exactly once; ``.replayed`` says whether the reply
        came from a completion record."""
        if self._expired:
            raise SessionExpired()
        seq = self._take_seq()
        try:
            return self._send(seq, None, command)
        finally:
            # Answered, rejected or given up on: no longer awaited.
            with self._slid:
                self._incomplete.discard(seq)
                self._slid.notify_all()

    def execute_seq(
        self,
        seq: int,
        command: pb.Command,
        first_incomplete: Optional[int] = None,
        maybe_delivered: bool = False,
    ) -> Completed:
        """Sends sequence number ``seq`` exactly, with ``first_incomplete``
        (default: ``seq``): to retry a specific request by hand.

        ``maybe_delivered``: an earlier send of ``seq`` with this command may
        have been delivered (it ended in :class:`OutcomeUnknown`). Then the
        call returns the request's reply (its original one, ``.replayed``,
        if it had applied), raises its application-level rejection (a reply
        too) or :class:`RequestMismatch`, or raises :class:`OutcomeUnknown`
        again: an unreachable cluster, an expired session, a freed record,
        a sequence gap or any other refusal says nothing of the earlier
        send, so none of them is reported as "not applied". Leave it
        ``False`` only when no earlier send of ``seq`` can have been
        delivered."""
        first = int(first_incomplete if first_incomplete is not None else seq)
        return self._send(int(seq), first, command, maybe_delivered=maybe_delivered)

    def _take_seq(self) -> int:
        """Waits until the window has room and takes the next sequence
        number. The window slides on the lowest number still awaited: a new
        number must stay below ``first_incomplete + window``, as the cluster
        requires, however many requests are in flight."""
        with self._slid:
            while True:
                following = self._next_seq
                lowest = min(self._incomplete) if self._incomplete else following
                if following < lowest + self.window:
                    self._next_seq = following + 1
                    self._incomplete.add(following)
                    return following
                self._slid.wait()

    def _send(
        self, seq: int, first_incomplete: Optional[int], command: pb.Command, maybe_delivered: bool = False
    ) -> Completed:
        if first_incomplete is None:
            with self._slid:
                lowest = min(self._incomplete) if self._incomplete else seq
            first_incomplete = min(lowest, seq)
        header = pb.RequestHeader(
            session_id=self.session_id,
            secret=self.secret,
            seq=seq,
            first_incomplete=first_incomplete,
            attempt=1,
        )
        request = pb.ExecuteRequest(session=header, command=command)
        outcome, index, attempts = self.client.execute_request(request, maybe_delivered=maybe_delivered)
        if outcome.WhichOneof("kind") == "session_expired":
            self._expired = True
        return completed(outcome, index, attempts)

    # The client's calls, on the session.

    def put(self, key: Bytes, value: Bytes, lease: Optional[str] = None) -> Completed:
        return self.execute(put_command(key, value, lease))

    def delete(self, key: Bytes) -> Completed:
        return self.execute(delete_command(key))

    def append(self, key: Bytes, value: Bytes) -> Completed:
        return self.execute(append_command(key, value))

    def incr(self, key: Bytes, by: int = 1) -> Completed:
        return self.execute(incr_command(key, by))

    def cas(self, key: Bytes, expected: Optional[Bytes], new: Bytes) -> Completed:
        return self.execute(cas_command(key, expected, new))

    def lease_grant(self, name: str, ttl_ms: int) -> Completed:
        return self.execute(lease_grant_command(name, ttl_ms))

    def lease_keep_alive(self, name: str) -> Completed:
        return self.execute(lease_keep_alive_command(name))

    def lease_revoke(self, name: str) -> Completed:
        return self.execute(lease_revoke_command(name))

    def txn(self, txn) -> TxnResult:
        """Runs a transaction on this session's next sequence number:
        exactly once, and a retry of that number (:meth:`txn_seq`) returns
        its original result (``.replayed``). See :meth:`Client.txn`."""
        return txn_result(self.execute(txn_command(txn)))

    def txn_seq(
        self, seq: int, txn, first_incomplete: Optional[int] = None, maybe_delivered: bool = False
    ) -> TxnResult:
        """Sends a transaction as sequence number ``seq`` exactly (to retry
        one by hand, as :meth:`execute_seq`, ``maybe_delivered`` included:
        after an earlier send that may have been delivered, only its result,
        its rejection or a mismatch is definite; anything else is
        :class:`OutcomeUnknown`)."""
        return txn_result(self.execute_seq(seq, txn_command(txn), first_incomplete, maybe_delivered=maybe_delivered))

    def get(self, key: Bytes, serializable: bool = False, revision: Optional[int] = None) -> Optional[bytes]:
        """A read (``Read`` call, linearizable unless ``serializable``)."""
        return self.client.get(key, serializable, revision)

    def get_kv(self, key: Bytes, revision: Optional[int] = None, serializable: bool = False) -> Optional[KeyValue]:
        return self.client.get_kv(key, revision, serializable)

    def scan(
        self, prefix: Bytes = b"", limit: int = 0, serializable: bool = False, revision: Optional[int] = None
    ) -> ScanResult:
        return self.client.scan(prefix, limit, serializable, revision)

    def scan_kv(
        self, prefix: Bytes = b"", limit: int = 0, serializable: bool = False, revision: Optional[int] = None
    ) -> ScanResult:
        return self.client.scan_kv(prefix, limit, serializable, revision)

    def lease_list(self) -> List[LeaseInfo]:
        return self.client.lease_list()

    def __repr__(self) -> str:
        return f"Session(id={self.session_id}, next_seq={self.next_seq})"

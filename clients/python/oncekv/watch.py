"""``Watcher``: every change to a key or prefix, from a start revision on,
in revision order, each exactly once.

A watch is served by any node from its applied state. When the stream
breaks (a node stops, a leader changes, the node cancels a slow watcher or
restores a snapshot) the watcher resumes on the next endpoint from the
revision after the last one it delivered, so no change is lost or
repeated. A start (or next) revision the history no longer reaches raises
:class:`~oncekv.errors.Compacted`. A port of the Rust client's
``crates/oncekv-client/src/watch.rs``.

The stream is read by a daemon thread into a bounded queue; iterating (or
:meth:`Watcher.next` with a timeout) takes from it. A consumer that falls
behind blocks the thread, the node may then cancel the watch as too slow,
and the watcher resumes it where it stopped.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import List, Optional, Union

import grpc

from oncekv._proto import kv_pb2 as pb
from oncekv.errors import Compacted, Invalid, OncekvError, PermissionDenied, Unauthenticated
from oncekv.results import DELETE, PUT, Changes, Event, KeyMeta, Progress

#: Updates held for the consumer before the reading thread waits.
QUEUE_MAX = 1024

_END = object()


def _event(wire: pb.Event) -> Event:
    kind = DELETE if wire.type == pb.EVENT_TYPE_DELETE else PUT
    meta = KeyMeta(wire.meta.create_revision, wire.meta.mod_revision, wire.meta.version)
    previous = wire.previous if wire.HasField("previous") else None
    return Event(kind, wire.key, wire.value, meta, previous, wire.revision)


class Watcher:
    """A running watch: iterate it for :class:`~oncekv.results.Changes`
    (and :class:`~oncekv.results.Progress` when asked for). Made by
    :meth:`Client.watch`; a context manager that closes it."""

    def __init__(
        self,
        client,
        key: bytes,
        prefix: bool = False,
        start_revision: int = 0,
        previous: bool = False,
        progress_interval_ms: int = 0,
        progress: bool = False,
    ):
        self.client = client
        self.key = key
        self.prefix = bool(prefix)
        self.previous = bool(previous)
        self.progress_interval_ms = int(progress_interval_ms)
        self.progress = bool(progress)
        #: The next revision to deliver; 0 until the first start.
        self._next = int(start_revision)
        self._target = client._first_target()
        #: How many streams were started (1 + resumes).
        self.starts = 0
        self._queue: "queue.Queue" = queue.Queue(QUEUE_MAX)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call = None
        self._done = False
        self._thread = threading.Thread(target=self._run, name="oncekv-watch", daemon=True)
        self._thread.start()

    # What the caller sees.

    @property
    def next_revision(self) -> int:
        """The revision the next change will have at least (as read from
        the stream; updates may still wait in the queue)."""
        return self._next

    @property
    def endpoint(self) -> str:
        """The node the stream is (or will next be) on."""
        return self._target

    def __iter__(self) -> "Watcher":
        return self

    def __next__(self) -> Union[Changes, Progress]:
        return self.next()

    def next(self, timeout: Optional[float] = None) -> Union[Changes, Progress]:
        """The next update, waiting at most ``timeout`` seconds (``None``:
        as long as it takes; then ``TimeoutError``). Raises the error that
        ended the watch (:class:`Compacted`, :class:`PermissionDenied`,
        ...), and ``StopIteration`` once closed."""
        if self._done:
            raise StopIteration
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no watch update within {timeout}s") from None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def close(self) -> None:
        """Stops the watch (cancels the stream)."""
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        self._done = True

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            self.close()

    # The reading thread.

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        failures = 0
        relogged = False
        try:
            while not self._stop.is_set():
                try:
                    outcome = self._stream()
                except OncekvError as error:
                    if isinstance(error, Unauthenticated) and self.client._password is not None and not relogged:
                        self.client._token = None
                        relogged = True
                        continue
                    self._put(error)
                    return
                if self._stop.is_set():
                    return
                if outcome == "resume":
                    # Canceled by the node after it started (too slow, a
                    # snapshot installed): at once, on the next endpoint.
                    failures = 0
                    relogged = False
                    self._target = self.client._next_target(self._target)
                    continue
                # Broken, or could not start: the next endpoint, after a
                # pause that grows with consecutive failures.
                if outcome == "broken":
                    self.client._forget_channel(self._target)
                self._target = self.client._next_target(self._target)
                failures += 1
                self._stop.wait(0.05 * min(failures, 20))
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            self._put(error)
        finally:
            self._put(_END)

    def _stream(self) -> str:
        """Runs one stream on the current target until it ends. Returns
        ``"resume"`` when the node canceled it after starting (resume at
        once on the next endpoint), ``"refused"`` when the node answered
        but did not start it, ``"broken"`` when the stream failed; raises
        what ends the watch."""
        client = self.client
        if client._needs_login():
            client._login(time.monotonic() + client.timeout)
        request = pb.WatchRequest(
            key=self.key,
            prefix=self.prefix,
            start_revision=self._next,
            previous=self.previous,
            progress_interval_ms=self.progress_interval_ms,
        )
        started = False
        try:
            call = client._stub(self._target).Watch(request, metadata=client._call_metadata())
            with self._lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()
                return "broken"
            self.starts += 1
            for message in call:
                kind = message.WhichOneof("kind")
                if kind == "started":
                    started = True
                    self._next = max(self._next, message.started.revision + 1)
                elif kind == "events":
                    started = True
                    if not self._deliver(message.events.events):
                        return "broken"
                elif kind == "progress":
                    revision = message.progress
                    if revision + 1 > self._next:
                        self._next = revision + 1
                    if self.progress and not self._put(Progress(revision)):
                        return "broken"
                elif kind == "canceled":
                    if message.canceled.compacted > 0:
                        raise Compacted(self._next, message.canceled.compacted, message.canceled.reason)
                    return "resume" if started else "refused"
                elif kind == "failure":
                    failure = message.failure
                    which = failure.WhichOneof("kind")
                    if which == "permission_denied":
                        raise PermissionDenied(failure.permission_denied.reason)
                    if which == "unauthenticated":
                        raise Unauthenticated(failure.unauthenticated.reason)
                    return "refused"
            return "broken"  # ended without a cancel
        except grpc.RpcError as error:
            if self._stop.is_set():
                return "broken"
            code = error.code()
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise PermissionDenied(error.details() or "") from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise Unauthenticated(error.details() or "") from None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise Invalid(error.details() or "") from None
            return "broken"
        finally:
            with self._lock:
                self._call = None

    def _deliver(self, wire_events) -> bool:
        """Groups events by revision and queues them; a revision already
        delivered (never expected) is skipped rather than repeated."""
        groups: List[Changes] = []
        current: List[Event] = []
        revision = None
        for wire in wire_events:
            if wire.revision < self._next:
                continue
            event = _event(wire)
            if revision is not None and event.revision != revision:
                groups.append(Changes(revision, current))
                current = []
            revision = event.revision
            current.append(event)
        if revision is not None:
            groups.append(Changes(revision, current))
        for group in groups:
            # Delivered once queued: the next revision moves past it first,
            # so a stream broken from here on resumes after it.
            self._next = max(self._next, group.revision + 1)
            if not self._put(group):
                return False
        return True

    def __repr__(self) -> str:
        return f"Watcher(key={self.key!r}, prefix={self.prefix}, next_revision={self._next}, endpoint={self._target})"

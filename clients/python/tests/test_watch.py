"""Watches against real nodes: every committed change once, in revision
order, across the kill of the node being watched."""

from __future__ import annotations

import threading
import time

from oncekv import Changes, Client, Progress, Txn, TxnOp

from conftest import eventually


def collect(watcher, until_revision: int, timeout: float = 30.0):
    """The updates of ``watcher`` up to ``until_revision``."""
    deadline = time.monotonic() + timeout
    got = []
    while not got or got[-1].revision < until_revision:
        got.append(watcher.next(timeout=max(0.1, deadline - time.monotonic())))
    return got


def test_a_watch_from_a_revision_sees_exactly_the_committed_changes_in_order(make_cluster):
    cluster = make_cluster(1)
    with Client(cluster.endpoints, timeout=10) as client:
        client.put("other", "x")
        start = client.put("w/a", "1").applied_index
        client.put("other", "y")
        client.put("w/b", "2")
        both = client.txn(Txn().on_success(TxnOp.put("w/a", "3"), TxnOp.incr("w/c", 4))).revision
        last = client.delete("w/b").applied_index
        with client.watch("w/", prefix=True, start_revision=start, previous=True) as watcher:
            updates = collect(watcher, last)
            seen = [
                (u.revision, [(e.kind, e.key, e.value, e.previous) for e in u.events]) for u in updates
            ]
            assert seen == [
                (start, [("put", b"w/a", b"1", None)]),
                (start + 2, [("put", b"w/b", b"2", None)]),
                (both, [("put", b"w/a", b"3", b"1"), ("put", b"w/c", b"4", None)]),
                (last, [("delete", b"w/b", b"", b"2")]),
            ]
            assert all(isinstance(u, Changes) for u in updates)
            assert updates[2].events[0].meta.version == 2
            assert updates[2].events[0].meta.create_revision == start
            # Live changes follow, and nothing of other keys.
            client.put("other", "z")
            live = client.put("w/d", "5").applied_index
            (update,) = collect(watcher, live)
            assert (update.revision, update.events[0].key) == (live, b"w/d")
        # A single key, from now on (start_revision 0), with progress notices.
        with client.watch("w/a", progress=True, progress_interval_ms=100) as watcher:
            progress = watcher.next(timeout=10)
            assert isinstance(progress, Progress) and progress.revision >= live
            changed = client.put("w/a", "6").applied_index
            update = watcher.next(timeout=10)
            while isinstance(update, Progress):
                update = watcher.next(timeout=10)
            assert update.revision == changed and update.events[0].value == b"6"


N = 40


def test_a_watch_keeps_going_without_loss_or_repeat_when_its_node_is_killed(make_cluster):
    cluster = make_cluster(3)
    with Client(cluster.endpoints, timeout=30, attempt_timeout=2) as client:
        start = client.put("seed", "0").applied_index
        watcher = client.watch("ctr", start_revision=start)
        written, errors = [], []

        def write():
            try:
                with client.open_session() as session:
                    for _ in range(N):
                        done = session.incr("ctr")
                        written.append((done.applied_index, done.value))
                        time.sleep(0.02)
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

        writer = threading.Thread(target=write)
        writer.start()
        seen = []
        deadline = time.monotonic() + 120
        killed = None
        while len(seen) < N and time.monotonic() < deadline and not errors:
            try:
                update = watcher.next(timeout=1)
            except TimeoutError:
                continue
            seen.extend((update.revision, int(e.value)) for e in update.events)
            if killed is None and len(seen) >= N // 3:
                # Kill the node serving the stream (it may be the leader).
                killed = next(n for n in cluster.nodes if n.client == watcher.endpoint)
                killed.kill()
        writer.join(timeout=120)
        watcher.close()
        assert not writer.is_alive() and errors == [], (errors, cluster.logs())
        assert killed is not None
        # Every increment once, in order, at the revision it applied at.
        assert [value for _, value in seen] == list(range(1, N + 1))
        assert seen == written
        assert watcher.starts >= 2
        assert watcher.endpoint != killed.client
        eventually(lambda: client.get("ctr") == str(N).encode(), 30, "the counter to read N")

"""Transactions, revisions, reads of the past and compaction, against real
nodes."""

from __future__ import annotations

import pytest

from oncekv import (
    Client,
    Compacted,
    Compare,
    FutureRevision,
    KeyValue,
    Rejected,
    Txn,
    TxnConflict,
    TxnOp,
    TxnTooLarge,
    ReplyTooLarge,
)


@pytest.fixture
def client(cluster3):
    with Client(cluster3.endpoints, timeout=20) as client:
        yield client


def transfer(amount: int) -> Txn:
    return (
        Txn()
        .compare(Compare.exists("acct/a"), Compare.exists("acct/b"))
        .on_success(TxnOp.incr("acct/a", -amount), TxnOp.incr("acct/b", amount))
        .on_failure(TxnOp.get("acct/a"))
    )


def test_a_transfer_on_a_session_retried_with_its_seq_returns_the_original_result_and_applies_once(client):
    client.put("acct/a", "100")
    client.put("acct/b", "0")
    with client.open_session() as session:
        seq = session.next_seq
        first = session.txn(transfer(30))
        assert (first.succeeded, first.replayed) == (True, False)
        assert [r.value for r in first.results] == [70, 30]
        # Both accounts moved at the transaction's revision.
        a, b = client.get_kv("acct/a"), client.get_kv("acct/b")
        assert (a.value, b.value) == (b"70", b"30")
        assert a.mod_revision == b.mod_revision == first.revision
        # The lost-reply retry: the same sequence number, the original
        # answer, nothing applied again.
        retry = session.txn_seq(seq, transfer(30))
        assert retry.replayed is True
        assert retry.succeeded is True
        assert [r.value for r in retry.results] == [70, 30]
        assert retry.revision == first.revision
        assert (client.get("acct/a"), client.get("acct/b")) == (b"70", b"30")
        assert client.get_kv("acct/a").version == a.version
        # The next new number applies once more.
        assert [r.value for r in session.txn(transfer(30)).results] == [40, 60]
    # One-shot: a re-run under the same idempotency key is replayed.
    once = client.txn(transfer(10), idempotency_key="transfer-1")
    again = client.txn(transfer(10), idempotency_key="transfer-1")
    assert (once.replayed, again.replayed) == (False, True)
    assert again.revision == once.revision
    assert [r.value for r in again.results] == [30, 70]
    assert (client.get("acct/a"), client.get("acct/b")) == (b"30", b"70")


def test_a_refused_transaction_changes_nothing(client):
    client.put("r/n", "5")
    client.put("r/text", "x")
    before = client.scan_kv("r/")
    # A compare that fails runs the failure branch only.
    failed = client.txn(
        Txn()
        .compare(Compare.value("r/n", "==", "6"))
        .on_success(TxnOp.put("r/n", "7"), TxnOp.put("r/new", "1"))
        .on_failure(TxnOp.get("r/n"), TxnOp.scan("r/"))
    )
    assert failed.succeeded is False
    got, scanned = failed.results
    assert got.value == b"5" and got.meta == before[0].meta
    assert [kv.key for kv in scanned.value] == [b"r/n", b"r/text"]
    # One refused operation undoes the whole transaction: the put before it
    # did not happen either.
    with pytest.raises(Rejected) as refused:
        client.txn(Txn().on_success(TxnOp.put("r/new", "1"), TxnOp.incr("r/text", 1)))
    assert refused.value.kind == "not_an_integer" and refused.value.not_applied
    # A key written twice is refused before running.
    with pytest.raises(TxnConflict) as conflict:
        client.txn(Txn().on_success(TxnOp.put("r/n", "1"), TxnOp.put("r/n", "2")))
    assert conflict.value.key == "r/n" and conflict.value.not_applied
    with pytest.raises(TxnConflict):
        client.txn(Txn().on_success(TxnOp.delete_prefix("r/"), TxnOp.put("r/x", "1")))
    # On a session too.
    with client.open_session() as session:
        with pytest.raises(Rejected):
            session.txn(Txn().on_success(TxnOp.append("r/new", "1"), TxnOp.incr("r/text", 1)))
    assert client.scan_kv("r/") == before
    assert client.get("r/new") is None


def test_compares_on_versions_and_revisions_and_the_operations(client):
    created = client.put("c/k", "a").applied_index
    modified = client.put("c/k", "b").applied_index
    client.put("c/j", "x")
    result = client.txn(
        Txn()
        .compare(
            Compare.version("c/k", "==", 2),
            Compare.create_revision("c/k", "==", created),
            Compare.mod_revision("c/k", ">", created),
            Compare.mod_revision("c/k", "<", modified + 1),
            Compare.absent("c/none"),
            Compare.exists("c/", prefix=True),
            Compare.value("c/k", "!=", "a"),
        )
        .on_success(
            TxnOp.append("c/k", "c"),
            TxnOp.cas("c/j", "x", "y"),
            TxnOp.put("c/p/1", "x"),
            TxnOp.incr("c/n", 3),
            TxnOp.get("c/k"),
        )
    )
    assert result.succeeded
    append, cas, put, incr, get = result.results
    assert append.value == 2
    assert cas.swapped is True
    assert put.value is None
    assert incr.value == 3
    assert get.value == b"bc" and get.meta.version == 3 and get.meta.mod_revision == result.revision
    deleted = client.txn(Txn().on_success(TxnOp.delete_prefix("c/p/"), TxnOp.delete("c/n")))
    assert deleted.results[0].value == 1 and deleted.results[1].value == b"3"
    assert client.scan("c/") == [(b"c/j", b"y"), (b"c/k", b"bc")]


def test_get_with_revisions_and_at_a_past_revision(client):
    first = client.put("h/k", "v1").applied_index
    second = client.put("h/k", "v2").applied_index
    kv = client.get_kv("h/k")
    assert kv == KeyValue(b"h/k", b"v2", kv.meta)
    assert (kv.create_revision, kv.mod_revision, kv.version) == (first, second, 2)
    # Existing callers still get bytes.
    assert client.get("h/k") == b"v2"
    assert client.get("h/k", revision=first) == b"v1"
    past = client.get_kv("h/k", revision=first)
    assert (past.value, past.create_revision, past.mod_revision, past.version) == (b"v1", first, first, 1)
    assert client.get_kv("h/k", revision=first - 1) is None
    assert client.get_kv("h/missing") is None
    deleted = client.delete("h/k").applied_index
    assert client.get("h/k") is None
    assert client.get("h/k", revision=deleted - 1) == b"v2"
    assert client.scan("h/", revision=first) == [(b"h/k", b"v1")]
    assert [kv.version for kv in client.scan_kv("h/", revision=second)] == [2]
    with pytest.raises(FutureRevision) as future:
        client.get("h/k", revision=deleted + 1_000_000)
    assert future.value.not_applied and future.value.revision == deleted + 1_000_000


def test_compact_then_a_read_below_is_compacted_and_a_too_large_txn_is_refused(make_cluster):
    cluster = make_cluster(1, ["--txn-ops-max", "4", "--scan-bytes-max", "1024"])
    with Client(cluster.endpoints, timeout=10) as client:
        first = client.put("k", "v1").applied_index
        second = client.put("k", "v2").applied_index
        client.put("k", "v3")
        assert client.get("k", revision=first) == b"v1"
        done = client.compact(second)
        assert done.value == second
        with pytest.raises(Compacted) as compacted:
            client.get("k", revision=first)
        assert isinstance(compacted.value, Rejected) and compacted.value.not_applied
        assert (compacted.value.revision, compacted.value.compacted) == (first, second)
        with pytest.raises(Compacted):
            client.scan("", revision=first)
        # At the compacted revision and later, the past is still there.
        assert client.get("k", revision=second) == b"v2"
        assert client.get("k") == b"v3"
        # A watch from a compacted revision fails, typed the same.
        with client.watch("k", start_revision=first) as watcher:
            with pytest.raises(Compacted) as watch_compacted:
                watcher.next(timeout=10)
        assert watch_compacted.value.compacted == second
        with pytest.raises(FutureRevision):
            client.compact(second + 1_000_000)
        # More operations than --txn-ops-max: nothing applied.
        with pytest.raises(TxnTooLarge) as large:
            client.txn(Txn().on_success(*[TxnOp.put(f"big/{i}", "x") for i in range(5)]))
        assert (large.value.ops, large.value.max) == (5, 4)
        assert client.scan("big/") == []
        # Reads answering more than twice --scan-bytes-max: refused whole,
        # the transaction's write undone.
        client.put("wide", "x" * 900)
        with pytest.raises(ReplyTooLarge) as wide:
            client.txn(Txn().on_success(TxnOp.put("wrote", "1"), *[TxnOp.get("wide")] * 3))
        assert isinstance(wide.value, Rejected) and wide.value.max == 2048
        assert wide.value.bytes > 2048
        assert client.get("wrote") is None

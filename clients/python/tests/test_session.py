"""A session's keep-alive thread, against a real node."""

from __future__ import annotations

import pytest

from oncekv import Client, SessionExpired

from conftest import eventually


def test_the_keep_alive_thread_holds_a_session_past_its_ttl(make_cluster):
    cluster = make_cluster(1)
    node = cluster.node(1)
    with Client(cluster.endpoints, timeout=10) as client:
        kept = client.open_session(ttl_ms=300)
        idle = client.open_session(ttl_ms=300, keep_alive=False)
        start = cluster.status(node).cluster_time_ms
        eventually(lambda: cluster.status(node).sessions == 1, 20, "the idle session to expire")
        # Five TTLs of cluster time later, the kept session still runs.
        eventually(lambda: cluster.status(node).cluster_time_ms > start + 1500, 20, "5 TTLs to pass")
        assert cluster.status(node).sessions == 1
        assert kept.incr("k").value == 1
        with pytest.raises(SessionExpired) as expired:
            idle.incr("k")
        assert expired.value.not_applied and idle.expired
        with pytest.raises(SessionExpired):
            idle.incr("k")  # known expired: refused without sending
        kept.close()
        assert cluster.status(node).sessions == 0

//! Prometheus metrics: the `/metrics` endpoint (off unless an address is
//! given) and the gauges sampled from the node's status. Counters and
//! latency histograms are recorded where the work happens: requests by
//! operation and outcome (`oncekv_requests_total`,
//! `oncekv_request_duration_seconds`), log fsyncs, applies and snapshots;
//! leader changes and each follower's replication lag are sampled here.
//! `deploy/grafana-dashboard.json` charts them.

use crate::node::Node;
use std::net::SocketAddr;
use std::time::Duration;

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {address}: {reason}")]
pub struct MetricsError {
    address: SocketAddr,
    reason: String,
}

/// Serves `/metrics` on `address` and samples the node's gauges every
/// `interval`.
pub fn serve(address: SocketAddr, node: Node, interval: Duration) -> Result<(), MetricsError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(address)
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_string()),
            LATENCY_BUCKETS,
        )
        .map_err(|error| MetricsError {
            address,
            reason: error.to_string(),
        })?
        .install()
        .map_err(|error| MetricsError {
            address,
            reason: error.to_string(),
        })?;
    describe();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        let mut leader = None;
        loop {
            ticker.tick().await;
            sample(&node, &mut leader);
        }
    });
    Ok(())
}

/// Latency buckets, in seconds: 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

fn describe() {
    metrics::describe_histogram!(
        "oncekv_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time from proposing a request to its outcome, by operation and outcome"
    );
    metrics::describe_histogram!(
        "oncekv_log_fsync_duration_seconds",
        metrics::Unit::Seconds,
        "Time of each fdatasync of the log (one per group-committed batch)"
    );
    metrics::describe_histogram!(
        "oncekv_apply_duration_seconds",
        metrics::Unit::Seconds,
        "Time to apply one log entry to the state machine"
    );
    metrics::describe_histogram!(
        "oncekv_snapshot_duration_seconds",
        metrics::Unit::Seconds,
        "Time to build a snapshot"
    );
    metrics::describe_histogram!(
        "oncekv_snapshot_copy_duration_seconds",
        metrics::Unit::Seconds,
        "Time a snapshot holds the state lock to copy the state (applies wait for it)"
    );
    metrics::describe_counter!(
        "oncekv_raft_leader_changes_total",
        "Times the leader this node knows changed"
    );
    metrics::describe_gauge!(
        "oncekv_raft_follower_lag_entries",
        "On the leader: log entries each follower is behind"
    );
    // Counters show from the start, at zero, so alerts and dashboards see
    // them before the first event.
    metrics::counter!("oncekv_raft_leader_changes_total").increment(0);
    metrics::counter!("oncekv_retry_rendezvous_total").increment(0);
    metrics::describe_counter!(
        "oncekv_requests_total",
        "Requests proposed by this node, by operation and outcome"
    );
    metrics::describe_counter!(
        "oncekv_retry_rendezvous_total",
        "Retries that joined the identical request already in flight"
    );
    metrics::describe_counter!(
        "oncekv_peer_appends_received_total",
        "AppendEntries admitted from the leader, by call: `stream` (pipelined) or `unary`"
    );
    metrics::describe_gauge!("oncekv_watchers", "Watchers this node serves");
    metrics::describe_counter!(
        "oncekv_watches_canceled_total",
        "Watches the node ended, by reason: `unread` (a bound on unsent events), `behind`, `reset`, `compacted`, `denied` (the right to read lost)"
    );
    metrics::describe_gauge!("oncekv_sessions", "Live sessions");
    metrics::describe_gauge!("oncekv_completion_records", "Completion records held");
    metrics::describe_gauge!("oncekv_idempotency_keys", "Idempotency keys kept");
    metrics::describe_gauge!("oncekv_raft_term", "Current Raft term");
    metrics::describe_gauge!(
        "oncekv_raft_leader",
        "Id of the leader this node knows, 0 if none"
    );
    metrics::describe_gauge!("oncekv_raft_is_leader", "1 if this node leads");
    metrics::describe_gauge!("oncekv_raft_commit_index", "Last committed log index");
    metrics::describe_gauge!("oncekv_raft_applied_index", "Last applied log index");
}

fn sample(node: &Node, leader: &mut Option<Option<u64>>) {
    let status = node.status();
    let raft = &status.raft;
    let now = raft.leadership.leader_id;
    if leader.is_some_and(|before| before != now) {
        metrics::counter!("oncekv_raft_leader_changes_total").increment(1);
    }
    *leader = Some(now);
    let last = raft.last_log_index.unwrap_or(0);
    for (follower, matched) in &raft.replication {
        let lag = last.saturating_sub(matched.unwrap_or(0));
        metrics::gauge!("oncekv_raft_follower_lag_entries", "follower" => follower.to_string())
            .set(lag as f64);
    }
    metrics::gauge!("oncekv_sessions").set(status.state.sessions as f64);
    metrics::gauge!("oncekv_completion_records").set(status.state.completion_records as f64);
    metrics::gauge!("oncekv_idempotency_keys").set(status.state.idempotency_keys as f64);
    metrics::gauge!("oncekv_leases").set(status.state.leases as f64);
    metrics::gauge!("oncekv_raft_term").set(raft.leadership.term as f64);
    metrics::gauge!("oncekv_raft_leader").set(raft.leadership.leader_id.unwrap_or(0) as f64);
    metrics::gauge!("oncekv_raft_is_leader").set(f64::from(u8::from(raft.leadership.is_leader)));
    metrics::gauge!("oncekv_raft_commit_index").set(raft.commit_index.unwrap_or(0) as f64);
    metrics::gauge!("oncekv_raft_applied_index").set(raft.applied_index.unwrap_or(0) as f64);
}

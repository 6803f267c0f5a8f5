//! Prometheus metrics: the `/metrics` endpoint (off unless an address is
//! given) and the gauges sampled from the node's status. Request counters
//! by operation and outcome are recorded where requests are handled
//! (`oncekv_requests_total{operation, outcome}`).

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
        .install()
        .map_err(|error| MetricsError {
            address,
            reason: error.to_string(),
        })?;
    describe();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            sample(&node);
        }
    });
    Ok(())
}

fn describe() {
    metrics::describe_counter!(
        "oncekv_requests_total",
        "Requests proposed by this node, by operation and outcome"
    );
    metrics::describe_counter!(
        "oncekv_retry_rendezvous_total",
        "Retries that joined the identical request already in flight"
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

fn sample(node: &Node) {
    let status = node.status();
    let raft = &status.raft;
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

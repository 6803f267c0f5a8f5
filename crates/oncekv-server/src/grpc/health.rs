//! The standard gRPC health service (`grpc.health.v1.Health`) and server
//! reflection on the client port, for `grpcurl`, load balancers and
//! Kubernetes-style probes. The node is SERVING (both the overall service
//! `""` and `oncekv.v1.Kv`) while it leads and hears from a quorum of
//! voters, or hears from its leader, within an election timeout, and has
//! applied every entry it knows to be committed; NOT_SERVING otherwise (no
//! quorum, a leader cut off from it, an election, a follower catching up).
//! Health answers need no credentials: they say nothing about the data.

use crate::node::Node;
use oncekv_proto::v1::kv_server::KvServer;
use std::time::Duration;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};

/// How often the serving status is brought up to date.
const REFRESH: Duration = Duration::from_millis(250);

/// Whether `node` should be called healthy now, and why not.
pub fn serving(node: &Node) -> Result<(), String> {
    let status = node.status().raft;
    if status.leadership.leader_id.is_none() {
        return Err("no leader known".to_string());
    }
    if let Some((heard, voters)) = status.voters_heard
        && heard <= voters / 2
    {
        return Err(format!(
            "leader without a quorum: {heard} of {voters} voters heard from"
        ));
    }
    let committed = status.commit_index.unwrap_or(0);
    let applied = status.applied_index.unwrap_or(0);
    if applied < committed {
        return Err(format!(
            "applied {applied} of {committed} committed entries"
        ));
    }
    Ok(())
}

/// The health service of `node`, kept up to date until `stopped`
/// completes.
pub fn health_service(
    node: Node,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let refresh = async {
            let mut last = None;
            loop {
                let now = match serving(&node) {
                    Ok(()) => ServingStatus::Serving,
                    Err(_) => ServingStatus::NotServing,
                };
                if last != Some(now) {
                    reporter.set_service_status("", now).await;
                    let kv = <KvServer<crate::grpc::KvService> as NamedService>::NAME;
                    reporter.set_service_status(kv, now).await;
                    last = Some(now);
                }
                tokio::time::sleep(REFRESH).await;
            }
        };
        tokio::select! {
            () = refresh => {}
            () = stopped => {}
        }
    });
    service
}

/// gRPC server reflection (v1) of the `oncekv.v1` services and etcd's.
pub fn reflection_service() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::Error,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(oncekv_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(oncekv_proto::ETCD_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
}

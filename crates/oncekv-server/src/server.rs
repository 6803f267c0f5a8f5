//! [`serve`]: assembles a node from its configuration (data directory,
//! durable log, state-machine store, consensus, client and peer services,
//! metrics) and runs it until the shutdown signal. Listeners are injected,
//! so tests and simulations choose the transport.

use crate::grpc::KvService;
use crate::identity::{self, IdentityError};
use crate::node::{Node, NodeOptions};
use crate::raft::consensus::{Consensus, ConsensusOptions, StartError};
use crate::raft::network::{PEER_MESSAGE_BYTES_MAX, PeerConnector, PeerNetwork};
use crate::raft::segment_log::SegmentLog;
use crate::raft::state_machine_store::StateMachineStore;
use crate::raft::type_config::{NodeId, NodeInfo};
use oncekv_proto::v1::kv_server::KvServer;
use oncekv_proto::v1::raft_peer_server::RaftPeerServer;
use oncekv_state::Limits;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

/// Everything a node needs to run.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This node's id.
    pub id: NodeId,
    /// Where its log, state and identity live.
    pub data_dir: PathBuf,
    /// This node's addresses as others should use them.
    pub advertise: NodeInfo,
    /// The initial members (this node included), used once to form the
    /// cluster; `None` for a node that joins a running cluster through
    /// `member add`.
    pub initial_cluster: Option<BTreeMap<NodeId, NodeInfo>>,
    /// Bounds of the state machine (the same on every node).
    pub limits: Limits,
    /// Consensus timing and snapshots.
    pub consensus: ConsensusOptions,
    /// Request handling.
    pub node: NodeOptions,
    /// Largest client message accepted, in bytes.
    pub client_message_bytes_max: usize,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// The source address of outgoing peer connections (`None`: chosen by
    /// the OS), for hosts with several addresses.
    pub peer_source_ip: Option<IpAddr>,
    /// How to reach peers; `None` is TCP (a simulation injects its network).
    pub peer_connector: Option<Arc<dyn PeerConnector>>,
    /// Whether disk writes (log appends, snapshots) run on the calling task
    /// instead of a writer thread: for deterministic simulation only, where
    /// every step must run inside the simulated runtime.
    pub inline_disk_io: bool,
    /// Whether retries are answered from completion records. Always on,
    /// except in the checkers' negative control, which proves that a store
    /// without dedup is caught.
    pub dedup: bool,
}

/// Largest client message a node accepts by default, in bytes.
pub const CLIENT_MESSAGE_BYTES_DEFAULT: usize = 4 * 1024 * 1024;

impl ServerConfig {
    /// A one-node cluster (node 1) with default limits and timing, its data
    /// in `data_dir`, serving clients at `client_address` and peers at
    /// `peer_address` (`host:port`): what `oncekv serve` runs without
    /// flags, for embedding a node in a program or a test.
    pub fn single_node(
        data_dir: impl Into<PathBuf>,
        client_address: &str,
        peer_address: &str,
    ) -> ServerConfig {
        let advertise = NodeInfo {
            peer_address: peer_address.to_string(),
            client_address: client_address.to_string(),
        };
        ServerConfig {
            id: 1,
            data_dir: data_dir.into(),
            advertise: advertise.clone(),
            initial_cluster: Some(BTreeMap::from([(1, advertise)])),
            limits: Limits::default(),
            consensus: ConsensusOptions::default(),
            node: NodeOptions::default(),
            client_message_bytes_max: CLIENT_MESSAGE_BYTES_DEFAULT,
            metrics: None,
            peer_source_ip: None,
            peer_connector: None,
            inline_disk_io: false,
            dedup: true,
        }
    }
}

/// Why a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The data directory is unusable or belongs elsewhere.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The log or state could not be opened.
    #[error("opening storage in {path}: {source}")]
    Storage {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Consensus could not start.
    #[error(transparent)]
    Consensus(#[from] StartError),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] crate::telemetry::MetricsError),
    /// Consensus stopped on a fatal error (a failed disk write or sync):
    /// the node stops rather than serve without a working log.
    #[error("consensus failed: {0}")]
    Fatal(String),
    /// A log or snapshot write found the disk full: the node stopped
    /// without acknowledging anything that was not synced.
    #[error(
        "the disk holding the data directory is full ({0}): the node stopped without acknowledging any unsynced write; free space and restart it"
    )]
    DiskFull(String),
    /// A gRPC server failed.
    #[error("{service} service failed: {source}")]
    Transport {
        /// Which service.
        service: &'static str,
        /// The cause.
        source: tonic::transport::Error,
    },
}

/// Runs a node on the given client and peer connection streams until
/// `shutdown` completes.
pub async fn serve<CI, PI, IO, E>(
    config: ServerConfig,
    client_incoming: CI,
    peer_incoming: PI,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError>
where
    CI: Stream<Item = Result<IO, E>> + Send + 'static,
    PI: Stream<Item = Result<IO, E>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let cluster = match &config.initial_cluster {
        Some(members) => identity::describe_cluster(members),
        None => "joined".to_string(),
    };
    identity::check_or_record(&config.data_dir, config.id, &cluster)?;
    let storage = |path: PathBuf| {
        move |source| ServeError::Storage {
            path: path.clone(),
            source,
        }
    };
    let log_dir = config.data_dir.join("log");
    let log = if config.inline_disk_io {
        SegmentLog::open_inline(&log_dir)
    } else {
        SegmentLog::open(&log_dir)
    }
    .map_err(storage(log_dir))?;
    let state_dir = config.data_dir.join("state");
    let mut state =
        StateMachineStore::open(&state_dir, config.limits.clone()).map_err(storage(state_dir))?;
    if config.inline_disk_io {
        state = state.with_inline_io();
    }
    if !config.dedup {
        tracing::warn!("deduplication is OFF: retries apply again (negative control only)");
        state = state.without_dedup();
    }
    let consensus = Consensus::start(
        config.id,
        &config.consensus,
        log,
        state,
        PeerNetwork {
            source_ip: config.peer_source_ip,
            connector: config.peer_connector.clone(),
        },
        config.initial_cluster.clone(),
    )
    .await?;
    let node = Node::new(consensus.clone(), config.node.clone());
    if let Some(address) = config.metrics {
        crate::telemetry::serve(address, node.clone(), Duration::from_secs(1))?;
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signal = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let peer = tonic::transport::Server::builder()
        .add_service(
            RaftPeerServer::new(consensus.peer_service())
                .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX),
        )
        .serve_with_incoming_shutdown(peer_incoming, signal(stopped.clone()));
    let client = tonic::transport::Server::builder()
        .add_service(
            KvServer::new(KvService::new(node.clone()))
                .max_decoding_message_size(config.client_message_bytes_max)
                .max_encoding_message_size(
                    config.client_message_bytes_max.max(PEER_MESSAGE_BYTES_MAX),
                ),
        )
        .serve_with_incoming_shutdown(client_incoming, signal(stopped));
    tracing::info!(id = config.id, client = %config.advertise.client_address, peer = %config.advertise.peer_address, "node serving");
    let peer = tokio::spawn(peer);
    let client = tokio::spawn(client);
    let fatal = tokio::select! {
        () = shutdown => None,
        cause = consensus.stopped_fatally() => Some(cause),
    };
    match &fatal {
        None => tracing::info!(id = config.id, "shutting down"),
        Some(cause) => tracing::error!(id = config.id, %cause, "consensus failed: stopping"),
    }
    let _ = stop.send(true);
    let peer_result = peer.await;
    let client_result = client.await;
    consensus.shutdown().await;
    if let Some(cause) = fatal {
        // openraft carries the storage error as text; an OS error keeps
        // its code there.
        if cause.contains("(os error 28)") {
            return Err(ServeError::DiskFull(cause));
        }
        return Err(ServeError::Fatal(cause));
    }
    for (service, result) in [("peer", peer_result), ("client", client_result)] {
        if let Ok(Err(source)) = result {
            return Err(ServeError::Transport { service, source });
        }
    }
    Ok(())
}

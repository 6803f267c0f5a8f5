//! [`serve`]: assembles a node from its configuration and runs it until
//! the shutdown signal, in three steps: its storage (data directory,
//! durable log, state-machine store, snapshot spool: `open_storage`),
//! consensus and the node over it (`start_consensus`), and its listeners
//! (client and peer services, etcd's own port, metrics: `Listeners`).
//! Listeners are injected, so tests and simulations choose the transport.
//!
//! Both gRPC servers run under [`ListenerLimits`] ([`ServerLimits`]): open
//! connections per listener, concurrent HTTP/2 streams per connection,
//! requests in flight (an excess one shed at once, RESOURCE_EXHAUSTED with
//! `oncekv-overloaded: in-flight`), a per-call timeout and HTTP/2
//! keep-alives; incoming peer snapshots are capped in size and spooled to
//! `<data dir>/snapshot-incoming/`. A request message that does not decode
//! is INVALID_ARGUMENT. The mechanisms are in [`crate::transport`] and
//! [`crate::raft::peer_service`]. With a peer token
//! ([`ServerConfig::peer_token`]), a peer call without it is answered
//! UNAUTHENTICATED from its headers alone ([`crate::raft::peer_token`]).
//! The peer port also serves etcd's services (not Watch) for the calls
//! followers forward to the leader, only to a member forwarding a call as
//! itself ([`crate::grpc::etcd::MemberCheck`]), under the client port's
//! message limit and in-flight cap (a cap of their own, beside Raft's
//! messages' peer cap: [`crate::transport::InFlightShare`]), with as many
//! streams per connection as the larger of the two ports allows.
//! [`ServerLimits`] also bounds the node's watchers and the events they
//! hold unsent; the hub holds them to those bounds, shared among users as
//! the replicated budgets are ([`WatchBounds`]).

use crate::grpc::KvService;
use crate::grpc::etcd::MemberCheck;
use crate::identity::{self, IdentityError};
use crate::node::{Node, NodeOptions};
use crate::raft::consensus::{Consensus, ConsensusOptions, StartError};
use crate::raft::network::{PEER_MESSAGE_BYTES_MAX, PeerConnector, PeerNetwork};
use crate::raft::peer_service::SnapshotSpool;
use crate::raft::peer_token::{PeerToken, PeerTokenCheck};
use crate::raft::segment_log::SegmentLog;
use crate::raft::state_machine_store::StateMachineStore;
use crate::raft::type_config::{NodeId, NodeInfo};
use crate::tls::{PeerTls, ServerTls};
use crate::transport::{
    InFlightShare, answer_plaintext, answer_refused, limit_connections, limit_requests, sort_if_tls,
};
use crate::watch::{WATCH_BYTES_MAX_DEFAULT, WATCHERS_MAX_DEFAULT, WatchBounds};
use oncekv_proto::v1::kv_server::KvServer;
use oncekv_proto::v1::raft_peer_server::RaftPeerServer;
use oncekv_state::{Limits, UserQuotas};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::service::interceptor::InterceptedService;
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
    /// Bounds of the client and peer servers and of incoming snapshots
    /// (default: [`ServerLimits::DEFAULT`]).
    pub server_limits: ServerLimits,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// A TCP listener, bound by the caller, on which etcd's v3 API is
    /// served alone (with the client port's TLS and limits); etcd's API is
    /// on the client port too.
    pub etcd_listener: Option<Arc<std::net::TcpListener>>,
    /// The etcd version etcd's API reports (clients gate features on it;
    /// default [`crate::grpc::etcd::ETCD_VERSION`]).
    pub etcd_version: String,
    /// The source address of outgoing peer connections (`None`: chosen by
    /// the OS), for hosts with several addresses.
    pub peer_source_ip: Option<IpAddr>,
    /// How to reach peers; `None` is TCP (a simulation injects its network).
    pub peer_connector: Option<Arc<dyn PeerConnector>>,
    /// TLS on the client port (and whether clients must present a
    /// certificate); `None`: plaintext.
    pub client_tls: Option<ServerTls>,
    /// Mutual TLS on the peer port and on outgoing peer connections, with
    /// every peer message checked against the caller's certificate; `None`:
    /// plaintext.
    pub peer_tls: Option<PeerTls>,
    /// The cluster's shared peer secret: sent with every peer call, and
    /// required of every call to the peer port (checked on its headers,
    /// before its body is read; UNAUTHENTICATED otherwise); `None`: none.
    /// With neither this nor `peer_tls`, peers are not authenticated
    /// (`oncekv serve` allows that for a node of several only with
    /// `--insecure-peers`).
    pub peer_token: Option<PeerToken>,
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

/// What one gRPC server (the client port or the peer port) takes on at
/// once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Most connections open on the listener; one more is accepted and
    /// closed at once (logged, `oncekv_connections_refused_total`).
    pub connections_max: usize,
    /// Most concurrent HTTP/2 streams (calls) on one connection, announced
    /// to the other side (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub streams_per_connection_max: u32,
    /// Most requests being handled at once over all connections; one more
    /// is refused at once, unhandled (RESOURCE_EXHAUSTED with
    /// `oncekv-overloaded: in-flight`), never queued.
    pub in_flight_max: usize,
    /// Longest a call may run; then it is cancelled (CANCELLED, "Timeout
    /// expired"; a mutation cancelled so may still apply). Not etcd's
    /// Lock and Campaign ([`crate::transport::UNTIMED_PATHS`]).
    pub call_timeout: Duration,
    /// How often an HTTP/2 ping checks each connection.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
}

impl ListenerLimits {
    /// The client port's defaults: 1024 connections, 256 streams per
    /// connection, 1024 requests in flight, 30 s per call, a ping every
    /// 10 s answered within 20 s.
    pub const CLIENT_DEFAULT: ListenerLimits = ListenerLimits {
        connections_max: 1024,
        streams_per_connection_max: 256,
        in_flight_max: 1024,
        call_timeout: Duration::from_secs(30),
        keepalive_interval: Duration::from_secs(10),
        keepalive_timeout: Duration::from_secs(20),
    };

    /// The peer port's defaults: 64 connections, 64 streams per
    /// connection, 256 requests in flight, 120 s per call (a large
    /// snapshot), a ping every 5 s answered within 10 s.
    pub const PEER_DEFAULT: ListenerLimits = ListenerLimits {
        connections_max: 64,
        streams_per_connection_max: 64,
        in_flight_max: 256,
        call_timeout: Duration::from_secs(120),
        keepalive_interval: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(10),
    };

    /// Checks that every bound admits something and fits its counter.
    pub fn check(&self, listener: &'static str) -> Result<(), LimitsError> {
        let counts = [
            ("connections", self.connections_max),
            ("in-flight requests", self.in_flight_max),
            (
                "streams per connection",
                usize::try_from(self.streams_per_connection_max).unwrap_or(usize::MAX),
            ),
        ];
        for (what, value) in counts {
            if value == 0 || value > tokio::sync::Semaphore::MAX_PERMITS {
                return Err(LimitsError::Count {
                    listener,
                    what,
                    value,
                    max: tokio::sync::Semaphore::MAX_PERMITS,
                });
            }
        }
        let durations = [
            ("call timeout", self.call_timeout),
            ("keep-alive interval", self.keepalive_interval),
            ("keep-alive timeout", self.keepalive_timeout),
        ];
        for (what, value) in durations {
            if value.is_zero() {
                return Err(LimitsError::ZeroDuration { listener, what });
            }
        }
        Ok(())
    }
}

/// Largest incoming snapshot accepted by default, in bytes (1 GiB).
pub const SNAPSHOT_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;

/// The bounds of a node's servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// The client port ([`ListenerLimits::CLIENT_DEFAULT`]).
    pub client: ListenerLimits,
    /// The peer port ([`ListenerLimits::PEER_DEFAULT`]).
    pub peer: ListenerLimits,
    /// Largest snapshot a peer may send, in bytes (the size it announces;
    /// more is refused at once). Receiving spools it to disk; installing
    /// holds it in memory once. Default [`SNAPSHOT_BYTES_MAX_DEFAULT`].
    pub snapshot_bytes_max: u64,
    /// Most watchers the node serves at once (default
    /// [`WATCHERS_MAX_DEFAULT`]); a user holds at most its share of them,
    /// and the users without the admin role together all but the admin
    /// reserve ([`WatchBounds`], with [`Limits::quotas`]).
    pub watchers_max: usize,
    /// Most bytes of events the node's watch streams hold unsent together
    /// (default [`WATCH_BYTES_MAX_DEFAULT`]), shared as `watchers_max` is.
    pub watch_bytes_max: usize,
}

impl ServerLimits {
    /// The defaults of both ports, of snapshots and of watches.
    pub const DEFAULT: ServerLimits = ServerLimits {
        client: ListenerLimits::CLIENT_DEFAULT,
        peer: ListenerLimits::PEER_DEFAULT,
        snapshot_bytes_max: SNAPSHOT_BYTES_MAX_DEFAULT,
        watchers_max: WATCHERS_MAX_DEFAULT,
        watch_bytes_max: WATCH_BYTES_MAX_DEFAULT,
    };

    /// Checks both ports' bounds, and that the watch bounds admit
    /// something.
    pub fn check(&self) -> Result<(), LimitsError> {
        self.client.check("client")?;
        self.peer.check("peer")?;
        let watches = [
            ("watchers", self.watchers_max),
            ("unsent watch bytes", self.watch_bytes_max),
        ];
        for (what, value) in watches {
            if value == 0 {
                return Err(LimitsError::NoWatch { what });
            }
        }
        Ok(())
    }

    /// The node's watch bounds, shared among users by `quotas`.
    pub fn watch_bounds(&self, quotas: UserQuotas) -> WatchBounds {
        WatchBounds {
            watchers_max: self.watchers_max,
            bytes_max: self.watch_bytes_max,
            quotas,
        }
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits::DEFAULT
    }
}

/// A server bound that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// A count that admits nothing, or more than can be counted.
    #[error("{listener} limit on {what} is {value}: it must be between 1 and {max}")]
    Count {
        /// Which server.
        listener: &'static str,
        /// Which bound.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The largest value possible.
        max: usize,
    },
    /// A zero duration.
    #[error("{listener} {what} must be longer than zero")]
    ZeroDuration {
        /// Which server.
        listener: &'static str,
        /// Which bound.
        what: &'static str,
    },
    /// A watch bound of zero: no watch could be served.
    #[error("the node's limit on {what} is 0: it must be at least 1 (no watch could run)")]
    NoWatch {
        /// Which bound.
        what: &'static str,
    },
}

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
            server_limits: ServerLimits::DEFAULT,
            metrics: None,
            etcd_listener: None,
            etcd_version: crate::grpc::etcd::ETCD_VERSION.to_string(),
            peer_source_ip: None,
            peer_connector: None,
            client_tls: None,
            peer_tls: None,
            peer_token: None,
            inline_disk_io: false,
            dedup: true,
        }
    }
}

/// Why a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A server bound cannot work.
    #[error(transparent)]
    Limits(#[from] LimitsError),
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
    /// The etcd listener could not be taken over.
    #[error("the etcd listener: {0}")]
    EtcdListener(std::io::Error),
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
    /// A port's TLS configuration was refused.
    #[error("{service} TLS: {source}")]
    Tls {
        /// Which service.
        service: &'static str,
        /// The cause.
        source: tonic::transport::Error,
    },
    /// The reflection service could not be built from the descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(String),
    /// A gRPC server failed.
    #[error("{service} service failed: {source}")]
    Transport {
        /// Which service.
        service: &'static str,
        /// The cause.
        source: tonic::transport::Error,
    },
}

/// A gRPC server with `limits`' per-connection bounds, call timeout and
/// keep-alives (the connection and in-flight caps are applied around it),
/// over TLS if `tls` is given. tonic runs the TLS handshake on each
/// injected connection (`serve_with_incoming_shutdown`) before HTTP/2.
fn grpc_server(
    limits: &ListenerLimits,
    tls: Option<tonic::transport::ServerTlsConfig>,
    service: &'static str,
) -> Result<tonic::transport::Server, ServeError> {
    let server = tonic::transport::Server::builder();
    let server = match tls {
        Some(tls) => server
            .tls_config(tls)
            .map_err(|source| ServeError::Tls { service, source })?,
        None => server,
    };
    Ok(server
        .max_concurrent_streams(limits.streams_per_connection_max)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout)))
}

/// How long a stopping node lets its open calls end before it drops them.
const CALLS_GRACE: Duration = Duration::from_secs(2);

/// A server's task once it ended, or, past `deadline`, once it is aborted
/// (then counted as ended well: what was cut off is the calls that would
/// not end).
async fn ended_by<T>(
    deadline: tokio::time::Instant,
    mut server: tokio::task::JoinHandle<Result<(), T>>,
) -> Result<Result<(), T>, tokio::task::JoinError> {
    match tokio::time::timeout_at(deadline, &mut server).await {
        Ok(result) => result,
        Err(_) => {
            server.abort();
            let _ = server.await;
            tracing::info!("calls still open after the grace period were dropped");
            Ok(Ok(()))
        }
    }
}

/// A server's task (a gRPC server, or the answering of the connections
/// one refuses).
type ServerTask = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

/// Runs a node on the given client and peer connection streams until
/// `shutdown` completes. What could refuse to start is checked before
/// anything starts (the limits, etcd's listener, TLS); then the node opens
/// its storage (`open_storage`), starts consensus (`start_consensus`) and
/// its listeners (`Listeners::start`). Stopping, it hands leadership over
/// if it leads, gives open calls two seconds to end and drops the rest
/// (`Listeners::stop`), then stops consensus.
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
    config.server_limits.check()?;
    let etcd_listener = match &config.etcd_listener {
        Some(listener) => Some(
            listener
                .try_clone()
                .and_then(|listener| {
                    listener.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(listener)
                })
                .map_err(ServeError::EtcdListener)?,
        ),
        None => None,
    };
    // TLS is checked before anything starts, so a refusal stops nothing
    // half-way.
    let tls_configs = [
        (
            "client",
            config.client_tls.as_ref().map(ServerTls::server_config),
        ),
        ("peer", config.peer_tls.as_ref().map(PeerTls::server_config)),
    ];
    for (service, tls) in tls_configs {
        if let Some(tls) = tls {
            tonic::transport::Server::builder()
                .tls_config(tls)
                .map_err(|source| ServeError::Tls { service, source })?;
        }
    }
    let cluster = match &config.initial_cluster {
        Some(members) => identity::describe_cluster(members),
        None => "joined".to_string(),
    };
    let storage = open_storage(&config, &cluster)?;
    let failures = [storage.log.failure(), storage.state.failure()];
    let (consensus, node) = start_consensus(&config, storage.log, storage.state).await?;
    let incoming = Incoming {
        client: client_incoming,
        peer: peer_incoming,
        etcd: etcd_listener,
    };
    let listeners = Listeners::start(
        &config,
        &cluster,
        &consensus,
        &node,
        storage.spool,
        incoming,
    )?;
    let fatal = tokio::select! {
        () = shutdown => None,
        cause = consensus.stopped_fatally() => Some(cause),
    };
    match &fatal {
        None => tracing::info!(id = config.id, "shutting down"),
        Some(cause) => tracing::error!(id = config.id, %cause, "consensus failed: stopping"),
    }
    // A leader asked to stop hands leadership over first (its servers
    // still up, to carry the transfer): the cluster then waits for no
    // election timeout, as in a rolling restart.
    if fatal.is_none() && consensus.leadership().is_leader {
        let to = node.hand_over_leadership(config.id).await;
        tracing::info!(
            id = config.id,
            ?to,
            "leadership handed over before stopping"
        );
    }
    // Open calls get a grace period to end; the long-lived ones (a
    // leader's append stream, watches) never end on their own, so they
    // are then dropped. A node whose consensus failed drops them at once:
    // it stops as soon as it can, to be started again.
    let grace = match fatal {
        None => CALLS_GRACE,
        Some(_) => Duration::ZERO,
    };
    let results = listeners.stop(grace).await;
    consensus.shutdown().await;
    if let Some(cause) = fatal {
        let full = failures
            .iter()
            .any(|failure| failure.kind() == Some(std::io::ErrorKind::StorageFull));
        if full {
            return Err(ServeError::DiskFull(cause));
        }
        return Err(ServeError::Fatal(cause));
    }
    for (service, result) in results {
        if let Ok(Err(source)) = result {
            return Err(ServeError::Transport { service, source });
        }
    }
    Ok(())
}

/// A node's storage, opened ([`open_storage`]).
struct Storage {
    /// The Raft log, in `<data dir>/log`.
    log: SegmentLog,
    /// The state machine and its snapshots, in `<data dir>/state`.
    state: StateMachineStore,
    /// Where snapshots sent by peers are spooled while they arrive, in
    /// `<data dir>/snapshot-incoming`.
    spool: SnapshotSpool,
}

/// Opens a node's storage: checks that the data directory is this node's,
/// of this cluster (or records it so, the first time), then opens the log,
/// the state-machine store (without deduplication in the checkers'
/// negative control) and the incoming-snapshot spool, with their disk
/// writes on the calling task where `config.inline_disk_io` asks.
fn open_storage(config: &ServerConfig, cluster: &str) -> Result<Storage, ServeError> {
    identity::check_or_record(&config.data_dir, config.id, cluster)?;
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
    log.set_local_node(config.id);
    let state_dir = config.data_dir.join("state");
    let mut state = StateMachineStore::open(&state_dir, config.limits.clone())
        .map_err(storage(state_dir))?
        .with_watch_bounds(config.server_limits.watch_bounds(config.limits.quotas));
    if config.inline_disk_io {
        state = state.with_inline_io();
    }
    if !config.dedup {
        tracing::warn!("deduplication is OFF: retries apply again (negative control only)");
        state = state.without_dedup();
    }
    let spool_dir = config.data_dir.join("snapshot-incoming");
    let spool = SnapshotSpool::open(
        &spool_dir,
        config.server_limits.snapshot_bytes_max,
        config.limits.clone(),
        config.inline_disk_io,
    )
    .map_err(storage(spool_dir))?;
    Ok(Storage { log, state, spool })
}

/// Starts consensus on `log` and `state`, reaching peers as `config`
/// says (its connector, TLS and token), forming the initial cluster if
/// there is one; and the node that serves requests through it.
async fn start_consensus(
    config: &ServerConfig,
    log: SegmentLog,
    state: StateMachineStore,
) -> Result<(Consensus, Node), ServeError> {
    let consensus = Consensus::start(
        config.id,
        &config.consensus,
        log,
        state,
        peer_network(config),
        config.initial_cluster.clone(),
    )
    .await?;
    let node_options = NodeOptions {
        peer_tls: config.peer_tls.clone(),
        ..config.node.clone()
    };
    let node = Node::new(consensus.clone(), node_options);
    Ok((consensus, node))
}

/// How the node reaches its peers, as `config` says (its connector, source
/// address, TLS and token): for Raft, and for the etcd calls a follower
/// forwards to its leader.
fn peer_network(config: &ServerConfig) -> PeerNetwork {
    PeerNetwork {
        source_ip: config.peer_source_ip,
        connector: config.peer_connector.clone(),
        tls: config.peer_tls.clone(),
        token: config.peer_token.clone(),
        append: config.consensus.peer_append,
    }
}

/// The connections a node serves: its client and peer streams, and etcd's
/// own port if it has one.
struct Incoming<CI, PI> {
    client: CI,
    peer: PI,
    etcd: Option<tokio::net::TcpListener>,
}

/// A node's running listeners: the gRPC servers of its peer port, its
/// client port and etcd's own port, the tasks answering the connections
/// they turn away, and the signal that stops them all.
struct Listeners {
    stop: tokio::sync::watch::Sender<bool>,
    peer: ServerTask,
    client: ServerTask,
    etcd_only: Option<ServerTask>,
    refusals: Vec<ServerTask>,
}

impl Listeners {
    /// Starts the metrics endpoint (if `config.metrics` names one) and the
    /// listeners: each port under its connection cap, a plaintext client
    /// of a TLS port told so, the peer API (with the snapshot spool and
    /// the peer token check), and the client API (health, reflection,
    /// `oncekv.v1` and etcd's v3 API) on the client port and, alone, on
    /// etcd's own.
    fn start<CI, PI, IO, E>(
        config: &ServerConfig,
        cluster: &str,
        consensus: &Consensus,
        node: &Node,
        spool: SnapshotSpool,
        incoming: Incoming<CI, PI>,
    ) -> Result<Listeners, ServeError>
    where
        CI: Stream<Item = Result<IO, E>> + Send + 'static,
        PI: Stream<Item = Result<IO, E>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        if let Some(address) = config.metrics {
            crate::telemetry::serve(address, node.clone(), Duration::from_secs(1))?;
            crate::transport::describe_metrics();
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let signal = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let limits = &config.server_limits;
        let (peer_incoming, peer_refused) =
            limit_connections(incoming.peer, limits.peer.connections_max, "peer");
        let (client_incoming, client_refused) =
            limit_connections(incoming.client, limits.client.connections_max, "client");
        let peer_tls = config.peer_tls.as_ref().map(PeerTls::server_config);
        let client_tls = config.client_tls.as_ref().map(ServerTls::server_config);
        // On a TLS port, a plaintext client is told so rather than cut off.
        let (peer_incoming, peer_plaintext) = sort_if_tls(
            peer_incoming,
            peer_tls.is_some(),
            crate::tls::HANDSHAKE_TIMEOUT,
            signal(stopped.clone()),
        );
        let (client_incoming, client_plaintext) = sort_if_tls(
            client_incoming,
            client_tls.is_some(),
            crate::tls::HANDSHAKE_TIMEOUT,
            signal(stopped.clone()),
        );
        let mut refusals = vec![
            tokio::spawn(answer_plaintext(
                peer_plaintext,
                "peer",
                signal(stopped.clone()),
            )),
            tokio::spawn(answer_plaintext(
                client_plaintext,
                "client",
                signal(stopped.clone()),
            )),
            tokio::spawn(answer_refused(
                peer_refused,
                limits.peer.connections_max,
                "peer",
                peer_tls.clone(),
                signal(stopped.clone()),
            )),
            tokio::spawn(answer_refused(
                client_refused,
                limits.client.connections_max,
                "client",
                client_tls.clone(),
                signal(stopped.clone()),
            )),
        ];
        let etcd = crate::grpc::etcd::EtcdApi::new(
            node.clone(),
            cluster,
            client_tls.is_some(),
            config.client_message_bytes_max,
        )
        .reporting_version(&config.etcd_version)
        .forwarding_with(peer_network(config).dialer());
        let peer_service = consensus
            .peer_service()
            .with_snapshot_spool(spool)
            .with_peer_certificates(config.peer_tls.is_some())
            .with_stop_signal(stopped.clone());
        // etcd's services (not Watch) for the calls followers forward
        // here, only from an authenticated member, and within the client
        // port's message limit.
        let members = MemberCheck::new(
            node.clone(),
            config.peer_token.clone(),
            config.peer_tls.is_some(),
        );
        let bytes = config.client_message_bytes_max;
        // Raft's messages and the forwarded calls each have their in-flight
        // cap (the peer port's, and the client port's: what the calls
        // had there), so neither takes the other's slots; and a follower's
        // forwarded calls, which share one connection, as many streams on
        // it as a client's connection has.
        let raft_cap = InFlightShare::cap(limits.peer.in_flight_max, "peer");
        let forwarded_cap = InFlightShare::cap(limits.client.in_flight_max, "forwarded");
        let peer_limits = ListenerLimits {
            streams_per_connection_max: limits
                .peer
                .streams_per_connection_max
                .max(limits.client.streams_per_connection_max),
            ..limits.peer.clone()
        };
        let peer = grpc_server(&peer_limits, peer_tls, "peer")?
            .layer(limit_requests(
                limits
                    .peer
                    .in_flight_max
                    .saturating_add(limits.client.in_flight_max),
                limits.peer.call_timeout,
                "peer",
            ))
            .add_service(
                raft_cap.limit(InterceptedService::new(
                    RaftPeerServer::new(peer_service)
                        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX),
                    PeerTokenCheck::new(config.peer_token.clone()),
                )),
            )
            .add_service(forwarded_cap.limit(members.guard(etcd.kv_server(bytes))))
            .add_service(forwarded_cap.limit(members.guard(etcd.lease_server(bytes))))
            .add_service(forwarded_cap.limit(members.guard(etcd.cluster_server(bytes))))
            .add_service(forwarded_cap.limit(members.guard(etcd.maintenance_server(bytes))))
            .add_service(forwarded_cap.limit(members.guard(etcd.lock_server(bytes))))
            .add_service(forwarded_cap.limit(members.guard(etcd.election_server(bytes))))
            .add_service(forwarded_cap.limit(members.guard(etcd.auth_server(bytes))))
            .serve_with_incoming_shutdown(peer_incoming, signal(stopped.clone()));
        let reflection = crate::grpc::reflection_service()
            .map_err(|error| ServeError::Reflection(error.to_string()))?;
        let client = grpc_server(&limits.client, client_tls.clone(), "client")?
            .layer(limit_requests(
                limits.client.in_flight_max,
                limits.client.call_timeout,
                "client",
            ))
            .add_service(crate::grpc::health_service(
                node.clone(),
                signal(stopped.clone()),
            ))
            .add_service(reflection)
            .add_service(
                KvServer::new(KvService::new(node.clone()))
                    .max_decoding_message_size(config.client_message_bytes_max)
                    .max_encoding_message_size(
                        config.client_message_bytes_max.max(PEER_MESSAGE_BYTES_MAX),
                    ),
            )
            .add_service(etcd.kv_server(config.client_message_bytes_max))
            .add_service(etcd.watch_server(config.client_message_bytes_max))
            .add_service(etcd.lease_server(config.client_message_bytes_max))
            .add_service(etcd.cluster_server(config.client_message_bytes_max))
            .add_service(etcd.maintenance_server(config.client_message_bytes_max))
            .add_service(etcd.lock_server(config.client_message_bytes_max))
            .add_service(etcd.election_server(config.client_message_bytes_max))
            .add_service(etcd.auth_server(config.client_message_bytes_max))
            .serve_with_incoming_shutdown(client_incoming, signal(stopped.clone()));
        // etcd's API alone on a port of its own, as the client port serves it.
        let etcd_only = match incoming.etcd {
            Some(listener) => {
                let (incoming, refused) = limit_connections(
                    crate::transport::tcp_incoming(listener),
                    limits.client.connections_max,
                    "etcd",
                );
                let (incoming, plaintext) = sort_if_tls(
                    incoming,
                    client_tls.is_some(),
                    crate::tls::HANDSHAKE_TIMEOUT,
                    signal(stopped.clone()),
                );
                refusals.push(tokio::spawn(answer_plaintext(
                    plaintext,
                    "etcd",
                    signal(stopped.clone()),
                )));
                refusals.push(tokio::spawn(answer_refused(
                    refused,
                    limits.client.connections_max,
                    "etcd",
                    client_tls.clone(),
                    signal(stopped.clone()),
                )));
                let server = grpc_server(&limits.client, client_tls.clone(), "etcd")?
                    .layer(limit_requests(
                        limits.client.in_flight_max,
                        limits.client.call_timeout,
                        "etcd",
                    ))
                    .add_service(etcd.kv_server(bytes))
                    .add_service(etcd.watch_server(bytes))
                    .add_service(etcd.lease_server(bytes))
                    .add_service(etcd.cluster_server(bytes))
                    .add_service(etcd.maintenance_server(bytes))
                    .add_service(etcd.lock_server(bytes))
                    .add_service(etcd.election_server(bytes))
                    .add_service(etcd.auth_server(bytes))
                    .serve_with_incoming_shutdown(incoming, signal(stopped));
                Some(tokio::spawn(server))
            }
            None => None,
        };
        tracing::info!(
            id = config.id,
            client = %config.advertise.client_address,
            peer = %config.advertise.peer_address,
            client_tls = config.client_tls.is_some(),
            client_certificates = config.client_tls.as_ref().is_some_and(ServerTls::requires_client_certificate),
            peer_tls = config.peer_tls.is_some(),
            peer_token = config.peer_token.is_some(),
            "node serving"
        );
        Ok(Listeners {
            stop,
            peer: tokio::spawn(peer),
            client: tokio::spawn(client),
            etcd_only,
            refusals,
        })
    }

    /// Stops the listeners: signals them, lets open calls end for `grace`
    /// and then drops those left ([`ended_by`]), and waits for the tasks
    /// answering turned-away connections (logging a failure of theirs).
    /// Returns each server's end, named.
    async fn stop(
        self,
        grace: Duration,
    ) -> [(
        &'static str,
        Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
    ); 3] {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        let peer = ended_by(deadline, self.peer).await;
        let client = ended_by(deadline, self.client).await;
        let etcd = match self.etcd_only {
            Some(server) => ended_by(deadline, server).await,
            None => Ok(Ok(())),
        };
        for refusal in self.refusals {
            if let Ok(Err(error)) = refusal.await {
                tracing::warn!(%error, "answering refused connections failed");
            }
        }
        [("peer", peer), ("client", client), ("etcd", etcd)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limits_work_and_a_bound_that_admits_nothing_is_refused() {
        assert_eq!(ServerLimits::default().check(), Ok(()));
        let mut limits = ServerLimits::DEFAULT;
        limits.client.in_flight_max = 0;
        assert!(matches!(
            limits.check(),
            Err(LimitsError::Count {
                listener: "client",
                ..
            })
        ));
        let mut limits = ServerLimits::DEFAULT;
        limits.peer.connections_max = usize::MAX;
        assert!(limits.check().is_err(), "more than a semaphore counts");
        let mut limits = ServerLimits::DEFAULT;
        limits.peer.call_timeout = Duration::ZERO;
        assert_eq!(
            limits.check(),
            Err(LimitsError::ZeroDuration {
                listener: "peer",
                what: "call timeout"
            })
        );
        let mut limits = ServerLimits::DEFAULT;
        limits.watch_bytes_max = 0;
        assert_eq!(
            limits.check(),
            Err(LimitsError::NoWatch {
                what: "unsent watch bytes"
            })
        );
        // The node's watch bounds are shared as the quotas say.
        let quotas = UserQuotas {
            user_share_percent: 50,
            admin_reserve_percent: 0,
        };
        let bounds = ServerLimits::DEFAULT.watch_bounds(quotas);
        assert_eq!(bounds.user_watchers_max(), WATCHERS_MAX_DEFAULT / 2);
        assert_eq!(
            ServerLimits::DEFAULT.watch_bounds(UserQuotas::default()),
            WatchBounds::default()
        );
    }
}

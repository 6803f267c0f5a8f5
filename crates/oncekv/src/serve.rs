//! `oncekv serve`: parses the node's flags into a `ServerConfig`, binds its
//! listeners and runs it until SIGINT or SIGTERM. The `--client-*` and
//! `--peer-*` limits bound each gRPC server, `--watchers-max` and
//! `--watch-bytes-max` the node's watches (`ServerLimits`); their
//! defaults are the server's own.

use crate::exit;
use anyhow::{Context, anyhow, bail};
use clap::Args;
use oncekv_server::node::NodeOptions;
use oncekv_server::raft::consensus::{ConsensusOptions, ReadPolicy};
use oncekv_server::raft::network::PeerAppend;
use oncekv_server::raft::peer_token::{PeerToken, readable_by_others};
use oncekv_server::raft::type_config::{NodeId, NodeInfo};
use oncekv_server::server::{
    ListenerLimits, SNAPSHOT_BYTES_MAX_DEFAULT, ServeError, ServerConfig, ServerLimits, serve,
};
use oncekv_server::tls::{PeerTls, ServerTls, TlsFiles};
use oncekv_server::watch::{WATCH_BYTES_MAX_DEFAULT, WATCHERS_MAX_DEFAULT};
use oncekv_state::{Limits, UserQuotas};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

const AFTER_HELP: &str = "\
Examples:
  oncekv serve
      a single-node cluster on 127.0.0.1:7379, data in ./oncekv-data
  oncekv certs create-token --out peer-token
  oncekv serve --id 1 --listen-client 127.0.0.1:7379 --listen-peer 127.0.0.1:7380 \\
      --initial-cluster 1=127.0.0.1:7380/127.0.0.1:7379,2=127.0.0.1:7382/127.0.0.1:7381,3=127.0.0.1:7384/127.0.0.1:7383 \\
      --peer-token-file peer-token
      node 1 of a three-node cluster (start nodes 2 and 3 the same way, with
      the same token file)
  oncekv serve --cert-file certs/node-1.pem --key-file certs/node-1-key.pem \
      --peer-cert-file certs/node-1.pem --peer-key-file certs/node-1-key.pem \
      --peer-ca-file certs/ca.pem ...
      TLS on both ports (certificates from `oncekv certs`; see
      docs/security.md); add --client-ca-file certs/ca.pem to require
      client certificates

--initial-cluster lists every member as ID=PEER_ADDRESS/CLIENT_ADDRESS (the
client address is what clients are told to use in leader hints). It is used
on the first start only; later starts resume from the data directory, which
remembers its node id and cluster and refuses another.

Peers prove who they are. A node of several (--initial-cluster naming other
members, or --join) must be given a shared cluster secret
(--peer-token-file, the same file on every node) or mutual TLS on the peer
port (--peer-cert-file, --peer-key-file, --peer-ca-file), or both; without
either it refuses to start, unless told --insecure-peers (then anyone who
reaches its peer port can forge votes and log entries: loopback tests
only). A node alone needs neither.

Stopping (SIGINT or SIGTERM): a leader first hands leadership to another
voter, so the cluster waits for no election; open calls get 2 s to end
(watches and peer streams, which never end on their own, are then
dropped); then the node stops.

Exit codes (the table shared by every subcommand: oncekv --help):
  0  stopped cleanly (SIGINT or SIGTERM)
  1  failed while running
  2  usage error (bad flags, id not in --initial-cluster)
  10 data directory unusable (a damaged log: docs/operations.md), or it
     belongs to another node or cluster
  11 an address cannot be bound (in use, or not local)
  12 storage failed (a log write or sync failed, or the disk is full): the
     node stopped without acknowledging unsynced data; restart it (after
     freeing space) to recover";

/// Flags of `oncekv serve`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct ServeArgs {
    /// This node's id (unique in the cluster, not 0).
    #[arg(long, env = "ONCEKV_ID", default_value_t = 1)]
    id: NodeId,

    /// Directory for the log, state and snapshots (created if missing).
    #[arg(long, env = "ONCEKV_DATA_DIR", default_value = "oncekv-data")]
    data_dir: PathBuf,

    /// Address for client requests.
    #[arg(long, env = "ONCEKV_LISTEN_CLIENT", default_value = "127.0.0.1:7379")]
    listen_client: SocketAddr,

    /// Address for Raft traffic from other nodes.
    #[arg(long, env = "ONCEKV_LISTEN_PEER", default_value = "127.0.0.1:7380")]
    listen_peer: SocketAddr,

    /// Client address given to clients in leader hints [default: --listen-client].
    #[arg(long, env = "ONCEKV_ADVERTISE_CLIENT")]
    advertise_client: Option<String>,

    /// Peer address other nodes use [default: --listen-peer].
    #[arg(long, env = "ONCEKV_ADVERTISE_PEER")]
    advertise_peer: Option<String>,

    /// Initial members, ID=PEER/CLIENT,... [default: this node alone].
    #[arg(long, env = "ONCEKV_INITIAL_CLUSTER", conflicts_with = "join")]
    initial_cluster: Option<String>,

    /// Start without forming a cluster: wait to be added by `member add`.
    #[arg(long)]
    join: bool,

    /// Also serve etcd's v3 API alone on this address, with the client
    /// port's TLS and limits (for example 127.0.0.1:2379, where etcdctl
    /// and etcd's clients look by default). etcd's API is served on the
    /// client port too; see docs/etcd-compatibility.md.
    #[arg(long, env = "ONCEKV_LISTEN_ETCD", value_name = "ADDRESS")]
    listen_etcd: Option<SocketAddr>,

    /// The etcd version etcd's API reports (in Maintenance.Status, which
    /// clients gate features on).
    #[arg(long, env = "ONCEKV_ETCD_VERSION", value_name = "VERSION", default_value = oncekv_server::grpc::etcd::ETCD_VERSION, value_parser = parse_etcd_version)]
    etcd_version: String,

    /// Serve Prometheus metrics at http://ADDRESS/metrics.
    #[arg(long, env = "ONCEKV_LISTEN_METRICS")]
    listen_metrics: Option<SocketAddr>,

    /// Raft heartbeat interval.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    heartbeat: Duration,

    /// Minimum election timeout (the maximum is twice this).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    election_timeout: Duration,

    /// How the leader confirms it still leads before a linearizable read.
    ///
    /// `lease`: within its lease the leader answers from its own state, with
    /// no message to the followers (a read costs no network round). The
    /// lease is 90% of the maximum election timeout (2 x
    /// --election-timeout), counted on the leader's monotonic clock from
    /// the sending of the last message a quorum acknowledged; followers
    /// refuse to vote for a whole maximum election timeout after each
    /// message (a restarted node, after it starts). It is safe while no
    /// node's clock runs more than about 5% faster or slower than
    /// another's (quartz and NTP stay under 0.1%), and unsafe where a
    /// host's monotonic clock stops while time goes on (a suspended
    /// machine or a VM paused by its hypervisor). Past the lease, a read
    /// falls back to read-index.
    ///
    /// `read-index`: every read waits for a quorum to acknowledge a
    /// heartbeat sent after it arrived (concurrent reads share one round):
    /// no clock assumption, one network round per read. Use the same
    /// policy on every node.
    #[arg(long, value_enum, default_value_t = ReadPolicyArg::Lease)]
    read_policy: ReadPolicyArg,

    /// Threads that run the node's tasks (calls, consensus, replication,
    /// apply); the log's writer and blocking work have threads of their
    /// own. Default: half the cores, at least one. A write passes through
    /// a few tasks that run one after another, and handing it between
    /// threads costs more than running it on more of them gains:
    /// measured on 2 cores, one thread gave 10% to 34% more writes than
    /// two (docs/benchmarks.md).
    #[arg(long, env = "ONCEKV_WORKER_THREADS", value_name = "N")]
    worker_threads: Option<std::num::NonZeroUsize>,

    /// How the leader replicates entries to a follower.
    ///
    /// `stream`: one long-lived call per follower carries the entries as
    /// they come, without waiting for the reply to the previous batch
    /// (pipelined); a follower that does not know it (an older version) is
    /// sent `unary` calls. `unary`: one call per round, each waiting for
    /// the previous reply.
    #[arg(long, value_enum, default_value_t = PeerAppendArg::Stream)]
    peer_append: PeerAppendArg,

    /// Take a snapshot after this many log entries (each snapshot encodes
    /// and writes the whole state; the log behind it stays in memory).
    /// While the leader sends its snapshot to a peer, or that peer catches
    /// up from the log after it, the next one waits, up to four times this
    /// distance (or --snapshot-after-bytes).
    #[arg(long, default_value_t = ConsensusOptions::default().snapshot_after_entries)]
    snapshot_after_entries: u64,

    /// Also take a snapshot once this many bytes of keys and values were
    /// applied since the last one.
    #[arg(long, default_value_t = ConsensusOptions::default().snapshot_after_bytes)]
    snapshot_after_bytes: u64,

    /// Log entries kept behind a snapshot for slow followers.
    #[arg(long, default_value_t = 1_000)]
    log_entries_kept: u64,

    /// How often an idle leader advances cluster time while anything can
    /// expire (a lease, session or key whose deadline passed is expired
    /// within a tenth of a second, whatever this says).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    tick_interval: Duration,

    /// How long a request waits for its entry to apply before the client is
    /// told the outcome is unknown.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,

    /// Largest client message, in bytes.
    #[arg(long, default_value_t = oncekv_server::server::CLIENT_MESSAGE_BYTES_DEFAULT)]
    max_message_bytes: usize,

    /// Longest key, in bytes (a cluster setting: the same on every node).
    #[arg(long, default_value_t = Limits::default().key_bytes_max)]
    key_bytes_max: usize,

    /// Largest value, in bytes (a cluster setting).
    #[arg(long, default_value_t = Limits::default().value_bytes_max)]
    value_bytes_max: usize,

    /// Most live sessions (a cluster setting).
    #[arg(long, default_value_t = Limits::default().sessions_max)]
    sessions_max: u64,

    /// Shortest session or lease TTL, in milliseconds (a cluster setting).
    #[arg(long, default_value_t = Limits::default().session_ttl_ms_min)]
    ttl_ms_min: u64,

    /// Most idempotency keys kept (a cluster setting). When the table is
    /// full of unexpired keys, a request under a new key is refused as
    /// overloaded; a kept key is never evicted.
    #[arg(long, default_value_t = Limits::default().idempotency_keys_max)]
    idempotency_keys_max: u64,

    /// Most bytes of keys and replies kept under idempotency keys (a
    /// cluster setting).
    #[arg(long, default_value_t = Limits::default().idempotency_bytes_max)]
    idempotency_bytes_max: u64,

    /// How long an idempotency key is kept, in milliseconds of cluster time
    /// (a cluster setting): a retry within it is never applied twice.
    #[arg(long, default_value_t = Limits::default().idempotency_key_ttl_ms)]
    idempotency_key_ttl_ms: u64,

    /// Most bytes of unacknowledged completion records one session holds
    /// before its new requests are refused as overloaded (a cluster setting).
    #[arg(long, default_value_t = Limits::default().session_record_bytes_max)]
    session_record_bytes_max: u64,

    /// Most bytes of completion records all sessions hold together (a
    /// cluster setting).
    #[arg(long, default_value_t = Limits::default().record_bytes_max)]
    record_bytes_max: u64,

    /// The store's byte quota (a cluster setting): a write that would pass
    /// it raises the NOSPACE alarm, and writes that grow the store are
    /// refused until keys are deleted and `oncekv alarm disarm` runs.
    #[arg(long, default_value_t = Limits::default().store_bytes_max)]
    store_bytes_max: u64,

    /// Most bytes of keys and values in one scan reply (a cluster setting);
    /// a longer scan stops with `more`. A transaction's reply may hold twice
    /// this, all its reads together; a larger one is refused whole.
    #[arg(long, default_value_t = Limits::default().scan_bytes_max)]
    scan_bytes_max: u64,

    /// Most changes the history keeps for reads of the past (`get --rev`)
    /// and watches (a cluster setting); past it the oldest revisions are
    /// compacted.
    #[arg(long, value_name = "N", default_value_t = Limits::default().history_events_max)]
    history_events_max: u64,

    /// Most bytes of keys and values the history keeps (a cluster setting).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().history_bytes_max)]
    history_bytes_max: u64,

    /// Longest time a change stays in the history, in cluster time (a
    /// cluster setting).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    history_retention: Duration,

    /// Most compares, and most operations per branch, in a transaction (a
    /// cluster setting).
    #[arg(long, value_name = "N", default_value_t = Limits::default().txn_ops_max)]
    txn_ops_max: u32,

    /// The share, in percent, of the session, completion-record and
    /// idempotency-key budgets (`--sessions-max`, `--record-bytes-max`,
    /// `--idempotency-keys-max`, `--idempotency-bytes-max`) one user
    /// without the admin role may hold while authentication is enabled (a
    /// cluster setting). A user at its share is refused as overloaded;
    /// other users are not. Each node shares its watch bounds
    /// (`--watchers-max`, `--watch-bytes-max`) the same way.
    #[arg(long, value_name = "PERCENT", default_value_t = UserQuotas::default().user_share_percent,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    user_share_percent: u8,

    /// The share, in percent, of those budgets kept for admins (a cluster
    /// setting): users without the admin role are refused once the rest
    /// is used, so an admin can still open a session and free a user's
    /// records (`oncekv user purge`), and watch when users hold every
    /// other watcher.
    #[arg(long, value_name = "PERCENT", default_value_t = UserQuotas::default().admin_reserve_percent,
          value_parser = clap::value_parser!(u8).range(0..=90))]
    admin_reserve_percent: u8,

    /// Most session opens this node proposes per second (a burst of as
    /// many is allowed); more are refused as overloaded before proposing.
    #[arg(long, default_value_t = NodeOptions::default().session_opens_per_second)]
    session_opens_per_second: u32,

    /// How long a login token is accepted (in cluster time) once
    /// authentication is enabled; clients log in again after it.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    auth_token_ttl: Duration,
    /// Most open client connections; one more is accepted and closed at once.
    #[arg(long, value_name = "N", default_value_t = CLIENT.connections_max)]
    client_max_connections: usize,

    /// Most concurrent calls (HTTP/2 streams) on one client connection.
    #[arg(long, value_name = "N", default_value_t = CLIENT.streams_per_connection_max)]
    client_max_streams: u32,

    /// Most client requests handled at once over all connections; one more
    /// is refused unhandled (RESOURCE_EXHAUSTED, oncekv-overloaded:
    /// in-flight) and the client retries it later.
    #[arg(long, value_name = "N", default_value_t = CLIENT.in_flight_max)]
    client_max_in_flight: usize,

    /// Longest a client call may run before it is cancelled (a mutation
    /// cancelled so may still apply). etcd's Lock and Campaign wait for
    /// their turn as long as their caller does.
    #[arg(long, value_name = "DURATION", default_value_t = CLIENT.call_timeout.into())]
    client_call_timeout: humantime::Duration,

    /// How often an HTTP/2 ping checks each client connection.
    #[arg(long, value_name = "DURATION", default_value_t = CLIENT.keepalive_interval.into())]
    client_keepalive_interval: humantime::Duration,

    /// How long a client connection's ping may go unanswered before the
    /// connection is closed.
    #[arg(long, value_name = "DURATION", default_value_t = CLIENT.keepalive_timeout.into())]
    client_keepalive_timeout: humantime::Duration,

    /// Most open peer (Raft) connections; one more is accepted and closed at
    /// once.
    #[arg(long, value_name = "N", default_value_t = PEER.connections_max)]
    peer_max_connections: usize,

    /// Most concurrent calls (HTTP/2 streams) on one peer connection (at
    /// least --client-max-streams: the etcd calls a follower forwards to
    /// the leader's peer port share one connection).
    #[arg(long, value_name = "N", default_value_t = PEER.streams_per_connection_max)]
    peer_max_streams: u32,

    /// Most peer (Raft) requests handled at once over all connections; one
    /// more is refused unhandled (RESOURCE_EXHAUSTED) and Raft sends it
    /// again. The etcd calls followers forward to the peer port have a cap
    /// of their own, --client-max-in-flight.
    #[arg(long, value_name = "N", default_value_t = PEER.in_flight_max)]
    peer_max_in_flight: usize,

    /// Longest a peer call may run before it is cancelled (bounds receiving
    /// and installing a snapshot too).
    #[arg(long, value_name = "DURATION", default_value_t = PEER.call_timeout.into())]
    peer_call_timeout: humantime::Duration,

    /// How often an HTTP/2 ping checks each peer connection.
    #[arg(long, value_name = "DURATION", default_value_t = PEER.keepalive_interval.into())]
    peer_keepalive_interval: humantime::Duration,

    /// How long a peer connection's ping may go unanswered before the
    /// connection is closed.
    #[arg(long, value_name = "DURATION", default_value_t = PEER.keepalive_timeout.into())]
    peer_keepalive_timeout: humantime::Duration,

    /// Largest snapshot a peer may send, in bytes: a larger announced size is
    /// refused at once. It is spooled to DATA_DIR/snapshot-incoming/ while
    /// received and held in memory once while installed.
    #[arg(long, value_name = "BYTES", default_value_t = SNAPSHOT_BYTES_MAX_DEFAULT)]
    max_snapshot_bytes: u64,

    /// Most watchers (native and etcd watches) this node serves at once;
    /// one more is refused (RESOURCE_EXHAUSTED; an etcd watch is created
    /// and cancelled at once), never served by dropping another. A user
    /// may hold its share of them, --user-share-percent (with
    /// authentication off, the clients of one source address share one),
    /// and while authentication is enabled the users without the admin
    /// role together all but --admin-reserve-percent, kept for admins: by
    /// default 1024 per user and 409 kept. One connection holds at most
    /// 200 native watchers, one etcd stream 1024 watches. This node's own
    /// setting (not a cluster setting).
    #[arg(long, value_name = "N", default_value_t = WATCHERS_MAX_DEFAULT,
          value_parser = at_least_one)]
    watchers_max: usize,

    /// Most bytes of events this node's watch streams hold unsent
    /// together, for clients that do not read them fast enough. A watch
    /// whose next change would pass a bound is cancelled, told the bound
    /// and the revision to resume from; a reader that keeps up is never
    /// cancelled. A user's streams may hold its share of it,
    /// --user-share-percent (with authentication off, one source
    /// address's), and while authentication is enabled the users without
    /// the admin role together all but --admin-reserve-percent: by default
    /// 64 MiB per user and a tenth kept for admins. One stream holds at
    /// most 4 MiB, whatever this says. This node's own setting.
    #[arg(long, value_name = "BYTES", default_value_t = WATCH_BYTES_MAX_DEFAULT,
          value_parser = at_least_one)]
    watch_bytes_max: usize,

    /// Source address of outgoing Raft connections [default: chosen by the OS].
    #[arg(long, env = "ONCEKV_PEER_SOURCE_IP")]
    peer_source_ip: Option<IpAddr>,

    /// TLS on the client port: this node's certificate (PEM; `oncekv certs
    /// create-node` makes one) [default: plaintext].
    #[arg(
        long,
        env = "ONCEKV_CERT_FILE",
        value_name = "FILE",
        requires = "key_file",
        help_heading = "TLS"
    )]
    cert_file: Option<PathBuf>,

    /// The private key of --cert-file (PEM).
    #[arg(
        long,
        env = "ONCEKV_KEY_FILE",
        value_name = "FILE",
        requires = "cert_file",
        help_heading = "TLS"
    )]
    key_file: Option<PathBuf>,

    /// Mutual TLS on the client port: clients must present a certificate
    /// issued by this CA (PEM; `oncekv certs create-client`).
    #[arg(
        long,
        env = "ONCEKV_CLIENT_CA_FILE",
        value_name = "FILE",
        requires = "cert_file",
        help_heading = "TLS"
    )]
    client_ca_file: Option<PathBuf>,

    /// Mutual TLS on the peer port and to peers: this node's certificate,
    /// which must carry the DNS name node-ID, ID being --id [default:
    /// plaintext].
    #[arg(long, env = "ONCEKV_PEER_CERT_FILE", value_name = "FILE", requires_all = ["peer_key_file", "peer_ca_file"], help_heading = "TLS")]
    peer_cert_file: Option<PathBuf>,

    /// The private key of --peer-cert-file (PEM).
    #[arg(
        long,
        env = "ONCEKV_PEER_KEY_FILE",
        value_name = "FILE",
        requires = "peer_cert_file",
        help_heading = "TLS"
    )]
    peer_key_file: Option<PathBuf>,

    /// The CA every peer's certificate must come from (PEM); a peer is
    /// served only with a certificate for the node it sends as.
    #[arg(
        long,
        env = "ONCEKV_PEER_CA_FILE",
        value_name = "FILE",
        requires = "peer_cert_file",
        help_heading = "TLS"
    )]
    peer_ca_file: Option<PathBuf>,

    /// Authenticate peers by a shared cluster secret read from FILE: every
    /// Raft message this node sends carries it, and a message received
    /// without it is refused (UNAUTHENTICATED) before it is read. Give
    /// every node the same file; `oncekv certs create-token --out FILE`
    /// makes one (white space around the secret is trimmed; at least 32
    /// bytes; keep it mode 0600). The token crosses the network as it is:
    /// where others can watch the network, add peer TLS (--peer-cert-file).
    /// A node of several needs this or peer TLS (or --insecure-peers).
    #[arg(
        long,
        env = "ONCEKV_PEER_TOKEN_FILE",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    peer_token_file: Option<PathBuf>,

    /// Run a node of several (--initial-cluster naming other members, or
    /// --join) with neither --peer-token-file nor peer TLS: its peers are
    /// not authenticated, so anyone who reaches its peer port can forge
    /// votes and log entries (write any key, stall elections). For tests
    /// on one machine's loopback only; warned about at start.
    #[arg(long, conflicts_with_all = ["peer_token_file", "peer_cert_file"], help_heading = "TLS")]
    insecure_peers: bool,

    /// Negative control of `oncekv verify` only: answer no retry from its
    /// completion record, so duplicates apply again. Breaks exactly-once.
    #[arg(long, hide = true)]
    unsafe_no_dedup: bool,
}

/// `--read-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ReadPolicyArg {
    /// The leader's lease, read-index past it (bounded clock drift).
    Lease,
    /// A quorum round per read (no clock assumption).
    ReadIndex,
}

/// `--peer-append`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PeerAppendArg {
    /// Pipelined on one stream per follower.
    Stream,
    /// One call per replication round.
    Unary,
}

/// The client port's default limits, for the flags' defaults.
const CLIENT: ListenerLimits = ListenerLimits::CLIENT_DEFAULT;
/// The peer port's default limits.
const PEER: ListenerLimits = ListenerLimits::PEER_DEFAULT;

/// Parses `ID=PEER/CLIENT,...`.
pub(crate) fn parse_cluster(text: &str) -> anyhow::Result<BTreeMap<NodeId, NodeInfo>> {
    let mut members = BTreeMap::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (id, addresses) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("`{item}`: expected ID=PEER_ADDRESS/CLIENT_ADDRESS"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .with_context(|| format!("`{item}`: bad node id"))?;
        if id == 0 {
            bail!("`{item}`: node ids start at 1");
        }
        let (peer, client) = addresses.split_once('/').ok_or_else(|| {
            anyhow!("`{item}`: give both addresses, ID=PEER_ADDRESS/CLIENT_ADDRESS")
        })?;
        let info = NodeInfo {
            peer_address: peer.trim().into(),
            client_address: client.trim().into(),
        };
        if info.peer_address.is_empty() || info.client_address.is_empty() {
            bail!("`{item}`: empty address");
        }
        if members.insert(id, info).is_some() {
            bail!("node {id} is listed twice");
        }
    }
    if members.is_empty() {
        bail!("--initial-cluster lists no member");
    }
    Ok(members)
}

fn config(args: &ServeArgs) -> anyhow::Result<ServerConfig> {
    if args.id == 0 {
        bail!("--id must be at least 1");
    }
    let advertise = NodeInfo {
        peer_address: args
            .advertise_peer
            .clone()
            .unwrap_or_else(|| args.listen_peer.to_string()),
        client_address: args
            .advertise_client
            .clone()
            .unwrap_or_else(|| args.listen_client.to_string()),
    };
    let initial_cluster = match (&args.initial_cluster, args.join) {
        (_, true) => None,
        (None, false) => Some(BTreeMap::from([(args.id, advertise.clone())])),
        (Some(text), false) => {
            let members = parse_cluster(text).context("--initial-cluster")?;
            if !members.contains_key(&args.id) {
                bail!("--id {} is not in --initial-cluster ({text})", args.id);
            }
            Some(members)
        }
    };
    let election_ms = u64::try_from(args.election_timeout.as_millis()).unwrap_or(u64::MAX);
    let heartbeat_ms = u64::try_from(args.heartbeat.as_millis()).unwrap_or(u64::MAX);
    if heartbeat_ms == 0 || heartbeat_ms >= election_ms {
        bail!("--heartbeat must be positive and shorter than --election-timeout");
    }
    let limits = Limits {
        key_bytes_max: args.key_bytes_max,
        value_bytes_max: args.value_bytes_max,
        sessions_max: args.sessions_max,
        session_ttl_ms_min: args.ttl_ms_min,
        lease_ttl_ms_min: args.ttl_ms_min,
        idempotency_keys_max: args.idempotency_keys_max,
        idempotency_bytes_max: args.idempotency_bytes_max,
        idempotency_key_ttl_ms: args.idempotency_key_ttl_ms,
        session_record_bytes_max: args.session_record_bytes_max,
        record_bytes_max: args.record_bytes_max,
        store_bytes_max: args.store_bytes_max,
        scan_bytes_max: args.scan_bytes_max,
        history_events_max: args.history_events_max,
        history_bytes_max: args.history_bytes_max,
        history_retention_ms: u64::try_from(args.history_retention.as_millis()).unwrap_or(u64::MAX),
        txn_ops_max: args.txn_ops_max,
        quotas: UserQuotas {
            user_share_percent: args.user_share_percent,
            admin_reserve_percent: args.admin_reserve_percent,
        },
        ..Limits::default()
    };
    let server_limits = ServerLimits {
        client: ListenerLimits {
            connections_max: args.client_max_connections,
            streams_per_connection_max: args.client_max_streams,
            in_flight_max: args.client_max_in_flight,
            call_timeout: *args.client_call_timeout,
            keepalive_interval: *args.client_keepalive_interval,
            keepalive_timeout: *args.client_keepalive_timeout,
        },
        peer: ListenerLimits {
            connections_max: args.peer_max_connections,
            streams_per_connection_max: args.peer_max_streams,
            in_flight_max: args.peer_max_in_flight,
            call_timeout: *args.peer_call_timeout,
            keepalive_interval: *args.peer_keepalive_interval,
            keepalive_timeout: *args.peer_keepalive_timeout,
        },
        snapshot_bytes_max: args.max_snapshot_bytes,
        watchers_max: args.watchers_max,
        watch_bytes_max: args.watch_bytes_max,
    };
    server_limits.check()?;
    let client_tls = match (&args.cert_file, &args.key_file) {
        (Some(cert), Some(key)) => Some(ServerTls::load(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: args.client_ca_file.clone(),
        })?),
        _ => None,
    };
    let peer_tls = match (&args.peer_cert_file, &args.peer_key_file) {
        (Some(cert), Some(key)) => Some(PeerTls::load(
            args.id,
            &TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: args.peer_ca_file.clone(),
            },
        )?),
        _ => None,
    };
    let peer_token = args
        .peer_token_file
        .as_deref()
        .map(load_peer_token)
        .transpose()?;
    let several = args.join
        || initial_cluster
            .as_ref()
            .is_some_and(|members| members.keys().any(|id| *id != args.id));
    check_peer_authentication(args, several, peer_tls.is_some(), peer_token.is_some())?;
    warn_if_exposed(
        args,
        client_tls.is_some(),
        peer_tls.is_some(),
        peer_token.is_some(),
    );
    Ok(ServerConfig {
        id: args.id,
        data_dir: args.data_dir.clone(),
        advertise,
        initial_cluster,
        limits,
        consensus: ConsensusOptions {
            heartbeat_ms,
            election_timeout_min_ms: election_ms,
            election_timeout_max_ms: election_ms.saturating_mul(2),
            snapshot_after_entries: args.snapshot_after_entries.max(1),
            snapshot_after_bytes: args.snapshot_after_bytes.max(1),
            log_entries_kept_after_snapshot: args.log_entries_kept,
            read_policy: match args.read_policy {
                ReadPolicyArg::Lease => ReadPolicy::Lease,
                ReadPolicyArg::ReadIndex => ReadPolicy::ReadIndex,
            },
            peer_append: match args.peer_append {
                PeerAppendArg::Stream => PeerAppend::Stream,
                PeerAppendArg::Unary => PeerAppend::Unary,
            },
        },
        node: NodeOptions {
            propose_timeout: args.request_timeout,
            tick_interval: args.tick_interval,
            session_opens_per_second: args.session_opens_per_second,
            token_ttl: args.auth_token_ttl,
            // Filled in from the peer TLS by the server.
            peer_tls: None,
        },
        client_message_bytes_max: args.max_message_bytes,
        server_limits,
        metrics: args.listen_metrics,
        // Bound in `run`, where a refused address has its exit code.
        etcd_listener: None,
        etcd_version: args.etcd_version.clone(),
        peer_source_ip: args.peer_source_ip,
        peer_connector: None,
        client_tls,
        peer_tls,
        peer_token,
        inline_disk_io: false,
        dedup: !args.unsafe_no_dedup,
    })
}

fn bind(address: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, String> {
    let listener = bind_std(address, what)?;
    listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
        .map_err(|error| format!("cannot listen for {what} on {address}: {error}"))
}

/// A count or a size that must admit something (a watch bound).
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("it must be at least 1: 0 would refuse every watch".to_string()),
        Ok(value) => Ok(value),
        Err(error) => Err(format!("{text:?} is not a count: {error}")),
    }
}

/// An etcd version: MAJOR.MINOR.PATCH, numbers only.
fn parse_etcd_version(text: &str) -> Result<String, String> {
    let parts: Vec<&str> = text.split('.').collect();
    let numbers = parts.len() == 3
        && parts
            .iter()
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
    if numbers {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not MAJOR.MINOR.PATCH (for example 3.5.13)"
        ))
    }
}

fn bind_std(address: SocketAddr, what: &str) -> Result<std::net::TcpListener, String> {
    std::net::TcpListener::bind(address)
        .map_err(|error| format!("cannot listen for {what} on {address}: {error}"))
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

impl ServeArgs {
    /// How many threads run the node's tasks (`--worker-threads`).
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1)),
            std::num::NonZeroUsize::get,
        )
    }
}

/// Runs `oncekv serve`; returns the documented exit code.
pub async fn run(args: ServeArgs) -> ExitCode {
    let config = match config(&args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error:#}");
            return exit::code(exit::USAGE);
        }
    };
    let mut config = config;
    let listeners = bind(args.listen_client, "clients")
        .and_then(|client| Ok((client, bind(args.listen_peer, "peers")?)))
        .and_then(|(client, peer)| {
            let etcd = match args.listen_etcd {
                Some(address) => Some(bind_std(address, "etcd's API")?),
                None => None,
            };
            Ok((client, peer, etcd))
        });
    let (client, peer) = match listeners {
        Ok((client, peer, etcd)) => {
            config.etcd_listener = etcd.map(std::sync::Arc::new);
            (client, peer)
        }
        Err(error) => {
            eprintln!("error: {error}");
            return exit::code(exit::ADDRESS);
        }
    };
    let client = oncekv_server::transport::tcp_incoming(client);
    let peer = oncekv_server::transport::tcp_incoming(peer);
    let etcd = args
        .listen_etcd
        .map(|address| format!(", etcd's API also on {address}"))
        .unwrap_or_default();
    eprintln!(
        "oncekv node {} serving clients on {} (peers on {}{etcd}), data in {}",
        config.id,
        args.listen_client,
        args.listen_peer,
        config.data_dir.display()
    );
    match serve(config, client, peer, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ (ServeError::Identity(_) | ServeError::Storage { .. })) => {
            eprintln!("error: {error}");
            exit::code(exit::DATA_REFUSED)
        }
        Err(error @ (ServeError::Fatal(_) | ServeError::DiskFull(_))) => {
            eprintln!("error: {error}");
            exit::code(exit::STORAGE)
        }
        Err(error) => {
            eprintln!("error: {error}");
            exit::code(exit::ERROR)
        }
    }
}

/// The ports that listen beyond loopback without TLS, with what that
/// exposes.
fn exposed_ports(
    listen_client: SocketAddr,
    listen_peer: SocketAddr,
    listen_etcd: Option<SocketAddr>,
    client_tls: bool,
    peer_tls: bool,
    peer_token: bool,
) -> Vec<(&'static str, SocketAddr, &'static str)> {
    const CLIENT: &str = "passwords, tokens and session secrets cross the network in clear, and \
         unless authentication is enabled (oncekv auth enable) anyone who reaches it can read \
         and change every key";
    const PEER: &str = "unless --peer-token-file is given, any host that reaches it can speak \
         for a member: use --peer-cert-file, --peer-key-file and --peer-ca-file";
    const PEER_TOKEN: &str = "the peer token, every request and every snapshot cross the \
         network in clear, and whoever watches it learns the token and can speak for a \
         member: add --peer-cert-file, --peer-key-file and --peer-ca-file";
    let peer = if peer_token { PEER_TOKEN } else { PEER };
    [
        Some(("client", listen_client, client_tls, CLIENT)),
        Some(("peer", listen_peer, peer_tls, peer)),
        listen_etcd.map(|address| ("etcd", address, client_tls, CLIENT)),
    ]
    .into_iter()
    .flatten()
    .filter(|(_, address, tls, _)| !tls && !address.ip().is_loopback())
    .map(|(port, address, _, what)| (port, address, what))
    .collect()
}

/// Warns loudly when a port listens beyond loopback without TLS: then
/// session secrets, passwords and tokens cross the network in clear, and
/// unless authentication is enabled anyone who reaches the client port can
/// read and change everything (the peer port: forge the log).
fn warn_if_exposed(args: &ServeArgs, client_tls: bool, peer_tls: bool, peer_token: bool) {
    for (port, address, what) in exposed_ports(
        args.listen_client,
        args.listen_peer,
        args.listen_etcd,
        client_tls,
        peer_tls,
        peer_token,
    ) {
        tracing::warn!(port, %address, "listening beyond loopback without TLS: {what}");
        eprintln!(
            "WARNING: the {port} port listens on {address} without TLS: {what} (docs/security.md)"
        );
    }
}

/// Reads `--peer-token-file`, warning when others may read it.
fn load_peer_token(path: &Path) -> anyhow::Result<PeerToken> {
    let token = PeerToken::load(path)?;
    match readable_by_others(path) {
        Ok(Some(mode)) => {
            tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "the peer token file is readable by others");
            eprintln!(
                "WARNING: the peer token file {} is readable by its group or others (mode \
                 {mode:o}): whoever reads it can speak for a member; chmod 600 it",
                path.display()
            );
        }
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read the peer token file's permissions");
        }
    }
    Ok(token)
}

/// The refusal of a node of several whose peers nothing authenticates.
const UNAUTHENTICATED_PEERS: &str = "nothing authenticates this node's peers, so anyone who \
     reaches its peer port could forge votes and log entries. Give every node the same \
     --peer-token-file FILE (`oncekv certs create-token --out FILE` makes one), or mutual TLS on \
     the peer port (--peer-cert-file, --peer-key-file, --peer-ca-file; docs/security.md), or, \
     on one machine's loopback only, --insecure-peers";

/// A node of several (`several`: `--initial-cluster` names other members,
/// or `--join`) must authenticate its peers by TLS or a token, unless told
/// `--insecure-peers`, which is warned about.
fn check_peer_authentication(
    args: &ServeArgs,
    several: bool,
    peer_tls: bool,
    peer_token: bool,
) -> anyhow::Result<()> {
    if args.insecure_peers {
        tracing::warn!(
            peer = %args.listen_peer,
            "--insecure-peers: peer messages are not authenticated"
        );
        eprintln!(
            "WARNING: --insecure-peers: peer messages are not authenticated; anyone who reaches \
             the peer port ({}) can forge votes and log entries (docs/security.md)",
            args.listen_peer
        );
        return Ok(());
    }
    if several && !peer_tls && !peer_token {
        let why = if args.join {
            format!("node {} joins a cluster (--join), but", args.id)
        } else {
            format!(
                "node {} is one of several (--initial-cluster names other members), but",
                args.id
            )
        };
        bail!("{why} {UNAUTHENTICATED_PEERS}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: super::ServeArgs,
    }

    #[test]
    fn worker_threads_default_to_half_the_cores_and_take_the_flag() {
        use clap::Parser as _;
        let parsed = |flags: &[&str]| {
            let argv = std::iter::once("serve").chain(flags.iter().copied());
            Serve::try_parse_from(argv)
                .expect("flags")
                .args
                .worker_threads()
        };
        let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
        assert_eq!(parsed(&[]), (cores / 2).max(1));
        assert_eq!(parsed(&["--worker-threads", "3"]), 3);
        assert!(Serve::try_parse_from(["serve", "--worker-threads", "0"]).is_err());
    }

    #[test]
    fn ports_beyond_loopback_without_tls_are_called_out() {
        let address = |text: &str| text.parse::<SocketAddr>().expect("an address");
        let local = address("127.0.0.1:7379");
        let public = address("0.0.0.0:7380");
        assert!(super::exposed_ports(local, local, None, false, false, false).is_empty());
        let exposed = super::exposed_ports(public, public, None, false, true, false);
        assert_eq!(exposed.len(), 1);
        assert_eq!(exposed[0].0, "client");
        assert!(exposed[0].2.contains("auth enable"));
        let exposed = super::exposed_ports(local, address("[::]:1"), None, true, false, false);
        assert_eq!(exposed.iter().map(|e| e.0).collect::<Vec<_>>(), ["peer"]);
        assert!(exposed[0].2.contains("--peer-token-file"));
        // A token alone crosses the network in clear.
        let exposed = super::exposed_ports(local, address("[::]:1"), None, true, false, true);
        assert_eq!(exposed.iter().map(|e| e.0).collect::<Vec<_>>(), ["peer"]);
        assert!(exposed[0].2.contains("learns the token"));
        assert!(super::exposed_ports(public, public, Some(public), true, true, false).is_empty());
        let exposed = super::exposed_ports(local, local, Some(public), false, true, false);
        assert_eq!(exposed.iter().map(|e| e.0).collect::<Vec<_>>(), ["etcd"]);
    }

    use super::*;

    #[test]
    fn watch_bounds_must_admit_something() {
        assert_eq!(at_least_one("4096"), Ok(4096));
        let zero = at_least_one("0").expect_err("refused");
        assert!(zero.contains("at least 1"), "{zero}");
        assert!(at_least_one("-1").is_err());
    }

    #[test]
    fn parses_initial_cluster() {
        let members = parse_cluster("1=a:1/a:2, 2=b:1/b:2").expect("valid");
        assert_eq!(members.len(), 2);
        assert_eq!(members[&2].client_address, "b:2");
        assert!(parse_cluster("1=a:1").is_err());
        assert!(parse_cluster("x=a:1/a:2").is_err());
        assert!(parse_cluster("0=a:1/a:2").is_err());
        assert!(parse_cluster("1=a:1/a:2,1=b:1/b:2").is_err());
        assert!(parse_cluster("").is_err());
    }
}

//! One simulated run: three oncekv nodes on four hosts (one spare, for
//! the members that join) and a client host on a turmoil network in
//! simulated time; the workload of `oncekv verify` through its recording
//! proxies; the seeded fault plan applied between simulation steps; and
//! the checkers' verdict. Disk I/O is real (files in a temp dir, on tmpfs
//! where there is one) but done inline on the node's task, so each step
//! runs to completion inside simulated time.
//!
//! Faults act on turmoil's network and hosts (crash, partition, message
//! loss) or on the recording proxies (dropped replies, lost connections).
//! A lose-connections window does both: the proxies break the client
//! connection of the first committed reply, and at the next step, before
//! the client can try again, the clients are cut off the node that
//! answered it, until the window ends. A membership change is ordered to
//! the changes ([`crate::membership`]), which run on the client host and
//! ask the driver to start, stop, cut off or let back a host; its window
//! lasts until the change reports, and at least as long as planned. A
//! window that could no longer end within the workload (after a change
//! took longer than planned) is left out.
//!
//! The verdict is the checkers' with coverage ([`requirements`]), less a
//! pass for each proof a membership change of the plan did not give (the
//! run is then inconclusive), and a failure for each disruption by a
//! removed member.

use crate::membership::{self, ChangeReport, Changes, Control, HostAction, Hosts, Proof};
use crate::net::{LinkLoss, SimConnector, incoming};
use crate::plan::{GAP_MS, SimFault, Window, plan};
use oncekv_check::coverage::{CoverageRequirements, RunVerdict, Shortfall};
use oncekv_check::record::{FaultId, FaultKind, NodeId, Record, RecordError};
use oncekv_check::report::Report;
use oncekv_check::verify::{Verification, VerifyConfig, verify};
use oncekv_client::{Client, ClientOptions, RandomSource};
use oncekv_harness::client_proxy::{ClientProxy, ReplyFault};
use oncekv_harness::recorder::Recorder;
use oncekv_harness::run::watch_leader;
use oncekv_harness::watchers;
use oncekv_harness::workload::{self, ClientMode, WorkloadOptions};
use oncekv_server::node::NodeOptions;
use oncekv_server::raft::consensus::ConsensusOptions;
use oncekv_server::raft::peer_token::PeerToken;
use oncekv_server::raft::runtime::seed_thread_rng;
use oncekv_server::raft::type_config::NodeInfo;
use oncekv_server::server::{ServerConfig, serve};
use oncekv_state::Limits;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use turmoil::net::TcpListener;

/// Nodes in the simulated cluster (voters, at the start and after every
/// membership change).
pub const NODES: u64 = 3;
/// Hosts a node may run on: one more than [`NODES`], for the member that
/// joins before another leaves.
pub const HOSTS: u64 = NODES + 1;
/// A node takes a snapshot after this many entries since its last one.
pub const SNAPSHOT_AFTER_ENTRIES: u64 = 300;
/// Entries a node keeps in its log behind a snapshot: a node that needs
/// earlier ones (a new member, a follower back from a long crash) is sent
/// the snapshot.
pub const LOG_ENTRIES_KEPT: u64 = 100;
const CLIENT_PORT: u16 = 7000;
const PEER_PORT: u16 = 7001;
/// The simulated cluster's shared peer secret (a fixed one: the run is a
/// function of its seed).
const SIM_PEER_TOKEN: &[u8] = b"oncekv-sim peer token, fixed so seeds replay";
const PROXY_PORT_BASE: u16 = 8000;
const CLIENT_HOST: &str = "clients";
/// How long the cluster may take to elect its first leader.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The nodes' longest election timeout, in milliseconds.
const ELECTION_TIMEOUT_MAX_MS: u64 = 800;
/// How long the clients wait, once the workload stopped, for a membership
/// change still being made.
const CHANGE_PATIENCE: Duration = Duration::from_secs(120);

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Seeds the network, the fault plan and the workload.
    pub seed: u64,
    /// Simulated time the workload runs (faults happen within it).
    pub length: Duration,
    /// Concurrent clients (an expiry probe runs besides them).
    pub clients: usize,
    /// Whether nodes deduplicate (off only for the negative control).
    pub dedup: bool,
    /// Whether faults are injected.
    pub faults: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            seed: 0,
            length: Duration::from_secs(42),
            clients: 4,
            dedup: true,
            faults: true,
        }
    }
}

/// How a run ended.
#[derive(Debug)]
pub struct SimOutcome {
    /// The seed.
    pub seed: u64,
    /// The history.
    pub record: Record,
    /// The checkers' verdicts and the report.
    pub verification: Verification,
    /// The faults injected and the membership changes' steps and proofs,
    /// described, one line each.
    pub faults: Vec<String>,
    /// Simulated time in all.
    pub simulated: Duration,
    /// Simulation steps taken.
    pub steps: u64,
    /// A digest of the whole history: equal for every run of one seed as
    /// the first simulation of a process (see [`simulate`]).
    pub digest: u64,
    /// How each membership change went.
    pub changes: Vec<ChangeReport>,
}

impl SimOutcome {
    /// Pass, fail or inconclusive.
    pub fn verdict(&self) -> RunVerdict {
        self.verification.report.verdict()
    }
}

/// Why a run could not reach a verdict.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A host's software failed (a node stopped on its own, or the clients
    /// could not finish).
    #[error("at {at:?} of simulated time: {message}")]
    Host {
        /// When.
        at: Duration,
        /// What the host returned.
        message: String,
    },
    /// The history does not fold into a record.
    #[error("the run's history is inconsistent: {0}")]
    Record(#[from] RecordError),
    /// Temp dirs could not be made.
    #[error("setting up: {0}")]
    Setup(#[from] std::io::Error),
}

/// What the driver and the hosts share.
#[derive(Debug)]
struct Shared {
    /// Breaks connections between hosts while messages are lost.
    loss: Arc<LinkLoss>,
    /// The latest leader seen (0: none yet).
    leader: Arc<AtomicU64>,
    /// When the workload started, in simulated time.
    started: Mutex<Option<Duration>>,
    /// The proxy in front of each host, once started.
    proxies: Mutex<Vec<ClientProxy>>,
    /// Which node runs on which host.
    hosts: Arc<Hosts>,
    /// Membership changes ordered and reported.
    control: Arc<Control>,
}

use oncekv_server::sync::lock;

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The name of host `host` (1-based) on the simulated network.
fn host_name(host: u64) -> String {
    format!("n{host}")
}

/// The addresses of the node on host `host`.
fn host_info(host: u64) -> NodeInfo {
    NodeInfo {
        peer_address: format!("{}:{PEER_PORT}", host_name(host)),
        client_address: format!("{}:{CLIENT_PORT}", host_name(host)),
    }
}

/// Node `id`'s data directory on host `host`.
fn data_dir(root: &Path, host: u64, id: NodeId) -> std::path::PathBuf {
    root.join(format!("{}-node{id}", host_name(host)))
}

/// Host `host` as reports name it: with its node, when that is not the
/// node it started with.
fn describe_host(hosts: &Hosts, host: u64) -> String {
    match hosts.occupant(host) {
        Some(id) if id != host => format!("{} (node {id})", host_name(host)),
        _ => host_name(host),
    }
}

/// The configuration of node `id` on host `host`: one of the first
/// [`NODES`] (each on the host of its number) forms the cluster; any
/// other waits to be added.
fn node_config(
    host: u64,
    id: NodeId,
    root: &Path,
    dedup: bool,
    connector: SimConnector,
) -> ServerConfig {
    ServerConfig {
        id,
        data_dir: data_dir(root, host, id),
        advertise: host_info(host),
        initial_cluster: (id <= NODES).then(|| (1..=NODES).map(|id| (id, host_info(id))).collect()),
        limits: Limits::default(),
        consensus: ConsensusOptions {
            heartbeat_ms: 50,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_MS,
            snapshot_after_entries: SNAPSHOT_AFTER_ENTRIES,
            snapshot_after_bytes: ConsensusOptions::default().snapshot_after_bytes,
            log_entries_kept_after_snapshot: LOG_ENTRIES_KEPT,
            ..ConsensusOptions::default()
        },
        node: NodeOptions {
            propose_timeout: Duration::from_secs(2),
            tick_interval: Duration::from_millis(100),
            ..NodeOptions::default()
        },
        client_message_bytes_max: 4 * 1024 * 1024,
        server_limits: oncekv_server::server::ServerLimits::DEFAULT,
        metrics: None,
        etcd_listener: None,
        etcd_version: oncekv_server::grpc::etcd::ETCD_VERSION.to_string(),
        peer_source_ip: None,
        peer_connector: Some(Arc::new(connector)),
        client_tls: None,
        peer_tls: None,
        // The simulated peers authenticate as real ones do: every peer
        // call carries the cluster's token, checked before it is read.
        peer_token: Some(PeerToken::from_secret(SIM_PEER_TOKEN)),
        inline_disk_io: true,
        dedup,
    }
}

/// The clients' random draws (backoff jitter, idempotency keys) from the
/// run's seed.
#[derive(Debug)]
struct SeededRandom(Mutex<StdRng>);

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> u64 {
        lock(&self.0).random()
    }
}

/// The workload's client options ([`workload::client_options`]) over the
/// simulated network, with random draws from `seed`.
fn client_options(seed: u64, connector: &SimConnector) -> ClientOptions {
    ClientOptions {
        random: Arc::new(SeededRandom(Mutex::new(StdRng::seed_from_u64(seed)))),
        connector: Arc::new(connector.clone()),
        ..workload::client_options()
    }
}

/// The leader of the highest term any node reports.
async fn observe_leader(client: &Client, addresses: &[String]) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    for address in addresses {
        if let Ok(status) = client.status(Some(address)).await
            && let Some(leader) = status.leader_id
            && best.is_none_or(|(_, term)| status.term > term)
        {
            best = Some((leader, status.term));
        }
    }
    best
}

/// The client host: proxies in front of the nodes, the workload through
/// them, then the final reads.
async fn run_clients(
    options: SimOptions,
    recorder: Arc<Recorder>,
    shared: Arc<Shared>,
) -> turmoil::Result {
    let own_ip = turmoil::lookup(CLIENT_HOST);
    let connector = SimConnector::new(shared.loss.clone());
    // Every host, the spare included: the clients find a node that joins
    // there where they find the others.
    let nodes: Vec<String> = (1..=HOSTS)
        .map(|host| host_info(host).client_address)
        .collect();
    let proxy_addresses: Vec<SocketAddr> = (1..=HOSTS)
        .map(|host| SocketAddr::new(own_ip, PROXY_PORT_BASE + host as u16))
        .collect();
    let hints: Arc<HashMap<String, String>> = Arc::new(
        nodes
            .iter()
            .zip(&proxy_addresses)
            .map(|(node, proxy)| (node.clone(), proxy.to_string()))
            .collect(),
    );
    let mut proxies = Vec::new();
    for (index, address) in proxy_addresses.iter().enumerate() {
        let host = index as u64 + 1;
        let listener = TcpListener::bind(("0.0.0.0", address.port())).await?;
        proxies.push(ClientProxy::serve(
            *address,
            incoming(listener, own_ip, shared.loss.clone()),
            shared.hosts.occupant(host),
            connector.channel_to(&nodes[index])?,
            hints.clone(),
            recorder.clone(),
            options.seed ^ host.wrapping_mul(0xa076_1d64_78bd_642f),
        ));
    }
    *lock(&shared.proxies) = proxies;

    let observer = Client::connect(nodes.clone(), client_options(options.seed ^ 1, &connector))?;
    let first = loop {
        if let Some(found) = observe_leader(&observer, &nodes).await {
            break found;
        }
        if turmoil::elapsed() > STARTUP_TIMEOUT {
            return Err(format!("no leader within {STARTUP_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    shared.leader.store(first.0, Ordering::Relaxed);
    let description = format!(
        "simulation: {} nodes, {} clients, {:?} of faults{}",
        NODES,
        options.clients,
        options.length,
        if options.dedup {
            ""
        } else {
            ", dedup OFF (negative control)"
        }
    );
    recorder.run_started(options.seed, (1..=NODES).collect(), description);
    let started = turmoil::sim_elapsed().unwrap_or_default();
    // The membership changes the driver orders, made from here.
    let changes = Changes::new(membership::Setup {
        client_addresses: nodes.clone(),
        peer_addresses: (1..=HOSTS)
            .map(|host| host_info(host).peer_address)
            .collect(),
        connector: connector.clone(),
        client_options: ClientOptions {
            // Adding a member waits until it caught up.
            attempt_timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(10),
            ..client_options(options.seed ^ 4, &connector)
        },
        hosts: shared.hosts.clone(),
        recorder: recorder.clone(),
        started,
        seed: options.seed,
        election_timeout: Duration::from_millis(ELECTION_TIMEOUT_MAX_MS),
        log_kept: LOG_ENTRIES_KEPT,
        first_new_id: NODES + 1,
    })?;
    let changing = tokio::spawn(changes.serve(shared.control.clone()));
    *lock(&shared.started) = Some(started);

    let (stop_tx, stop) = watch::channel(false);
    // Leaders are observed until the very end, not only while the workload
    // runs: a leader crashed in the last window is replaced after it.
    let (stop_watching_tx, stop_watching) = watch::channel(false);
    let (watching, addresses) = (observer.clone(), nodes.clone());
    let watcher = tokio::spawn(watch_leader(
        move || {
            let (client, addresses) = (watching.clone(), addresses.clone());
            async move { observe_leader(&client, &addresses).await }
        },
        recorder.clone(),
        shared.leader.clone(),
        stop_watching,
    ));
    let workload_options = WorkloadOptions {
        clients: options.clients,
        mode: ClientMode::Session,
        seed: options.seed,
        ..WorkloadOptions::default()
    };
    let endpoints: Vec<String> = proxy_addresses.iter().map(ToString::to_string).collect();
    let clients = workload::start(
        &endpoints,
        client_options(options.seed, &connector),
        &workload_options,
        recorder.clone(),
        stop,
    )?;
    // Watchers of the accounts through the faults, from revision 1.
    let (watchers_stop_tx, watchers_stop) = watch::channel(false);
    let watcher_tasks = watchers::start(
        &endpoints,
        client_options(options.seed ^ 2, &connector),
        workload_options.accounts_prefix(),
        1,
        workload_options.watchers,
        recorder.clone(),
        watchers_stop,
    )?;
    tokio::time::sleep(options.length).await;
    let _ = stop_tx.send(true);
    let patience = workload_options.grace + Duration::from_secs(10);
    for client in clients {
        let _ = tokio::time::timeout(patience, client).await;
    }
    // A membership change that outlasted the workload completes before
    // the final reads.
    let waited = tokio::time::Instant::now();
    while !shared.control.idle() && waited.elapsed() < CHANGE_PATIENCE {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    changing.abort();
    // Let everything committed apply everywhere before reading.
    tokio::time::sleep(Duration::from_millis(500)).await;
    workload::record_final_values(
        &observer,
        &workload_options.final_keys(),
        &recorder,
        Duration::from_secs(30),
    )
    .await?;
    // The accounts the transfers move money between, in one transaction.
    workload::record_final_balances(
        &observer,
        &workload_options,
        &recorder,
        Duration::from_secs(30),
    )
    .await?;
    // The committed changes the watchers are judged by.
    let _ = watchers_stop_tx.send(true);
    for task in watcher_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    watchers::reference(
        &nodes,
        client_options(options.seed ^ 3, &connector),
        workload_options.accounts_prefix(),
        1,
        workload_options.watchers as u64 + 1,
        &recorder,
        Duration::from_secs(30),
    )
    .await?;
    let _ = stop_watching_tx.send(true);
    let _ = watcher.await;
    Ok(())
}

/// A window in force: what to undo, and its id in the history.
struct Active {
    /// Its index in the plan.
    index: usize,
    window: Window,
    /// When it ends (later than planned if it started late), in time since
    /// the workload started.
    end: Duration,
    /// The host it hits (0: none, for a membership change).
    host: u64,
    /// Its fault in the history (a membership change records its steps).
    id: Option<FaultId>,
    /// A lose-connections window: what follows the lost connection.
    lost: Option<LostConnection>,
}

/// A lose-connections window in force.
enum LostConnection {
    /// No connection lost yet: each proxy's count of lost connections when
    /// the window started.
    Armed(Vec<u64>),
    /// The clients cut off `host` (whose node answered the lost reply) as
    /// the fault `id` of the history.
    Cut { host: u64, id: FaultId },
}

fn kind_of(fault: SimFault) -> FaultKind {
    match fault {
        SimFault::Crash => FaultKind::Kill,
        SimFault::Isolate | SimFault::CutClients => FaultKind::Partition,
        SimFault::DropReplies => FaultKind::DropReplies,
        SimFault::LoseConnections => FaultKind::Reset,
        SimFault::MessageLoss => FaultKind::MessageLoss,
        SimFault::TransferLeader => FaultKind::LeaderTransfer,
        SimFault::AddLearner
        | SimFault::RemoveFollower
        | SimFault::RemoveLeader
        | SimFault::Replace => FaultKind::Other,
    }
}

/// Share of writes between hosts that break their connection while
/// messages are lost (see [`LinkLoss`]).
const MESSAGE_LOSS_RATE: f64 = 0.01;

/// Every host but `host`.
fn other_hosts(host: u64) -> impl Iterator<Item = String> {
    (1..=HOSTS)
        .filter(move |other| *other != host)
        .map(host_name)
}

/// Every host but `host`, and the client host.
fn others(host: u64) -> impl Iterator<Item = String> {
    other_hosts(host).chain(std::iter::once(CLIENT_HOST.to_string()))
}

/// Sets `fault` on the proxy in front of every host.
fn set_reply_fault(shared: &Shared, fault: ReplyFault) {
    for proxy in lock(&shared.proxies).iter() {
        proxy.set_fault(fault);
    }
}

/// Tells the proxy in front of `host` which node is behind it.
fn name_proxy(shared: &Shared, host: u64, node: Option<NodeId>) {
    let index = usize::try_from(host.saturating_sub(1)).unwrap_or(usize::MAX);
    if let Some(proxy) = lock(&shared.proxies).get(index) {
        proxy.set_node(node);
    }
}

/// How many connections each proxy has lost, in host order.
fn connections_lost(shared: &Shared) -> Vec<u64> {
    lock(&shared.proxies)
        .iter()
        .map(ClientProxy::connections_lost)
        .collect()
}

/// The host whose proxy lost a connection since `before`, if one did.
fn lost_at(shared: &Shared, before: &[u64]) -> Option<u64> {
    let now = connections_lost(shared);
    let index = now
        .iter()
        .zip(before)
        .position(|(now, before)| now > before)?;
    u64::try_from(index + 1).ok()
}

/// The host `window` hits: the leader's, if it hits the leader and one is
/// known; else the `window.node`-th (cyclic) of the hosts running a node.
fn target_host(shared: &Shared, window: Window) -> u64 {
    let leader = shared.leader.load(Ordering::Relaxed);
    if window.on_leader
        && leader != 0
        && let Some(host) = shared.hosts.host_of(leader)
    {
        return host;
    }
    let occupied = shared.hosts.occupied();
    let count = occupied.len().max(1) as u64;
    let index = usize::try_from(window.node.saturating_sub(1) % count).unwrap_or(0);
    occupied.get(index).map_or(window.node, |(host, _)| *host)
}

/// Injects the fault of `window` (not a membership change); the host it
/// hit and what it did.
fn inject(sim: &mut turmoil::Sim<'_>, shared: &Shared, window: Window) -> (u64, String) {
    let host = target_host(shared, window);
    let name = host_name(host);
    let described = describe_host(&shared.hosts, host);
    let detail = match window.fault {
        SimFault::Crash => {
            sim.crash(name.as_str());
            format!("crash {described}")
        }
        SimFault::Isolate => {
            for other in others(host) {
                sim.partition(name.as_str(), other.as_str());
            }
            format!("isolate {described}")
        }
        SimFault::CutClients => {
            sim.partition(name.as_str(), CLIENT_HOST);
            format!("cut {CLIENT_HOST} from {described}")
        }
        SimFault::DropReplies => {
            // On every proxy: the leader may change inside the window, and
            // only a leader's replies are committed ones.
            set_reply_fault(shared, ReplyFault::Drop { probability: 0.5 });
            format!("drop half the committed replies (leader {described} at the start)")
        }
        SimFault::LoseConnections => {
            // On every proxy, for the same reason; the first loss ends it
            // (see `cut_after_loss`).
            set_reply_fault(shared, ReplyFault::LoseConnection { probability: 1.0 });
            format!(
                "lose the connection of the next committed reply, then cut {CLIENT_HOST} \
                 from its node (leader {described} at the start)"
            )
        }
        SimFault::MessageLoss => {
            shared.loss.set_rate(MESSAGE_LOSS_RATE);
            format!("break connections between hosts on {MESSAGE_LOSS_RATE} of writes")
        }
        SimFault::TransferLeader
        | SimFault::AddLearner
        | SimFault::RemoveFollower
        | SimFault::RemoveLeader
        | SimFault::Replace => format!("{} (ordered to the membership changes)", window.fault),
    };
    (host, detail)
}

/// In a lose-connections window, once a proxy lost a connection: the
/// clients cut off its host, and no more connections lost.
fn cut_after_loss(
    sim: &mut turmoil::Sim<'_>,
    shared: &Shared,
    recorder: &Recorder,
    lost: &mut Option<LostConnection>,
) -> Option<String> {
    let Some(LostConnection::Armed(before)) = lost.as_ref() else {
        return None;
    };
    let host = lost_at(shared, before)?;
    set_reply_fault(shared, ReplyFault::None);
    sim.partition(host_name(host).as_str(), CLIENT_HOST);
    let detail = format!(
        "cut {CLIENT_HOST} from {}, which lost a connection after commit",
        describe_host(&shared.hosts, host)
    );
    let node = shared.hosts.occupant(host);
    let id = recorder.fault_started(FaultKind::Partition, node, Some(detail.clone()));
    *lost = Some(LostConnection::Cut { host, id });
    Some(detail)
}

fn heal(sim: &mut turmoil::Sim<'_>, shared: &Shared, recorder: &Recorder, active: &Active) {
    let name = host_name(active.host);
    match active.window.fault {
        SimFault::Crash => sim.bounce(name.as_str()),
        SimFault::Isolate => {
            for other in others(active.host) {
                sim.repair(name.as_str(), other.as_str());
            }
        }
        SimFault::CutClients => sim.repair(name.as_str(), CLIENT_HOST),
        SimFault::DropReplies => set_reply_fault(shared, ReplyFault::None),
        SimFault::LoseConnections => {
            set_reply_fault(shared, ReplyFault::None);
            if let Some(LostConnection::Cut { host, id }) = &active.lost {
                sim.repair(host_name(*host).as_str(), CLIENT_HOST);
                recorder.fault_ended(*id);
            }
        }
        SimFault::MessageLoss => shared.loss.set_rate(0.0),
        // A membership change undoes nothing: it ends with three voters.
        SimFault::TransferLeader
        | SimFault::AddLearner
        | SimFault::RemoveFollower
        | SimFault::RemoveLeader
        | SimFault::Replace => {}
    }
}

/// Takes a host action a membership change asked for.
fn act(sim: &mut turmoil::Sim<'_>, shared: &Shared, root: &Path, action: HostAction) {
    match action {
        HostAction::Start { host, id } => {
            shared.hosts.set_occupant(host, Some(id));
            // The host's software starts again, now with node `id`.
            sim.bounce(host_name(host).as_str());
            name_proxy(shared, host, Some(id));
        }
        HostAction::Stop { host } => {
            let stopped = shared.hosts.set_occupant(host, None);
            // Every task of the host dropped; it starts again empty.
            sim.bounce(host_name(host).as_str());
            name_proxy(shared, host, None);
            if let Some(id) = stopped {
                let _ = std::fs::remove_dir_all(data_dir(root, host, id));
            }
        }
        HostAction::Isolate { host } => {
            for other in other_hosts(host) {
                sim.partition(host_name(host).as_str(), other.as_str());
            }
        }
        HostAction::Rejoin { host } => {
            for other in other_hosts(host) {
                sim.repair(host_name(host).as_str(), other.as_str());
            }
        }
    }
}

/// What a run must show, given the windows of its plan.
#[derive(Clone, Debug)]
pub struct Requirements {
    /// What the history must have exercised.
    pub coverage: CoverageRequirements,
    /// For each membership change of the plan (by its index there), the
    /// proofs that it completed.
    pub changes: Vec<(usize, Window, Vec<Proof>)>,
}

/// The proofs a membership change of `window` must give.
pub fn proofs_required(window: &Window) -> Vec<Proof> {
    match window.fault {
        SimFault::TransferLeader => vec![Proof::Transferred],
        SimFault::AddLearner => vec![
            Proof::FromSnapshot,
            Proof::CaughtUp,
            Proof::Promoted,
            Proof::Removed,
            Proof::HeldOff,
        ],
        SimFault::RemoveFollower => vec![
            Proof::Removed,
            Proof::HeldOff,
            Proof::CaughtUp,
            Proof::Promoted,
        ],
        SimFault::RemoveLeader => vec![
            Proof::Removed,
            Proof::Succeeded,
            Proof::HeldOff,
            Proof::CaughtUp,
            Proof::Promoted,
        ],
        SimFault::Replace if window.on_leader => vec![
            Proof::Succeeded,
            Proof::Removed,
            Proof::CaughtUp,
            Proof::Promoted,
        ],
        SimFault::Replace => vec![Proof::Removed, Proof::CaughtUp, Proof::Promoted],
        SimFault::Crash
        | SimFault::Isolate
        | SimFault::CutClients
        | SimFault::DropReplies
        | SimFault::LoseConnections
        | SimFault::MessageLoss => Vec::new(),
    }
}

/// What a run must have exercised, given the windows of its plan: paths
/// and fault kinds in the history, and for each membership change the
/// proofs that it completed.
pub fn requirements(windows: &[Window]) -> Requirements {
    let mut required = CoverageRequirements::none();
    required.min_acknowledged = 1;
    required.min_session_expiries = 1;
    required.min_batched_attempts = 1;
    let has = |fault: SimFault| windows.iter().any(|w| w.fault == fault);
    if has(SimFault::DropReplies) {
        required.min_replies_dropped_after_commit = 1;
        required.min_replayed = 1;
    }
    if has(SimFault::LoseConnections) {
        required.min_replies_dropped_after_commit = 1;
    }
    if has(SimFault::Crash) || has(SimFault::TransferLeader) || has(SimFault::RemoveLeader) {
        required.min_leader_changes = 1;
    }
    let kinds: BTreeMap<FaultKind, u64> = windows.iter().map(|w| (kind_of(w.fault), 1)).collect();
    required.min_faults = kinds;
    let changes = windows
        .iter()
        .enumerate()
        .filter(|(_, window)| window.fault.changes_membership())
        .map(|(index, window)| (index, *window, proofs_required(window)))
        .collect();
    Requirements {
        coverage: required,
        changes,
    }
}

/// Amends `report`'s verdict with the membership changes: a proof
/// `required` that a change did not give is a shortfall (a pass becomes
/// inconclusive), a disruption by a removed member a failure.
fn judge_changes(report: &mut Report, required: &Requirements, changes: &[ChangeReport]) {
    let assessment = &mut report.assessment;
    let mut short = false;
    for (index, window, proofs) in &required.changes {
        let change = changes.iter().find(|change| change.index == *index);
        let at = window.start.as_secs_f64();
        for proof in proofs {
            if change.is_some_and(|change| change.proofs.contains_key(proof)) {
                continue;
            }
            let shortfall = Shortfall {
                what: format!("{} (planned at {at:.1}s): {proof}", window.fault),
                required: 1,
                observed: 0,
            };
            assessment
                .reasons
                .push(format!("coverage not reached: {shortfall}"));
            assessment.shortfalls.push(shortfall);
            short = true;
        }
        match change {
            None => assessment.reasons.push(format!(
                "{} (planned at {at:.1}s) was not made",
                window.fault
            )),
            Some(ChangeReport {
                failure: Some(failure),
                ..
            }) => assessment.reasons.push(format!(
                "{} (planned at {at:.1}s) did not complete: {failure}",
                window.fault
            )),
            Some(_) => {}
        }
    }
    let disruptions: Vec<&String> = changes
        .iter()
        .flat_map(|change| &change.disruptions)
        .collect();
    for disruption in &disruptions {
        assessment.reasons.push(format!(
            "a removed member disrupted the cluster: {disruption}"
        ));
    }
    if !disruptions.is_empty() {
        assessment.verdict = RunVerdict::Fail;
    } else if short && assessment.verdict == RunVerdict::Pass {
        assessment.verdict = RunVerdict::Inconclusive;
    }
}

fn data_root() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix("oncekv-sim-");
    if shm.is_dir() {
        // tmpfs: a sync costs nothing, and the simulation does not wait on
        // a real disk.
        if let Ok(dir) = builder.tempdir_in(shm) {
            return Ok(dir);
        }
    }
    builder.tempdir()
}

/// Runs one simulation to its verdict.
///
/// The run is a function of `options` and of what the async runtime keeps
/// per process: tokio numbers tasks process-wide, and the numbers decide,
/// for one, the order in which a crashed host's tasks are dropped. The
/// first run in a process is therefore the same every time; a later run in
/// the same process may take another history, which is why `oncekv-sim`
/// gives every seed a process of its own.
pub fn simulate(options: &SimOptions) -> Result<SimOutcome, SimError> {
    let root = data_root()?;
    // Every host runs on this thread: seed what openraft draws here, and
    // the sessions' secrets.
    seed_thread_rng(Some(options.seed));
    let outcome = run(options, root.path());
    seed_thread_rng(None);
    outcome
}

fn run(options: &SimOptions, root: &Path) -> Result<SimOutcome, SimError> {
    let driver_ns = Arc::new(AtomicU64::new(0));
    let clock_ns = driver_ns.clone();
    let recorder = Arc::new(Recorder::with_clock(Arc::new(move || {
        turmoil::sim_elapsed().map_or_else(|| clock_ns.load(Ordering::Relaxed), nanos)
    })));
    let first_nodes: Vec<NodeId> = (1..=NODES).collect();
    let shared = Arc::new(Shared {
        loss: LinkLoss::new(options.seed),
        leader: Arc::default(),
        started: Mutex::default(),
        proxies: Mutex::default(),
        hosts: Hosts::new(HOSTS, &first_nodes),
        control: Control::new(),
    });
    let mut sim = turmoil::Builder::new()
        .rng_seed(options.seed)
        .simulation_duration(options.length * 3 + Duration::from_secs(120))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(5))
        .tcp_capacity(4096)
        .enable_random_order()
        .build();
    for host in 1..=HOSTS {
        let (hosts, loss, root, dedup) = (
            shared.hosts.clone(),
            shared.loss.clone(),
            root.to_path_buf(),
            options.dedup,
        );
        // Run again on every restart: whatever node the host has then (a
        // host without one runs nothing, and refuses connections).
        sim.host(host_name(host).as_str(), move || {
            let config = hosts
                .occupant(host)
                .map(|id| node_config(host, id, &root, dedup, SimConnector::new(loss.clone())));
            let loss = loss.clone();
            async move {
                let Some(config) = config else {
                    std::future::pending::<()>().await;
                    return Ok(());
                };
                let own = turmoil::lookup(host_name(host));
                let client = TcpListener::bind(("0.0.0.0", CLIENT_PORT)).await?;
                let peer = TcpListener::bind(("0.0.0.0", PEER_PORT)).await?;
                serve(
                    config,
                    incoming(client, own, loss.clone()),
                    incoming(peer, own, loss),
                    std::future::pending(),
                )
                .await?;
                Ok(())
            }
        });
    }
    sim.client(
        CLIENT_HOST,
        run_clients(options.clone(), recorder.clone(), shared.clone()),
    );

    let windows = if options.faults {
        plan(options.seed, options.length, NODES)
    } else {
        Vec::new()
    };
    let mut next = 0;
    let mut active: Option<Active> = None;
    // The next window starts no sooner than the shortest quiet gap after
    // the last one ended.
    let mut quiet_until = Duration::ZERO;
    let mut faults = Vec::new();
    let mut steps = 0;
    loop {
        let now = sim.elapsed();
        driver_ns.store(nanos(now), Ordering::Relaxed);
        for (ticket, action) in shared.hosts.take_asked() {
            act(&mut sim, &shared, root, action);
            shared.hosts.acted(ticket);
        }
        let started = *lock(&shared.started);
        if let Some(started) = started {
            let t = now.saturating_sub(started);
            let control = &shared.control;
            if let Some(current) = active.take_if(|a| {
                t >= a.end && (!a.window.fault.changes_membership() || control.finished(a.index))
            }) {
                heal(&mut sim, &shared, &recorder, &current);
                if let Some(id) = current.id {
                    recorder.fault_ended(id);
                }
                if current.window.fault == SimFault::MessageLoss {
                    faults.push(format!(
                        "{:>6.1}s       {} connections broken so far",
                        t.as_secs_f64(),
                        shared.loss.broken()
                    ));
                }
                if let Some(change) = control
                    .reports()
                    .into_iter()
                    .find(|change| change.index == current.index)
                {
                    faults.extend(change.lines);
                }
                quiet_until = t + Duration::from_millis(GAP_MS.start);
            }
            if let Some(current) = active.as_mut()
                && let Some(detail) =
                    cut_after_loss(&mut sim, &shared, &recorder, &mut current.lost)
            {
                faults.push(format!("{:>6.1}s       {detail}", t.as_secs_f64()));
            }
            // Bounded: each turn takes a window of the plan.
            while active.is_none()
                && t >= quiet_until
                && let Some(&window) = windows.get(next).filter(|w| t >= w.start)
            {
                let index = next;
                next += 1;
                let span = window.end - window.start;
                if t + span > options.length {
                    faults.push(format!(
                        "{:>6.1}s +{:.1}s {} left out: planned at {:.1}s, it could no longer \
                         end within the workload",
                        t.as_secs_f64(),
                        span.as_secs_f64(),
                        window.fault,
                        window.start.as_secs_f64()
                    ));
                    continue;
                }
                let (host, id) = if window.fault.changes_membership() {
                    shared.control.order(membership::Order { index, window });
                    (0, None)
                } else {
                    let (host, detail) = inject(&mut sim, &shared, window);
                    faults.push(format!(
                        "{:>6.1}s +{:.1}s {detail}",
                        t.as_secs_f64(),
                        span.as_secs_f64()
                    ));
                    let node = shared.hosts.occupant(host);
                    let id = recorder.fault_started(kind_of(window.fault), node, Some(detail));
                    (host, Some(id))
                };
                let lost = (window.fault == SimFault::LoseConnections)
                    .then(|| LostConnection::Armed(connections_lost(&shared)));
                active = Some(Active {
                    index,
                    window,
                    end: t + span,
                    host,
                    id,
                    lost,
                });
            }
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => steps += 1,
            Err(error) => {
                return Err(SimError::Host {
                    at: sim.elapsed(),
                    message: error.to_string(),
                });
            }
        }
    }
    let changes = shared.control.reports();
    if let Some(current) = active.take() {
        if let Some(LostConnection::Cut { id, .. }) = current.lost {
            recorder.fault_ended(id);
        }
        if let Some(id) = current.id {
            recorder.fault_ended(id);
        }
        if let Some(change) = changes.iter().find(|c| c.index == current.index) {
            faults.extend(change.lines.iter().cloned());
        }
    }
    let events = recorder.events();
    let digest = {
        let mut hasher = std::hash::DefaultHasher::new();
        format!("{events:?}").hash(&mut hasher);
        hasher.finish()
    };
    let record = Record::from_events(events)?;
    let required = requirements(&windows);
    let mut verification = verify(
        &record,
        &VerifyConfig {
            coverage: required.coverage.clone(),
            ..VerifyConfig::default()
        },
    );
    judge_changes(&mut verification.report, &required, &changes);
    Ok(SimOutcome {
        seed: options.seed,
        record,
        verification,
        faults,
        simulated: sim.elapsed(),
        steps,
        digest,
        changes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::LOSE_CONNECTIONS_SPAN_MS;

    #[test]
    fn a_lose_connections_window_outlasts_two_client_deadlines() {
        // The call whose connection was lost, and then the call sending its
        // request again, must both run out of time while the leader is out
        // of reach.
        let deadline = workload::client_options().deadline;
        let shortest = Duration::from_millis(LOSE_CONNECTIONS_SPAN_MS.start);
        assert!(
            shortest > deadline * 2,
            "{shortest:?} is not more than two deadlines of {deadline:?}"
        );
    }
}

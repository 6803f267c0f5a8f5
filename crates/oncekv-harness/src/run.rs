//! [`run`]: one live fault run, start to verdict. It starts a local cluster
//! behind peer proxies ([`Cluster::start_partitionable`], from the binary
//! it is given), or with each node a host of its own (the netns topology,
//! [`crate::netns`]: then the whole run, from the cluster's start, runs on
//! a thread of its own in the clients' namespace, with a tokio runtime of
//! its own, so every client, proxy and watcher socket is there), or uses
//! an existing one, puts a fault proxy in front of
//! every node's client port, waits for a leader, runs the workload under
//! the nemesis for the given time while watching leadership (and watchers
//! follow the accounts' changes), stops, heals, reads the final values,
//! stops the watchers, reads the reference change sequence, and hands the
//! record to `oncekv-check`'s checkers, and measures the write stall of
//! each fault window ([`crate::stalls`], a table in the HTML report under
//! the timeline). A run asked for the full disk
//! gives every node a disk of its own ([`crate::disk`]), and counts a
//! node's stop on it (exit code 12) as a stop on a storage failure, not a
//! crash.

use crate::client_proxy::{ClientProxy, ProxyListener};
use crate::cluster::{Cluster, ClusterOptions, STARTUP_TIMEOUT, Topology};
use crate::disk::{DISK_SIZE, DiskOptions};
use crate::nemesis::{Fault, Nemesis, fiu_available};
use crate::peer_proxy::LinkShape;
use crate::recorder::Recorder;
use crate::stalls::{self, WindowStall};
use crate::workload::{self, ClientMode, WorkloadOptions, client_options};
use crate::{etcd_watch, etcd_workload, watchers};
use oncekv_check::coverage::CoverageRequirements;
use oncekv_check::record::{FaultKind, NodeId, Record, RecordError};
use oncekv_check::report::HtmlOptions;
use oncekv_check::verify::{Verification, VerifyConfig, verify};
use oncekv_client::Client;
use oncekv_proto::v1::StatusRequest;
use oncekv_proto::v1::kv_client::KvClient;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Where the workload runs.
#[derive(Clone, Debug)]
pub enum Target {
    /// A cluster this run starts from the `oncekv` binary.
    Local {
        /// The binary.
        binary: PathBuf,
        /// How many nodes.
        nodes: usize,
        /// Whether the nodes deduplicate (off: the negative control).
        dedup: bool,
        /// Where the nodes run.
        topology: Topology,
    },
    /// A running cluster, by client addresses (no process faults).
    Endpoints(Vec<String>),
}

/// The API the workload speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Api {
    /// oncekv's own (`workload`), with sessions, watchers and the expiry
    /// probe.
    #[default]
    Native,
    /// etcd's v3 API (`etcd_workload`): read-modify-write transactions
    /// with the idempotency metadata (or, naive, without). It runs
    /// against a real etcd too (`Target::Endpoints`).
    Etcd,
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Where.
    pub target: Target,
    /// Which API the workload speaks.
    pub api: Api,
    /// What the clients do.
    pub workload: WorkloadOptions,
    /// How long the workload runs under faults.
    pub duration: Duration,
    /// Seeds the workload and the fault schedule.
    pub seed: u64,
    /// The fault kinds to inject.
    pub faults: Vec<Fault>,
    /// Where the history and the HTML report are written, if anywhere.
    pub out_dir: Option<PathBuf>,
    /// Every peer link's delay, jitter and loss for the whole run (the
    /// cluster's peer proxies shape them, seeded by the run's seed): only
    /// on a cluster the run starts.
    pub links: LinkShape,
}

/// What the run produced.
#[derive(Debug)]
pub struct RunSummary {
    /// The recorded history.
    pub record: Record,
    /// The checkers' verdicts and the report.
    pub verification: Verification,
    /// The write stall clients saw during each fault window, from the
    /// record ([`crate::stalls`]).
    pub stalls: Vec<WindowStall>,
    /// Fault kinds asked for that could not run here, with the reason.
    pub skipped: Vec<String>,
    /// Nodes that exited on their own during the run (a crash).
    pub crashed: Vec<String>,
    /// Times a node stopped on a failed log write or sync (exit code 12),
    /// as it must under the fsync and full-disk faults.
    pub stopped_on_sync_failure: usize,
    /// The history file, if written.
    pub history: Option<PathBuf>,
    /// The HTML report, if written.
    pub html: Option<PathBuf>,
    /// The folder of node data and logs, kept when something failed.
    pub kept: Option<PathBuf>,
    /// Faults the nemesis could not make or heal (the run did not do
    /// what it was asked).
    pub nemesis_failures: Vec<String>,
    /// What removed members did that they must not (one led, or a member
    /// followed it): a violation, as a crash is.
    pub disruptions: Vec<String>,
}

/// How far a run is.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Time under load so far.
    pub elapsed: Duration,
    /// Operations completed.
    pub operations: u64,
    /// Faults injected.
    pub faults: u64,
}

/// Why a run could not produce a verdict.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The cluster would not start.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// No leader appeared.
    #[error("no leader within {within:?}{logs}")]
    NoLeader {
        /// How long the run waited.
        within: Duration,
        /// Where the node logs were kept, as a sentence, if anywhere.
        logs: String,
    },
    /// A proxy or client could not be set up.
    #[error("setting up: {0}")]
    Setup(String),
    /// The final values could not be read.
    #[error("reading the final values: {error}{logs}")]
    FinalRead {
        /// The last failure.
        error: oncekv_client::ClientError,
        /// Where the node logs were kept, as a sentence, if anywhere.
        logs: String,
    },
    /// The final values could not be read through etcd's API.
    #[error("reading the final values through etcd's API: {error}{logs}")]
    EtcdFinalRead {
        /// The last failure.
        error: String,
        /// Where the node logs were kept, as a sentence, if anywhere.
        logs: String,
    },
    /// The history does not fold.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// The exit code of a node whose storage failed (`oncekv serve`'s code 12
/// in the exit code table of `oncekv --help`).
const NODE_EXIT_STORAGE: i32 = 12;

/// The nodes' client addresses, with their ids where known.
type Nodes = Vec<(Option<NodeId>, String)>;

/// Consensus timing of the nodes a run starts.
const ELECTION_TIMEOUT: Duration = Duration::from_millis(400);

/// Slots kept for members that join, in a run that changes membership:
/// as many as it grows by at once.
const SPARE_SLOTS: usize = 2;

/// The session table of a run that floods: small enough that a flood
/// window fills it, so new sessions are refused while honest ones live on.
const FLOOD_SESSIONS_MAX: &str = "40";

fn node_flags(faults: &[Fault]) -> Vec<String> {
    let flood: &[&str] = if faults.contains(&Fault::Flood) {
        &["--sessions-max", FLOOD_SESSIONS_MAX]
    } else {
        &[]
    };
    [
        "--heartbeat",
        "50ms",
        "--election-timeout",
        "400ms",
        "--tick-interval",
        "100ms",
        "--request-timeout",
        "2s",
        "--ttl-ms-min",
        "500",
        "--snapshot-after-entries",
        "400",
        "--log-entries-kept",
        "100",
        // The watch checker needs the whole history of a run: keep far
        // more than a long run writes (its changes are small).
        "--history-events-max",
        "1000000",
        "--history-bytes-max",
        "268435456",
        "--history-retention",
        "24h",
    ]
    .iter()
    .chain(flood)
    .map(|s| (*s).to_string())
    .collect()
}

/// What the run must have exercised, given the faults it injected.
pub fn requirements(faults: &[Fault], mode: ClientMode) -> CoverageRequirements {
    requirements_for(faults, mode, Api::Native)
}

/// What a run through `api` must have exercised. Through etcd's API
/// there are no sessions to expire and no answer says "replayed" (a
/// replay is etcd's response as first given), so neither is required;
/// every other path is.
pub fn requirements_for(faults: &[Fault], mode: ClientMode, api: Api) -> CoverageRequirements {
    let mut required = CoverageRequirements::none();
    required.min_acknowledged = 1;
    // Hundreds in a short run; a batch's dropped reply is counted, not
    // required (a few in a run, by timing: `tests/batch.rs` proves that
    // path, and the simulation requires it).
    if api == Api::Native {
        required.min_batched_attempts = 1;
    }
    if faults.contains(&Fault::DropReply) {
        required.min_replies_dropped_after_commit = 1;
        if mode == ClientMode::Session && api == Api::Native {
            required.min_replayed = 1;
        }
    }
    if faults.iter().any(|f| f.disturbs_leadership()) {
        required.min_leader_changes = 1;
    }
    if mode == ClientMode::Session && api == Api::Native {
        required.min_session_expiries = 1;
    }
    let kinds: BTreeMap<FaultKind, u64> = faults.iter().map(|f| (f.kind(), 1)).collect();
    required.min_faults = kinds;
    required
}

/// How long one node gets to report its status. A node whose link is
/// down (between namespaces) does not even refuse: without a bound, one
/// connection attempt would wait for TCP's own timeout.
const STATUS_PATIENCE: Duration = Duration::from_secs(1);

/// The leader and term a node reports, if it answers and knows one.
async fn status_of(address: &str) -> Option<(NodeId, u64)> {
    let mut client = KvClient::connect(format!("http://{address}")).await.ok()?;
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(Duration::from_millis(300));
    let status = client.status(request).await.ok()?.into_inner();
    status.leader_id.map(|leader| (leader, status.term))
}

/// The leader of the highest term any node reports, through `api`: all
/// asked at once, each for at most [`STATUS_PATIENCE`].
async fn observe_leader(addresses: &[String], api: Api) -> Option<(NodeId, u64)> {
    let mut asked = tokio::task::JoinSet::new();
    for address in addresses {
        let address = address.clone();
        asked.spawn(async move {
            let status = async {
                match api {
                    Api::Native => status_of(&address).await,
                    Api::Etcd => etcd_workload::status_of(&address).await,
                }
            };
            tokio::time::timeout(STATUS_PATIENCE, status)
                .await
                .ok()
                .flatten()
        });
    }
    let mut best: Option<(NodeId, u64)> = None;
    while let Some(status) = asked.join_next().await {
        if let Ok(Some((leader, term))) = status
            && best.is_none_or(|(_, t)| term > t)
        {
            best = Some((leader, term));
        }
    }
    best
}

/// Asks `observe` for the leader and its term every 150 ms until `stop`;
/// keeps the latest leader in `leader` and records every change.
pub async fn watch_leader<F, Fut>(
    observe: F,
    recorder: Arc<Recorder>,
    leader: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<(NodeId, u64)>>,
{
    let mut last = None;
    loop {
        if let Some((id, term)) = observe().await {
            leader.store(id, Ordering::Relaxed);
            if last != Some((id, term)) {
                recorder.leader(Some(id), Some(term));
                last = Some((id, term));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(150)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The cluster a run works on, shared with the nemesis (`None` against
/// an existing cluster).
type SharedCluster = Option<Arc<Mutex<Cluster>>>;

/// Runs one fault run to its verdict; `progress` is called about four
/// times a second while the workload runs.
pub async fn run(config: &RunConfig, progress: &dyn Fn(Progress)) -> Result<RunSummary, RunError> {
    if let Target::Local {
        topology: Topology::Netns,
        ..
    } = &config.target
    {
        return run_in_namespaces(config, progress).await;
    }
    run_on(config, progress, None).await
}

/// [`run`] on the netns topology: the cluster is started (its network
/// made) on a thread of the run's own, which then enters the clients'
/// namespace and runs the rest on a tokio runtime it builds there; its
/// progress is relayed to `progress` here. The network is removed on that
/// thread when the run ends (or unwinds).
async fn run_in_namespaces(
    config: &RunConfig,
    progress: &dyn Fn(Progress),
) -> Result<RunSummary, RunError> {
    let config = config.clone();
    let (progress_tx, mut progress_rx) = watch::channel(None::<Progress>);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("oncekv-netns-run".into())
        .spawn(move || {
            let result = run_on_own_thread(&config, &progress_tx);
            let _ = done_tx.send(result);
        })
        .map_err(|e| RunError::Setup(format!("starting the run's thread: {e}")))?;
    let mut done = std::pin::pin!(done_rx);
    let mut relaying = true;
    loop {
        tokio::select! {
            result = &mut done => {
                return result.unwrap_or_else(|_| {
                    Err(RunError::Setup("the run's thread ended without a verdict".into()))
                });
            }
            changed = progress_rx.changed(), if relaying => match changed {
                Ok(()) => {
                    if let Some(now) = *progress_rx.borrow_and_update() {
                        progress(now);
                    }
                }
                Err(_) => relaying = false,
            },
        }
    }
}

/// The body of the netns run's thread (see [`run_in_namespaces`]).
fn run_on_own_thread(
    config: &RunConfig,
    progress: &watch::Sender<Option<Progress>>,
) -> Result<RunSummary, RunError> {
    let (faults, _) = runnable_faults(config);
    let Target::Local {
        binary,
        nodes,
        dedup,
        topology,
    } = &config.target
    else {
        return Err(RunError::Setup("a netns run starts its own nodes".into()));
    };
    let options = local_options(binary, *nodes, *dedup, *topology, &faults, config);
    let cluster = Cluster::start(&options)?;
    let network = cluster
        .network()
        .ok_or_else(|| RunError::Setup("the cluster has no network of its own".into()))?;
    network
        .enter_client()
        .map_err(|e| RunError::Setup(format!("entering the clients' namespace: {e}")))?;
    drop(network);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| RunError::Setup(format!("building the clients' runtime: {e}")))?;
    let report = |now: Progress| {
        progress.send_replace(Some(now));
    };
    let result = runtime.block_on(run_on(config, &report, Some(cluster)));
    // The tasks still holding the cluster go with the runtime; then the
    // cluster, and its network, are dropped.
    runtime.shutdown_timeout(Duration::from_secs(10));
    result
}

/// How long past twice its duration a run's disks' namespace is kept at
/// most (its holder's `sleep`): start-up, the last membership step, the
/// final reads and the reference read fit in it many times over.
const DISKS_MARGIN: Duration = Duration::from_secs(600);

/// The options of a cluster the run `config` starts.
fn local_options(
    binary: &std::path::Path,
    nodes: usize,
    dedup: bool,
    topology: Topology,
    faults: &[Fault],
    config: &RunConfig,
) -> ClusterOptions {
    let duration = config.duration;
    ClusterOptions {
        binary: binary.to_path_buf(),
        nodes,
        dedup,
        extra_args: node_flags(faults),
        fiu: faults.contains(&Fault::Fsync),
        log: None,
        folder_prefix: "oncekv-verify-".into(),
        tls: false,
        client_certificates: false,
        // The nodes share a token made in the run's folder.
        insecure_peers: false,
        topology,
        // A disk of its own for each node, to fill: the run lasts at most
        // twice its duration (until every kind ran once), then heals,
        // reads and checks.
        private_disks: faults.contains(&Fault::FullDisk).then(|| DiskOptions {
            size: DISK_SIZE.into(),
            lifetime: duration.saturating_mul(2) + DISKS_MARGIN,
        }),
        link_shape: config.links,
        link_seed: config.seed,
    }
}

/// [`run`], on the cluster `prepared` if given (else on the one the
/// target names, started here).
async fn run_on(
    config: &RunConfig,
    progress: &dyn Fn(Progress),
    prepared: Option<Cluster>,
) -> Result<RunSummary, RunError> {
    let recorder = Arc::new(Recorder::new());
    let (faults, skipped) = runnable_faults(config);
    let (cluster, real) = start_target(config, &faults, prepared).await?;
    let real_addresses: Vec<String> = real.iter().map(|(_, a)| a.clone()).collect();
    let proxies = start_proxies(&real, config.seed, &recorder).await?;
    let proxy_addresses: Vec<String> = proxies.iter().map(|p| p.address().to_string()).collect();
    let api = config.api;
    let first = wait_for_leader(&real_addresses, api, cluster.as_deref()).await?;
    let node_ids: Vec<NodeId> = real.iter().filter_map(|(id, _)| *id).collect();
    recorder.run_started(config.seed, node_ids, describe(config, &faults));

    let leader = Arc::new(AtomicU64::new(first.0));
    let (stop_tx, stop) = watch::channel(false);
    let addresses = real_addresses.clone();
    let watcher = tokio::spawn(watch_leader(
        move || {
            let addresses = addresses.clone();
            async move { observe_leader(&addresses, api).await }
        },
        recorder.clone(),
        leader.clone(),
        stop.clone(),
    ));
    let workload_options = workload_options(config);
    let clients = match api {
        Api::Native => workload::start(
            &proxy_addresses,
            client_options(),
            &workload_options,
            recorder.clone(),
            stop.clone(),
        )
        .map_err(|e| RunError::Setup(e.to_string()))?,
        Api::Etcd => etcd_workload::start(
            &proxy_addresses,
            &workload_options,
            recorder.clone(),
            stop.clone(),
        )
        .map_err(RunError::Setup)?,
    };
    let (watchers_stop_tx, watchers_stop) = watch::channel(false);
    let first_revision = first_revision(config, &real_addresses).await?;
    // Watcher ids, from 1; the reference read takes the next after them.
    let watcher_ids = Arc::new(AtomicU64::new(1));
    let watcher_tasks = match api {
        Api::Native => {
            watcher_ids.store(workload_options.watchers as u64 + 1, Ordering::Relaxed);
            watchers::start(
                &proxy_addresses,
                client_options(),
                workload_options.accounts_prefix(),
                first_revision,
                workload_options.watchers,
                recorder.clone(),
                watchers_stop,
            )
            .map_err(|e| RunError::Setup(e.to_string()))?
        }
        // The fault proxies relay etcd's KV only: watches go to the members.
        Api::Etcd => etcd_watch::start(
            &real_addresses,
            workload_options.resources_prefix(),
            workload_options.watchers,
            watcher_ids.clone(),
            recorder.clone(),
            watchers_stop,
        ),
    };
    let nemesis_failures = Arc::new(Mutex::new(Vec::new()));
    let first_round_done = Arc::new(AtomicBool::new(faults.is_empty()));
    let disruptions = Arc::new(Mutex::new(Vec::new()));
    let nemesis = Nemesis {
        faults: faults.clone(),
        cluster: cluster.clone(),
        proxies: proxies.clone(),
        leader,
        election_timeout: ELECTION_TIMEOUT,
        recorder: recorder.clone(),
        seed: config.seed,
        failures: nemesis_failures.clone(),
        first_round_done: first_round_done.clone(),
        disruptions: disruptions.clone(),
    };
    let nemesis = tokio::spawn(nemesis.run(stop.clone()));
    report_progress(config.duration, &first_round_done, &recorder, progress).await;

    let _ = stop_tx.send(true);
    let _ = nemesis.await;
    let patience = workload_options.grace + Duration::from_secs(10);
    for client in clients {
        let _ = tokio::time::timeout(patience, client).await;
    }
    read_final_values(
        &real_addresses,
        &workload_options,
        api,
        &recorder,
        cluster.as_deref(),
    )
    .await?;
    let _ = watchers_stop_tx.send(true);
    for task in watcher_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    let reference_id = watcher_ids.fetch_add(1, Ordering::Relaxed);
    match api {
        Api::Native => watchers::reference(
            &real_addresses,
            client_options(),
            workload_options.accounts_prefix(),
            first_revision,
            reference_id,
            &recorder,
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| RunError::Setup(e.to_string()))?,
        Api::Etcd if workload_options.resources > 0 => {
            etcd_watch::reference(
                &real_addresses,
                workload_options.resources_prefix(),
                first_revision,
                reference_id,
                &recorder,
                Duration::from_secs(60),
            )
            .await;
        }
        Api::Etcd => {}
    }
    let _ = watcher.await;

    let (crashed, stopped_on_sync_failure) = node_exits(cluster.as_deref(), &faults);
    let record = Record::from_events(recorder.events())?;
    let verify_config = VerifyConfig {
        coverage: requirements_for(&faults, config.workload.mode, api),
        ..VerifyConfig::default()
    };
    let verification = verify(&record, &verify_config);
    let stalls = stalls::of(&record);
    let mut summary = RunSummary {
        record,
        verification,
        stalls,
        skipped,
        crashed,
        stopped_on_sync_failure,
        history: None,
        html: None,
        kept: None,
        nemesis_failures: nemesis_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        disruptions: disruptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    };
    if let Some(dir) = &config.out_dir {
        write_outputs(dir, &mut summary)?;
    }
    let passed = summary.verification.report.verdict() == oncekv_check::coverage::RunVerdict::Pass
        && summary.crashed.is_empty()
        && summary.disruptions.is_empty()
        && summary.nemesis_failures.is_empty();
    if let Some(cluster) = cluster {
        let mut cluster = cluster.lock().unwrap_or_else(|p| p.into_inner());
        cluster.stop_all();
        if !passed && config.out_dir.is_some() {
            summary.kept = Some(cluster.dir.keep());
        }
    }
    Ok(summary)
}

/// The revision the watchers start from: 1 on a cluster of the run's own;
/// on a cluster in use (whose history may be compacted, and long) the one
/// after what it has applied when the run starts.
async fn first_revision(config: &RunConfig, addresses: &[String]) -> Result<u64, RunError> {
    if matches!(config.target, Target::Local { .. }) || config.api == Api::Etcd {
        return Ok(1);
    }
    let client = Client::connect(addresses.to_vec(), client_options())
        .map_err(|e| RunError::Setup(e.to_string()))?;
    Ok(watchers::current_revision(&client).await.saturating_add(1))
}

/// The fault kinds this run can inject, each once, and why the others are
/// skipped.
fn runnable_faults(config: &RunConfig) -> (Vec<Fault>, Vec<String>) {
    let mut skipped = Vec::new();
    let mut faults = Vec::new();
    let topology = match &config.target {
        Target::Local { topology, .. } => Some(*topology),
        Target::Endpoints(_) => None,
    };
    for &fault in &config.faults {
        if fault.needs_processes() && topology.is_none() {
            skipped.push(format!(
                "{fault}: needs the nodes' processes; skipped with --endpoints"
            ));
        } else if fault.needs_namespaces() && topology != Some(Topology::Netns) {
            skipped.push(format!(
                "{fault}: needs hosts of their own (--topology netns); skipped"
            ));
        } else if fault == Fault::Fsync && !fiu_available() {
            skipped.push(format!(
                "{fault}: fiu-run/fiu-ctrl not installed (Debian package fiu-utils); skipped"
            ));
        } else if fault == Fault::FullDisk
            && let Err(why) = crate::disk::available()
        {
            skipped.push(format!(
                "{fault}: no disk of its own for each node here ({why}); skipped"
            ));
        } else if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    (faults, skipped)
}

/// Starts the run's own cluster (unless `prepared` is it), or names the
/// existing one's nodes.
async fn start_target(
    config: &RunConfig,
    faults: &[Fault],
    prepared: Option<Cluster>,
) -> Result<(SharedCluster, Nodes), RunError> {
    match &config.target {
        Target::Local {
            binary,
            nodes,
            dedup,
            topology,
        } => {
            let mut cluster = match prepared {
                Some(cluster) => cluster,
                None => {
                    let options = local_options(binary, *nodes, *dedup, *topology, faults, config);
                    Cluster::start_partitionable(&options).await?
                }
            };
            if faults.iter().any(|f| f.changes_membership()) {
                // Room for the members that join (two at once when it
                // grows by two); the clients' proxies front them from the
                // start.
                cluster.reserve_slots(SPARE_SLOTS).await?;
            }
            let real = cluster.slots();
            Ok((Some(Arc::new(Mutex::new(cluster))), real))
        }
        Target::Endpoints(_) if !config.links.is_none() => Err(RunError::Setup(
            "shaping the peer links needs a cluster the run starts, not --endpoints".into(),
        )),
        Target::Endpoints(endpoints) => {
            Ok((None, endpoints.iter().map(|e| (None, e.clone())).collect()))
        }
    }
}

/// A recording fault proxy in front of each node's client port; leader
/// hints are rewritten to the proxies.
async fn start_proxies(
    real: &Nodes,
    seed: u64,
    recorder: &Arc<Recorder>,
) -> Result<Vec<ClientProxy>, RunError> {
    let mut listeners = Vec::new();
    for _ in real {
        listeners.push(
            ProxyListener::bind()
                .await
                .map_err(|e| RunError::Setup(format!("binding a client proxy: {e}")))?,
        );
    }
    let hints: HashMap<String, String> = real
        .iter()
        .zip(&listeners)
        .map(|((_, address), listener)| (address.clone(), listener.address().to_string()))
        .collect();
    let hints = Arc::new(hints);
    let mut proxies = Vec::new();
    for (index, ((node, address), listener)) in real.iter().zip(listeners).enumerate() {
        let seed = seed ^ (index as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f);
        proxies.push(
            ClientProxy::start(
                listener,
                *node,
                address,
                hints.clone(),
                recorder.clone(),
                seed,
            )
            .map_err(RunError::Setup)?,
        );
    }
    Ok(proxies)
}

/// The first leader the nodes report, within the start-up time.
async fn wait_for_leader(
    addresses: &[String],
    api: Api,
    cluster: Option<&Mutex<Cluster>>,
) -> Result<(NodeId, u64), RunError> {
    let start = Instant::now();
    loop {
        if let Some(found) = observe_leader(addresses, api).await {
            return Ok(found);
        }
        if start.elapsed() > STARTUP_TIMEOUT {
            return Err(RunError::NoLeader {
                within: STARTUP_TIMEOUT,
                logs: keep_logs(cluster),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The run's description in its history.
fn describe(config: &RunConfig, faults: &[Fault]) -> String {
    let names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    let hosts = match &config.target {
        Target::Local {
            nodes,
            topology: Topology::Netns,
            ..
        } => format!(", {nodes} hosts in network namespaces"),
        _ => String::new(),
    };
    let links = &config.links;
    let links = if links.is_none() {
        String::new()
    } else {
        format!(
            ", every peer link {:?} one way, jitter {:?}, loss {}%",
            links.one_way_delay(),
            links.jitter(),
            links.loss_percent()
        )
    };
    format!(
        "{} clients ({:?} mode{}), faults [{}], {:?}{}{hosts}{links}",
        config.workload.clients,
        config.workload.mode,
        match config.api {
            Api::Native => "",
            Api::Etcd => ", etcd API",
        },
        names.join(","),
        config.duration,
        match &config.target {
            Target::Local { dedup: false, .. } => ", dedup OFF (negative control)",
            _ => "",
        }
    )
}

/// The workload's options for this run: its seed, and keys of its own on
/// a cluster in use.
fn workload_options(config: &RunConfig) -> WorkloadOptions {
    let mut options = config.workload.clone();
    options.seed = config.seed;
    if config.api == Api::Etcd {
        // No accounts (no transfers): the watchers follow the resources.
        options.accounts = 0;
        options.watchers = options.watchers.min(2);
    }
    if matches!(config.target, Target::Endpoints(_)) && options.prefix.is_empty() {
        // A cluster in use may hold these keys: this run's own.
        options.prefix = format!("verify-{:016x}/", rand::random::<u64>());
    }
    options
}

/// Waits out the run, reporting progress about four times a second: its
/// duration, and longer if the nemesis has not yet injected every kind
/// once (`first_round_done`: membership changes take seconds each), for
/// at most the duration again.
async fn report_progress(
    duration: Duration,
    first_round_done: &AtomicBool,
    recorder: &Recorder,
    progress: &dyn Fn(Progress),
) {
    let began = Instant::now();
    let more = |elapsed: Duration| {
        elapsed < duration
            || (!first_round_done.load(Ordering::Relaxed) && elapsed < duration.saturating_mul(2))
    };
    while more(began.elapsed()) {
        progress(Progress {
            elapsed: began.elapsed(),
            operations: recorder.completed(),
            faults: recorder.faults(),
        });
        tokio::time::sleep(Duration::from_millis(250).min(duration)).await;
    }
    progress(Progress {
        elapsed: duration,
        operations: recorder.completed(),
        faults: recorder.faults(),
    });
}

/// Reads the final values the checkers compare with the history, once
/// everything committed has applied everywhere.
async fn read_final_values(
    addresses: &[String],
    options: &WorkloadOptions,
    api: Api,
    recorder: &Recorder,
    cluster: Option<&Mutex<Cluster>>,
) -> Result<(), RunError> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    if api == Api::Etcd {
        let patience = Duration::from_secs(30);
        let mut keys = options.final_keys();
        keys.extend(options.resources());
        keys.push(options.compact_key());
        return etcd_workload::record_final_values(addresses, &keys, recorder, patience)
            .await
            .map_err(|error| RunError::EtcdFinalRead {
                error,
                logs: keep_logs(cluster),
            });
    }
    let reader = Client::connect(addresses.to_vec(), client_options())
        .map_err(|e| RunError::Setup(e.to_string()))?;
    let patience = Duration::from_secs(30);
    let read = async {
        workload::record_final_values(&reader, &options.final_keys(), recorder, patience).await?;
        workload::record_final_balances(&reader, options, recorder, patience).await
    };
    read.await.map_err(|error| RunError::FinalRead {
        error,
        logs: keep_logs(cluster),
    })
}

/// Nodes that exited on their own (crashes), and how many stopped on a
/// failed log write or sync (exit code 12) as the fsync and full-disk
/// faults require.
fn node_exits(cluster: Option<&Mutex<Cluster>>, faults: &[Fault]) -> (Vec<String>, usize) {
    let mut crashed = Vec::new();
    let mut stopped_on_sync_failure = 0;
    let storage_faults = faults.contains(&Fault::Fsync) || faults.contains(&Fault::FullDisk);
    if let Some(cluster) = cluster {
        let mut cluster = cluster.lock().unwrap_or_else(|p| p.into_inner());
        for (id, code, status) in cluster.exits() {
            if code == Some(NODE_EXIT_STORAGE) && storage_faults {
                stopped_on_sync_failure += 1;
            } else {
                crashed.push(format!("node {id} exited on its own ({status})"));
            }
        }
    }
    (crashed, stopped_on_sync_failure)
}

/// Keeps the cluster's folder for a post-mortem; says where.
fn keep_logs(cluster: Option<&Mutex<Cluster>>) -> String {
    cluster.map_or_else(String::new, |cluster| {
        let mut cluster = cluster.lock().unwrap_or_else(|p| p.into_inner());
        cluster.stop_all();
        format!(
            " (node data and logs kept in {})",
            cluster.dir.keep().display()
        )
    })
}

fn write_outputs(dir: &std::path::Path, summary: &mut RunSummary) -> Result<(), RunError> {
    let write_error = |path: PathBuf| move |source| RunError::Write { path, source };
    std::fs::create_dir_all(dir).map_err(write_error(dir.to_path_buf()))?;
    let history = dir.join("history.jsonl");
    summary.record.save(&history)?;
    let html = dir.join("report.html");
    let page = summary
        .verification
        .report
        .to_html(&summary.record, &HtmlOptions::default());
    let page = stalls::with_html_section(&page, &stalls::to_html(&summary.stalls));
    std::fs::write(&html, page).map_err(write_error(html.clone()))?;
    summary.history = Some(history);
    summary.html = Some(html);
    Ok(())
}

//! [`Cluster`]: real `oncekv serve` processes, each with a data directory
//! in a temporary folder, on one of two topologies ([`Topology`]): all on
//! loopback, each on free ports (the default), or each on a host of its
//! own, a network namespace with its own address on a private bridge
//! ([`crate::netns`]; the node runs as `ip netns exec <namespace> oncekv
//! serve ...` and listens on its address, [`crate::netns::CLIENT_PORT`]
//! and [`crate::netns::PEER_PORT`]; its clients must run in the network's
//! clients' namespace, [`Cluster::network`]). The process controls fault
//! runs and tests need: a start through a launcher command
//! (`fiu-run`, so disk syncs can be made to fail; `nsenter`), SIGKILL and
//! restart on the same data, SIGSTOP and SIGCONT, exits noticed. With
//! [`ClusterOptions::private_disks`] each node's data directory is a
//! tmpfs of its own in a mount namespace of the cluster's
//! ([`crate::disk`]; a node that joins later gets one too), and every
//! node starts through `nsenter` into it. Each node's peer address is a
//! [`PeerProxy`] where the cluster's [`Partitions`] cut links and shape
//! them ([`Cluster::partitions`]): on loopback when the cluster is started
//! with [`Cluster::start_partitionable`] (each node's outgoing peer
//! connections then come from its own loopback source address), always
//! between namespaces (the proxies run in the clients' namespace,
//! [`Network::run_peer_proxy`], and know callers by their hosts'
//! addresses). Every process is
//! stopped by PID when its [`NodeProcess`] is dropped; the namespaces go
//! when the cluster is dropped, after the processes.
//! With [`ClusterOptions::tls`], a CA and node certificates are made in
//! the cluster's folder (`certs/`, [`crate::certs`]) and every node serves
//! TLS on both ports; [`Cluster::connector`] and [`NodeProcess::tls`] are
//! then how clients reach it. Otherwise the peers authenticate by a shared
//! token made in the cluster's folder (`peer-token`,
//! [`crate::certs::create_token`]; [`Cluster::peer_token_file`]), as
//! `oncekv serve` requires of a node of several, unless
//! [`ClusterOptions::insecure_peers`] asks for none.
//!
//! This is the one implementation of node processes: `oncekv verify`
//! ([`crate::run`]) and the multi-process tests ([`crate::testing`]) both
//! start their nodes here, from the `oncekv` binary they name.

use crate::disk::{DiskOptions, PrivateDisks};
use crate::netns::{self, Network};
use crate::peer_proxy::{LinkShape, Partitions, PeerProxy, source_ip};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncekv_check::record::NodeId;
use std::ffi::OsString;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where the nodes run, and how they reach each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Topology {
    /// All on this machine's loopback, each on free ports.
    #[default]
    Loopback,
    /// Each in a network namespace of its own, with its own address on a
    /// bridge the cluster makes ([`crate::netns`]; needs root).
    Netns,
}

impl Topology {
    /// Both, in the order of `--topology`.
    pub const ALL: [Topology; 2] = [Topology::Loopback, Topology::Netns];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Loopback => "loopback",
            Topology::Netns => "netns",
        }
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the nodes are started.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The `oncekv` binary.
    pub binary: PathBuf,
    /// How many nodes.
    pub nodes: usize,
    /// Whether retries are deduplicated (off only for the negative control).
    pub dedup: bool,
    /// Extra `serve` flags for every node.
    pub extra_args: Vec<String>,
    /// Start each node under `fiu-run`, so its disk syncs can be made to
    /// fail (see [`Cluster::fiu_ctrl`]).
    pub fiu: bool,
    /// The nodes' `--log` filter; unset, the binary's default.
    pub log: Option<String>,
    /// How the name of the cluster's temporary folder begins.
    pub folder_prefix: String,
    /// TLS on both ports of every node (client and peer), with a CA and
    /// node certificates made in the cluster's folder (`certs/`).
    pub tls: bool,
    /// With `tls`: clients must present a certificate from the CA
    /// (`--client-ca-file`); the cluster's own clients use
    /// `certs/client-harness.pem`.
    pub client_certificates: bool,
    /// Start the nodes with `--insecure-peers`, their peers authenticated
    /// neither by TLS nor by a token. Unset (the default), a cluster
    /// without `tls` gets a token file in its folder (`peer-token`) and
    /// every node `--peer-token-file` with it.
    pub insecure_peers: bool,
    /// Where the nodes run.
    pub topology: Topology,
    /// Give each node's data directory a disk of its own, a tmpfs in a
    /// mount namespace of the cluster's ([`crate::disk`]; root only), so
    /// a disk can be filled; the nodes then start through `nsenter`.
    pub private_disks: Option<DiskOptions>,
    /// Every peer link's delay, jitter and loss from the start, where the
    /// cluster has peer proxies (between namespaces, or started with
    /// [`Cluster::start_partitionable`]); changed later through
    /// [`Cluster::partitions`].
    pub link_shape: LinkShape,
    /// Seeds the links' draws ([`crate::peer_proxy::Shaping::set_seed`]).
    pub link_seed: u64,
}

/// The name of a cluster's peer token file, in its folder.
pub const PEER_TOKEN_FILE: &str = "peer-token";

/// The user name of the client certificate a TLS cluster's own clients
/// present.
pub const HARNESS_USER: &str = "harness";

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A port, folder or process could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The cluster's certificates could not be made.
    #[error("making the cluster's certificates: {0}")]
    Certs(#[from] crate::certs::CertError),
    /// The cluster's clients could not be configured for TLS.
    #[error("configuring TLS clients: {0}")]
    Tls(#[from] oncekv_client::TlsConfigError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// One node: its addresses, data and process.
#[derive(Debug)]
pub struct NodeProcess {
    /// Its id.
    pub id: NodeId,
    /// Its client address (`127.0.0.1:port`; between namespaces, its own
    /// address and [`netns::CLIENT_PORT`]).
    pub client: String,
    /// The address its peer port listens on (`127.0.0.1:port`; between
    /// namespaces, its own address and [`netns::PEER_PORT`]).
    pub peer: String,
    /// The proxy other nodes reach it through, when the cluster has peer
    /// proxies (else they reach [`NodeProcess::peer`]).
    pub peer_proxy: Option<SocketAddr>,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its process, from its start until it is killed or found exited.
    pub child: Option<Child>,
    /// Stopped with SIGSTOP and not yet continued.
    pub paused: bool,
    /// A command the node is started through (`nsenter ...`,
    /// `fiu-run ...`), if any; the binary and its arguments follow it.
    pub launcher: Vec<String>,
    /// How a client reaches it over TLS, when the cluster serves TLS.
    pub tls: Option<oncekv_client::TlsConnector>,
    /// The command that puts it in its namespace (`ip netns exec NS`),
    /// before the launcher, on the netns topology.
    netns_exec: Vec<String>,
    binary: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
}

impl NodeProcess {
    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (possibly paused).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Adds `serve` flags for its next start (this node's own, such as a
    /// metrics address).
    pub fn add_args<I, S>(&mut self, args: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
    }

    /// The file its standard output and error are appended to.
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// Starts the process on its data directory, unless it is running.
    pub fn start(&mut self) -> std::io::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let log = File::options().create(true).append(true).open(&self.log)?;
        // `ip netns exec` execs what follows in its own process, so the
        // PID is the node's (or its launcher's, which execs it in turn).
        let launcher: Vec<&String> = self.netns_exec.iter().chain(&self.launcher).collect();
        let mut command = match launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&self.binary);
                command
            }
            None => Command::new(&self.binary),
        };
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(command.spawn()?);
        self.paused = false;
        Ok(())
    }

    /// Sends `signal` to the process; whether it was delivered.
    pub(crate) fn send(&self, signal: Signal) -> bool {
        let Some(pid) = self.pid().and_then(|pid| i32::try_from(pid).ok()) else {
            return false;
        };
        kill(Pid::from_raw(pid), signal).is_ok()
    }

    /// SIGKILLs the process (continuing it first, if paused) and reaps it.
    pub fn kill(&mut self) {
        self.send(Signal::SIGCONT);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Asks the process to stop (SIGTERM), as an operator restarting it
    /// does; whether the signal was delivered. [`NodeProcess::collect`]
    /// tells when it has.
    pub fn terminate(&mut self) -> bool {
        self.send(Signal::SIGCONT);
        self.paused = false;
        self.send(Signal::SIGTERM)
    }

    /// How the process ended, once it has (it is then reaped, and not
    /// counted as an exit of its own: [`Cluster::exits`]); `None` while it
    /// runs, or when there is none.
    pub fn collect(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// SIGSTOPs the process; whether it was stopped.
    pub fn pause(&mut self) -> bool {
        let stopped = self.send(Signal::SIGSTOP);
        if stopped {
            self.paused = true;
        }
        stopped
    }

    /// SIGCONTs the process.
    pub fn resume(&mut self) {
        self.send(Signal::SIGCONT);
        self.paused = false;
    }

    /// Its network namespace, on the netns topology.
    pub fn namespace(&self) -> Option<&str> {
        self.netns_exec.last().map(String::as_str)
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster's folder, with the nodes' data directories and logs: removed
/// when the cluster is dropped, unless kept.
#[derive(Debug)]
pub struct ClusterDir {
    path: PathBuf,
    temp: Option<tempfile::TempDir>,
}

impl ClusterDir {
    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps it after the cluster is dropped; returns where it is.
    pub fn keep(&mut self) -> PathBuf {
        if let Some(temp) = self.temp.take() {
            let _ = temp.keep();
        }
        self.path.clone()
    }
}

/// A local cluster of `oncekv serve` processes.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes, ids 1, 2, ... in order.
    pub nodes: Vec<NodeProcess>,
    /// The nodes' disks, when they have their own (dropped after the
    /// nodes, before their folder).
    disks: Option<Arc<PrivateDisks>>,
    /// The folder of their data and logs (dropped after the nodes).
    pub dir: ClusterDir,
    partitions: Partitions,
    /// Processes that exited on their own: node, exit code, description.
    exits: Vec<(NodeId, Option<i32>, String)>,
    /// How clients reach the nodes over TLS, when they serve TLS.
    tls: Option<oncekv_client::TlsConnector>,
    /// The peer token file the nodes share, when they use one.
    peer_token: Option<PathBuf>,
    /// The hosts' namespaces, on the netns topology (dropped last, after
    /// the processes in them).
    network: Option<Arc<Network>>,
    /// The places a node can run at: each node's, and those reserved for
    /// nodes that join later ([`Cluster::reserve_slots`]).
    slots: Vec<Slot>,
    /// How a node of this cluster is started.
    template: NodeTemplate,
}

/// A place a node runs at: its addresses (and peer proxy), which outlive
/// the node. Membership changes put one node after another there: a
/// replaced node's successor, a learner in a slot kept free for it.
#[derive(Debug)]
pub struct Slot {
    /// The client address of the node there.
    pub client: String,
    /// The address its peer port listens on.
    pub peer: SocketAddr,
    /// The proxy other nodes reach it through, if the cluster has them.
    pub peer_proxy: Option<SocketAddr>,
    /// The node there now (0: none), as its peer proxy knows it.
    occupant: Arc<AtomicU64>,
    /// The host it is on, on the netns topology.
    host: Option<NodeId>,
}

impl Slot {
    /// The peer address the node there advertises: its proxy's, else its
    /// own.
    pub fn advertised_peer(&self) -> String {
        self.peer_proxy.unwrap_or(self.peer).to_string()
    }
}

/// How a node of a cluster is started: the options, the folder, the
/// shared peer token and the launcher.
#[derive(Debug)]
struct NodeTemplate {
    options: ClusterOptions,
    folder: PathBuf,
    peer_token: Option<PathBuf>,
    launcher: Vec<String>,
    tls: Option<oncekv_client::TlsConnector>,
}

impl NodeTemplate {
    /// Node `id` at `slot`: one of the initial members `initial`
    /// (`--initial-cluster`), or, without it, a node that waits to be
    /// added (`--join`).
    fn node(&self, id: NodeId, slot: &Slot, initial: Option<&str>) -> NodeProcess {
        let options = &self.options;
        let data_dir = self.folder.join(format!("node-{id}"));
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--id".into(),
            id.to_string().into(),
            "--data-dir".into(),
            data_dir.clone().into(),
            "--listen-client".into(),
            slot.client.clone().into(),
            "--listen-peer".into(),
            slot.peer.to_string().into(),
        ];
        if let Some(proxy) = slot.peer_proxy {
            args.extend(["--advertise-peer".into(), proxy.to_string().into()]);
        }
        match initial {
            Some(initial) => args.extend(["--initial-cluster".into(), initial.into()]),
            None => args.push("--join".into()),
        }
        // Between hosts a node calls from its host's address.
        if slot.peer_proxy.is_some() && slot.host.is_none() {
            args.extend(["--peer-source-ip".into(), source_ip(id).to_string().into()]);
        }
        if let Some(log) = &options.log {
            args.extend(["--log".into(), log.into()]);
        }
        if self.tls.is_some() {
            args.extend(tls_args(&self.folder, id, options.client_certificates));
        }
        if let Some(token) = &self.peer_token {
            args.extend(["--peer-token-file".into(), token.clone().into()]);
        }
        if options.insecure_peers {
            args.push("--insecure-peers".into());
        }
        args.extend(options.extra_args.iter().map(OsString::from));
        if !options.dedup {
            args.push("--unsafe-no-dedup".into());
        }
        NodeProcess {
            id,
            client: slot.client.clone(),
            peer: slot.peer.to_string(),
            peer_proxy: slot.peer_proxy,
            log: self.folder.join(format!("node-{id}.log")),
            data_dir,
            child: None,
            paused: false,
            launcher: self.launcher.clone(),
            netns_exec: Vec::new(),
            // As the plaintext helpers: a paused node must not hold a
            // test's call for ever.
            tls: self
                .tls
                .clone()
                .map(|tls| tls.with_call_timeout(Duration::from_secs(10))),
            binary: options.binary.clone(),
            args,
        }
    }
}

/// Why a node could not join the cluster at a slot.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No slot has that client address.
    #[error("no slot of the cluster has the client address {0}")]
    NoSuchSlot(String),
    /// A node of the cluster is there already.
    #[error("node {0} is at that slot already")]
    Occupied(NodeId),
    /// A node with that id is in the cluster already.
    #[error("node {0} is in the cluster already")]
    Exists(NodeId),
    /// Joining nodes run without TLS (no certificate is made for them).
    #[error("a node joins only a cluster without TLS")]
    Unsupported,
    /// The process could not be started.
    #[error("starting node {id}: {source}")]
    Start {
        /// The node.
        id: NodeId,
        /// The failure.
        source: std::io::Error,
    },
}

/// Makes a CA and the certificates of nodes `hosts` in `<folder>/certs`
/// (each named for the one address it serves on: 127.0.0.1, or its own
/// between namespaces), and the harness's client certificate if
/// `client_certificates`; returns how clients connect.
fn make_certificates(
    folder: &Path,
    hosts: &[(NodeId, String)],
    client_certificates: bool,
) -> Result<oncekv_client::TlsConnector, ClusterError> {
    use crate::certs;
    let dir = folder.join("certs");
    let ca = certs::create_ca(&dir, certs::CA_DAYS_DEFAULT)?;
    for (id, host) in hosts {
        certs::create_node(
            &dir,
            *id,
            std::slice::from_ref(host),
            certs::LEAF_DAYS_DEFAULT,
        )?;
    }
    let client = if client_certificates {
        Some(certs::create_client(
            &dir,
            HARNESS_USER,
            certs::LEAF_DAYS_DEFAULT,
        )?)
    } else {
        None
    };
    let files = oncekv_client::TlsFiles {
        ca: ca.cert,
        cert: client.as_ref().map(|files| files.cert.clone()),
        key: client.map(|files| files.key),
    };
    Ok(oncekv_client::TlsConnector::new(&files)?)
}

/// The `serve` flags of node `id` of a TLS cluster in `folder`.
fn tls_args(folder: &Path, id: NodeId, client_certificates: bool) -> Vec<OsString> {
    let dir = folder.join("certs");
    let node = crate::certs::node_files(&dir, id);
    let ca = crate::certs::ca_files(&dir).cert;
    let mut args: Vec<OsString> = vec![
        "--cert-file".into(),
        node.cert.clone().into(),
        "--key-file".into(),
        node.key.clone().into(),
        "--peer-cert-file".into(),
        node.cert.into(),
        "--peer-key-file".into(),
        node.key.into(),
        "--peer-ca-file".into(),
        ca.clone().into(),
    ];
    if client_certificates {
        args.extend(["--client-ca-file".into(), ca.into()]);
    }
    args
}

/// A free loopback port (bound, then released for a node to take).
///
/// Two things could take it before the node does, and both are ruled
/// out: this process handing the same port out twice (the kernel's
/// choice for port 0 repeats once the probe is closed), and an outgoing
/// connection of some node drawing it as its ephemeral local port. So
/// ports come from below the kernel's ephemeral range, and none is
/// handed out twice by one process.
pub(crate) fn free_address() -> std::io::Result<SocketAddr> {
    use std::collections::HashSet;
    use std::sync::{Mutex, PoisonError};
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    const LOWEST: u16 = 15_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral <= LOWEST + 1_000 {
        // An unusual ephemeral range: fall back on the kernel's choice.
        return TcpListener::bind("127.0.0.1:0")?.local_addr();
    }
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    let span = ephemeral - LOWEST;
    let start = rand::random_range(0..span);
    for step in 0..span {
        let port = LOWEST + (start + step) % span;
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(probe) = TcpListener::bind(("127.0.0.1", port)) {
            let address = probe.local_addr()?;
            handed_out.insert(port);
            return Ok(address);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no free loopback port below the ephemeral range",
    ))
}

impl Cluster {
    /// Plans the nodes of `options` on free loopback ports, in a new
    /// temporary folder, and starts none of them ([`Cluster::start_all`]
    /// or [`NodeProcess::start`] does).
    pub fn plan(options: &ClusterOptions) -> Result<Cluster, ClusterError> {
        Cluster::plan_with(options, None)
    }

    /// Starts the nodes of `options`. Does not wait for a leader.
    pub fn start(options: &ClusterOptions) -> Result<Cluster, ClusterError> {
        let mut cluster = Cluster::plan(options)?;
        cluster.start_all()?;
        Ok(cluster)
    }

    /// Starts the nodes of `options` behind peer proxies (on the current
    /// tokio runtime), so that [`Cluster::partitions`] can cut and shape
    /// their links. Does not wait for a leader. On the netns topology
    /// every cluster has peer proxies (on a runtime of their own): this
    /// is [`Cluster::start`].
    pub async fn start_partitionable(options: &ClusterOptions) -> Result<Cluster, ClusterError> {
        if options.topology == Topology::Netns {
            return Cluster::start(options);
        }
        let mut proxies = Vec::new();
        for _ in 0..options.nodes {
            proxies.push(
                PeerProxy::bind()
                    .await
                    .map_err(io("binding a peer proxy"))?,
            );
        }
        let mut cluster = Cluster::plan_with(options, Some(proxies))?;
        cluster.start_all()?;
        Ok(cluster)
    }

    /// Plans the nodes. With `proxies` (one per node), each node
    /// advertises its proxy as its peer address and calls its peers from
    /// a source address of its own, and the proxies start forwarding.
    fn plan_with(
        options: &ClusterOptions,
        proxies: Option<Vec<(PeerProxy, tokio::net::TcpListener)>>,
    ) -> Result<Cluster, ClusterError> {
        let temp = tempfile::Builder::new()
            .prefix(&options.folder_prefix)
            .tempdir()
            .map_err(io("creating the cluster's folder"))?;
        let dir = ClusterDir {
            path: temp.path().to_path_buf(),
            temp: Some(temp),
        };
        let ids: Vec<NodeId> = (1..=options.nodes as NodeId).collect();
        let network = match options.topology {
            Topology::Loopback => None,
            Topology::Netns => Some(Arc::new(
                Network::create(&ids).map_err(io("making the hosts' network namespaces"))?,
            )),
        };
        // These peer proxies listen on loopback: they are for loopback
        // nodes. Between namespaces each host has one in the clients'.
        let proxies = proxies.filter(|_| network.is_none());
        let mut addresses = Vec::new();
        for &id in &ids {
            if network.is_some() {
                let host = std::net::IpAddr::V4(netns::node_ip(id));
                addresses.push((
                    SocketAddr::new(host, netns::CLIENT_PORT),
                    SocketAddr::new(host, netns::PEER_PORT),
                ));
                continue;
            }
            let client = free_address().map_err(io("finding a free port"))?;
            let peer = free_address().map_err(io("finding a free port"))?;
            addresses.push((client, peer));
        }
        let advertised: Vec<Option<SocketAddr>> = match (&proxies, &network) {
            (Some(proxies), _) => proxies.iter().map(|(p, _)| Some(p.address())).collect(),
            (None, Some(_)) => ids
                .iter()
                .map(|&id| Some(netns::peer_proxy_address(id)))
                .collect(),
            (None, None) => vec![None; ids.len()],
        };
        let initial: Vec<String> = ids
            .iter()
            .zip(&addresses)
            .zip(&advertised)
            .map(|((id, (client, peer)), proxy)| {
                format!("{id}={}/{client}", proxy.unwrap_or(*peer))
            })
            .collect();
        let initial = initial.join(",");
        let disks = match &options.private_disks {
            Some(disk) => Some(Arc::new(
                PrivateDisks::create(disk).map_err(io("making the nodes' disks' namespace"))?,
            )),
            None => None,
        };
        // Into the disks' namespace first (after the network's, which
        // `ip netns exec` enters from the machine's), then under fiu.
        let mut launcher: Vec<String> = disks
            .as_ref()
            .map(|disks| disks.launcher())
            .unwrap_or_default();
        if options.fiu {
            let control = dir.path().join("fiu-ctrl");
            launcher.extend(
                ["fiu-run", "-x", "-f"]
                    .iter()
                    .map(|s| (*s).to_string())
                    .chain([control.display().to_string()]),
            );
        }
        let tls = if options.tls {
            let hosts: Vec<(NodeId, String)> = ids
                .iter()
                .zip(&addresses)
                .map(|(&id, (client, _))| (id, client.ip().to_string()))
                .collect();
            Some(make_certificates(
                dir.path(),
                &hosts,
                options.client_certificates,
            )?)
        } else {
            None
        };
        let peer_token = if options.tls || options.insecure_peers {
            None
        } else {
            let path = dir.path().join(PEER_TOKEN_FILE);
            crate::certs::create_token(&path, false)?;
            Some(path)
        };
        let template = NodeTemplate {
            options: options.clone(),
            folder: dir.path().to_path_buf(),
            peer_token: peer_token.clone(),
            launcher,
            tls: tls.clone(),
        };
        let mut nodes = Vec::new();
        let mut slots = Vec::new();
        for ((&id, &(client, peer)), &proxy) in ids.iter().zip(&addresses).zip(&advertised) {
            let slot = Slot {
                client: client.to_string(),
                peer,
                peer_proxy: proxy,
                occupant: Arc::new(AtomicU64::new(id)),
                host: network.as_ref().map(|_| id),
            };
            let mut node = template.node(id, &slot, Some(initial.as_str()));
            if let Some(disks) = &disks {
                disks
                    .mount(&node.data_dir)
                    .map_err(io(format!("mounting node {id}'s disk")))?;
            }
            node.netns_exec = network
                .as_ref()
                .map(|network| network.exec_prefix(id))
                .unwrap_or_default();
            nodes.push(node);
            slots.push(slot);
        }
        let partitions = Partitions::default();
        partitions.shaping().set_seed(options.link_seed);
        partitions.shaping().set_all(options.link_shape);
        if let Some(network) = &network {
            for slot in &slots {
                let host = slot.host.unwrap_or_default();
                network
                    .run_peer_proxy(host, slot.occupant.clone(), partitions.clone())
                    .map_err(io(format!("running host {host}'s peer proxy")))?;
            }
        }
        if let Some(proxies) = proxies {
            for ((_, listener), slot) in proxies.into_iter().zip(&slots) {
                PeerProxy::run_as(
                    listener,
                    slot.occupant.clone(),
                    slot.peer,
                    partitions.clone(),
                );
            }
        }
        Ok(Cluster {
            nodes,
            disks,
            dir,
            partitions,
            exits: Vec::new(),
            tls,
            peer_token,
            network,
            slots,
            template,
        })
    }

    /// Where the nodes run.
    pub fn topology(&self) -> Topology {
        if self.network.is_some() {
            Topology::Netns
        } else {
            Topology::Loopback
        }
    }

    /// The hosts' network, on the netns topology: its clients' namespace
    /// is where the nodes are reached from ([`Network::block_on`]), and
    /// its links are where network faults are made.
    pub fn network(&self) -> Option<Arc<Network>> {
        self.network.clone()
    }

    /// The nodes' disks, when each has its own
    /// ([`ClusterOptions::private_disks`]).
    pub fn disks(&self) -> Option<Arc<PrivateDisks>> {
        self.disks.clone()
    }

    /// The peer token file the nodes share (in the cluster's folder), when
    /// they authenticate peers by one: a node started to join them needs
    /// `--peer-token-file` with it.
    pub fn peer_token_file(&self) -> Option<&Path> {
        self.peer_token.as_deref()
    }

    /// Where the cluster's certificates are (`certs/` in its folder: the
    /// CA, `node-N`, and `client-harness` with client certificates), when
    /// it serves TLS.
    pub fn certs_dir(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|_| self.dir.path().join("certs"))
    }

    /// How a client reaches the nodes: TLS (trusting the cluster's CA, and
    /// presenting the harness's client certificate if the nodes require
    /// one) when they serve TLS, plain TCP otherwise.
    pub fn connector(&self) -> Arc<dyn oncekv_client::Connector> {
        match &self.tls {
            Some(tls) => Arc::new(tls.clone()),
            None => Arc::new(oncekv_client::TcpConnector),
        }
    }

    /// Client options for this cluster: the defaults, over
    /// [`Cluster::connector`].
    pub fn client_options(&self) -> oncekv_client::ClientOptions {
        oncekv_client::ClientOptions {
            connector: self.connector(),
            ..oncekv_client::ClientOptions::default()
        }
    }

    /// Starts every node that is not running.
    pub fn start_all(&mut self) -> Result<(), ClusterError> {
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        for id in ids {
            self.restart(id)
                .map_err(io(format!("starting node {id}")))?;
        }
        Ok(())
    }

    /// Reserves `count` more slots (on loopback: free ports, and a peer
    /// proxy for each when the cluster has them; between namespaces: a
    /// host of its own for each on the bridge), where nodes can join
    /// later ([`Cluster::join`]). Needs a tokio runtime when the cluster
    /// has peer proxies.
    pub async fn reserve_slots(&mut self, count: usize) -> Result<(), ClusterError> {
        if let Some(network) = &self.network {
            // A host of its own for each, on the bridge.
            for _ in 0..count {
                let host = network.hosts().into_iter().max().unwrap_or(0) + 1;
                network
                    .add_node_host(host)
                    .map_err(io("making a host for a slot"))?;
                let ip = std::net::IpAddr::V4(netns::node_ip(host));
                let occupant = Arc::new(AtomicU64::new(0));
                let proxy = network
                    .run_peer_proxy(host, occupant.clone(), self.partitions.clone())
                    .map_err(io(format!("running host {host}'s peer proxy")))?;
                self.slots.push(Slot {
                    client: SocketAddr::new(ip, netns::CLIENT_PORT).to_string(),
                    peer: SocketAddr::new(ip, netns::PEER_PORT),
                    peer_proxy: Some(proxy),
                    occupant,
                    host: Some(host),
                });
            }
            return Ok(());
        }
        let proxied = self.slots.iter().any(|slot| slot.peer_proxy.is_some());
        for _ in 0..count {
            let client = free_address().map_err(io("finding a free port"))?;
            let peer = free_address().map_err(io("finding a free port"))?;
            let occupant = Arc::new(AtomicU64::new(0));
            let peer_proxy = if proxied {
                let (proxy, listener) = PeerProxy::bind()
                    .await
                    .map_err(io("binding a peer proxy"))?;
                PeerProxy::run_as(listener, occupant.clone(), peer, self.partitions.clone());
                Some(proxy.address())
            } else {
                None
            };
            self.slots.push(Slot {
                client: client.to_string(),
                peer,
                peer_proxy,
                occupant,
                host: None,
            });
        }
        Ok(())
    }

    /// Every slot: the node there now, if any, and its client address.
    pub fn slots(&self) -> Vec<(Option<NodeId>, String)> {
        self.slots
            .iter()
            .map(|slot| {
                let occupant = self
                    .nodes
                    .iter()
                    .find(|node| node.client == slot.client)
                    .map(|node| node.id);
                (occupant, slot.client.clone())
            })
            .collect()
    }

    /// The slot whose client address is `client`.
    pub fn slot(&self, client: &str) -> Option<&Slot> {
        self.slots.iter().find(|slot| slot.client == client)
    }

    /// Starts node `id` at the free slot whose client address is
    /// `client`, with a data directory of its own, waiting to be added
    /// (`--join`): it joins once a member adds it.
    pub fn join(&mut self, id: NodeId, client: &str) -> Result<(), JoinError> {
        if self.tls.is_some() {
            return Err(JoinError::Unsupported);
        }
        if self.nodes.iter().any(|node| node.id == id) {
            return Err(JoinError::Exists(id));
        }
        if let Some(there) = self.nodes.iter().find(|node| node.client == client) {
            return Err(JoinError::Occupied(there.id));
        }
        let slot = self
            .slot(client)
            .ok_or_else(|| JoinError::NoSuchSlot(client.to_string()))?;
        let mut node = self.template.node(id, slot, None);
        if let (Some(network), Some(host)) = (&self.network, slot.host) {
            // On the slot's host: reached at its address, cut by its links.
            network.place(id, host);
            node.netns_exec = network.exec_prefix(id);
        }
        if let Some(disks) = &self.disks {
            // A disk of its own, as every node of the cluster has.
            disks
                .mount(&node.data_dir)
                .map_err(|source| JoinError::Start { id, source })?;
        }
        slot.occupant.store(id, Ordering::Relaxed);
        node.start()
            .map_err(|source| JoinError::Start { id, source })?;
        self.nodes.push(node);
        Ok(())
    }

    /// Takes node `id` out of the cluster's processes: stops it (SIGKILL),
    /// removes its data directory (its log stays), and frees its slot.
    /// Whether it was one of them.
    pub fn retire(&mut self, id: NodeId) -> bool {
        self.reap();
        let Some(at) = self.nodes.iter().position(|node| node.id == id) else {
            return false;
        };
        let mut node = self.nodes.remove(at);
        node.kill();
        if let Some(slot) = self.slots.iter().find(|slot| slot.client == node.client) {
            let _ = slot
                .occupant
                .compare_exchange(id, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        if let Some(disks) = &self.disks {
            disks.unmount(&node.data_dir);
        }
        let _ = std::fs::remove_dir_all(&node.data_dir);
        true
    }

    /// Cuts node `target` off from `others`, both ways: its peer links are
    /// reset on loopback ([`Partitions::split`]), cut silently between
    /// namespaces ([`Cluster::cut_between`]). A cut that cannot be made is
    /// logged (the run records what it did).
    pub fn isolate(&self, target: NodeId, others: &[NodeId]) {
        if self.network.is_none() {
            self.partitions.split(&[target], others);
        } else if let Err(error) = self.cut_between(&[target], others) {
            eprintln!("cutting node {target} off: {error}");
        }
    }

    /// Ends the cuts [`Cluster::isolate`] made.
    pub fn heal_isolation(&self) {
        if let Err(error) = self.heal_cuts() {
            eprintln!("healing the cuts: {error}");
        }
    }

    /// Cuts what node `from` sends node `to`, one way and silently: held
    /// in the peer proxies ([`Partitions::cut`]), and, between
    /// namespaces, dropped in the network too ([`Network::cut`]: what
    /// `from` sends `to` directly, not through a proxy).
    pub fn cut(&self, from: NodeId, to: NodeId) -> std::io::Result<()> {
        self.partitions.cut(from, to);
        match &self.network {
            Some(network) => network.cut(from, to),
            None => Ok(()),
        }
    }

    /// [`Cluster::cut`]s both directions between every node of `side` and
    /// every node of `other`.
    pub fn cut_between(&self, side: &[NodeId], other: &[NodeId]) -> std::io::Result<()> {
        self.partitions.cut_between(side, other);
        match &self.network {
            Some(network) => network.split(side, other),
            None => Ok(()),
        }
    }

    /// Heals every partition and cut (in the proxies, and between
    /// namespaces in the network, where links that are down come up
    /// too); the links' shaping stays.
    pub fn heal_cuts(&self) -> std::io::Result<()> {
        self.partitions.heal();
        match &self.network {
            Some(network) => network.heal(),
            None => Ok(()),
        }
    }

    /// The peer links' partitions, cuts and shaping (they act on the links
    /// between nodes started by [`Cluster::start_partitionable`], or
    /// between namespaces).
    pub fn partitions(&self) -> &Partitions {
        &self.partitions
    }

    /// The base path of the nodes' `fiu-ctrl` pipes (in the cluster's
    /// folder).
    pub fn fiu_ctrl(&self) -> PathBuf {
        self.dir.path().join("fiu-ctrl")
    }

    /// Node `id`, if there is one.
    pub fn node_mut(&mut self, id: NodeId) -> Option<&mut NodeProcess> {
        self.nodes.iter_mut().find(|n| n.id == id)
    }

    /// Starts node `id` (again), on the same data, unless it is running.
    pub fn restart(&mut self, id: NodeId) -> std::io::Result<()> {
        self.reap();
        match self.node_mut(id) {
            Some(node) => node.start(),
            None => Ok(()),
        }
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&mut self, id: NodeId) {
        if let Some(node) = self.node_mut(id) {
            node.kill();
        }
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&mut self, id: NodeId) {
        if let Some(node) = self.node_mut(id) {
            node.pause();
        }
    }

    /// SIGCONTs node `id`.
    pub fn resume(&mut self, id: NodeId) {
        if let Some(node) = self.node_mut(id) {
            node.resume();
        }
    }

    /// Resumes paused nodes, restarts dead ones and heals partitions (and,
    /// between namespaces, sets every link up and removes every cut).
    pub fn heal(&mut self) -> std::io::Result<()> {
        // The nodes run again even if a link could not be repaired.
        let links = self.heal_cuts();
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        for id in ids {
            self.resume(id);
            self.restart(id)?;
        }
        links
    }

    /// Notes every process that exited on its own since the last look.
    fn reap(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = &mut node.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.exits
                    .push((node.id, status.code(), status.to_string()));
                node.child = None;
            }
        }
    }

    /// Processes that exited on their own (not killed through the
    /// cluster) so far: node, exit code, description.
    pub fn exits(&mut self) -> Vec<(NodeId, Option<i32>, String)> {
        self.reap();
        self.exits.clone()
    }

    /// Kills every node.
    pub fn stop_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    /// The tail of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.id, n.log_tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// How long a node gets to come up before the run gives up on it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use super::*;

    fn options(nodes: usize) -> ClusterOptions {
        ClusterOptions {
            binary: PathBuf::from("/nonexistent/oncekv"),
            nodes,
            dedup: true,
            extra_args: vec!["--heartbeat".into(), "50ms".into()],
            fiu: false,
            log: None,
            folder_prefix: "oncekv-harness-test-".into(),
            tls: false,
            client_certificates: false,
            insecure_peers: false,
            topology: Topology::Loopback,
            private_disks: None,
            link_shape: LinkShape::default(),
            link_seed: 0,
        }
    }

    fn args(node: &NodeProcess) -> Vec<String> {
        node.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn flag(node: &NodeProcess, name: &str) -> Option<String> {
        let args = args(node);
        let at = args.iter().position(|a| a == name)?;
        args.get(at + 1).cloned()
    }

    #[test]
    fn a_planned_node_serves_its_own_ports_and_data_and_knows_every_peer() {
        let cluster = Cluster::plan(&options(3)).expect("plan");
        let ids: Vec<NodeId> = cluster.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        let expected_initial: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("{}={}/{}", n.id, n.peer, n.client))
            .collect();
        for node in &cluster.nodes {
            assert!(node.child.is_none() && !node.paused && node.launcher.is_empty());
            assert_eq!(args(node)[0], "serve");
            assert_eq!(flag(node, "--id"), Some(node.id.to_string()));
            assert_eq!(flag(node, "--listen-client"), Some(node.client.clone()));
            assert_eq!(flag(node, "--listen-peer"), Some(node.peer.clone()));
            assert_eq!(
                flag(node, "--data-dir"),
                Some(node.data_dir.display().to_string())
            );
            assert!(node.data_dir.starts_with(cluster.dir.path()));
            assert_eq!(
                flag(node, "--initial-cluster"),
                Some(expected_initial.join(","))
            );
            assert_eq!(flag(node, "--heartbeat").as_deref(), Some("50ms"));
            let token = cluster.peer_token_file().expect("a peer token");
            assert!(token.starts_with(cluster.dir.path()));
            assert_eq!(
                flag(node, "--peer-token-file"),
                Some(token.display().to_string())
            );
            for absent in [
                "--advertise-peer",
                "--peer-source-ip",
                "--log",
                "--unsafe-no-dedup",
                "--insecure-peers",
            ] {
                assert!(!args(node).iter().any(|a| a == absent), "{absent}");
            }
        }
        let mut ports: Vec<&String> = cluster
            .nodes
            .iter()
            .flat_map(|n| [&n.client, &n.peer])
            .collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), 6, "every address is its own");
    }

    #[tokio::test]
    async fn a_partitionable_node_advertises_its_proxy_and_calls_from_its_own_address() {
        let mut with = options(2);
        with.dedup = false;
        with.log = Some("info".into());
        with.binary = PathBuf::from("/bin/true");
        let cluster = Cluster::start_partitionable(&with).await.expect("start");
        for node in &cluster.nodes {
            let proxy = node.peer_proxy.expect("a peer proxy");
            assert_eq!(flag(node, "--advertise-peer"), Some(proxy.to_string()));
            assert_eq!(
                flag(node, "--peer-source-ip"),
                Some(source_ip(node.id).to_string())
            );
            assert!(
                flag(node, "--initial-cluster")
                    .is_some_and(|c| c.contains(&format!("{}={proxy}/{}", node.id, node.client)))
            );
            assert_eq!(flag(node, "--log").as_deref(), Some("info"));
            assert_eq!(
                args(node).last().map(String::as_str),
                Some("--unsafe-no-dedup")
            );
        }
    }

    #[tokio::test]
    async fn a_node_between_namespaces_serves_on_its_own_address_through_ip_netns_exec() {
        if let Err(why) = netns::available() {
            crate::testing::missing_dependency(
                "cluster::tests::a_node_between_namespaces_serves_on_its_own_address_through_\
                 ip_netns_exec",
                crate::testing::Dependency::NetworkNamespaces,
                &why,
            );
            return;
        }
        let mut with = options(3);
        with.topology = Topology::Netns;
        with.binary = PathBuf::from("/bin/true");
        // Every node's peer traffic goes through its host's proxy, in the
        // clients' namespace.
        let cluster = Cluster::start_partitionable(&with).await.expect("start");
        assert_eq!(cluster.topology(), Topology::Netns);
        let network = cluster.network().expect("a network");
        for node in &cluster.nodes {
            let own = netns::node_ip(node.id);
            let proxy = netns::peer_proxy_address(node.id);
            assert_eq!(proxy.ip(), netns::CLIENT_HOST);
            let namespace = network.namespace(node.id);
            assert_eq!(node.namespace(), Some(namespace.as_str()));
            assert_eq!(node.netns_exec, ["ip", "netns", "exec", namespace.as_str()]);
            assert_eq!(node.peer_proxy, Some(proxy));
            assert!(node.launcher.is_empty());
            assert_eq!(node.client, format!("{own}:{}", netns::CLIENT_PORT));
            assert_eq!(
                flag(node, "--listen-peer"),
                Some(format!("{own}:{}", netns::PEER_PORT))
            );
            assert_eq!(flag(node, "--advertise-peer"), Some(proxy.to_string()));
            assert!(
                flag(node, "--initial-cluster").is_some_and(|c| c.contains(&format!(
                    "{}={proxy}/{own}:{}",
                    node.id,
                    netns::CLIENT_PORT
                )))
            );
            assert!(!args(node).iter().any(|a| a == "--peer-source-ip"));
        }
        // The proxies listen in the clients' namespace, whatever runtime
        // asks (reached once the clients' link is up: its address is
        // local only then).
        let reached = network
            .block_on(async {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    match tokio::net::TcpStream::connect(netns::peer_proxy_address(2)).await {
                        Ok(_) => return Ok(()),
                        Err(error) if tokio::time::Instant::now() >= deadline => return Err(error),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
            .expect("the clients' namespace");
        if let Err(error) = reached {
            panic!("no peer proxy in the clients' namespace: {error}");
        }
        let names = network.namespaces();
        drop(network);
        drop(cluster);
        let left = netns::list_namespaces().expect("list");
        assert!(!names.iter().any(|name| left.contains(name)), "{left:?}");
    }

    #[test]
    fn peers_share_a_private_token_unless_insecure_or_tls() {
        use std::os::unix::fs::PermissionsExt;
        let cluster = Cluster::plan(&options(2)).expect("plan");
        let token = cluster.peer_token_file().expect("a token");
        let mode = std::fs::metadata(token)
            .expect("token")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut insecure = options(2);
        insecure.insecure_peers = true;
        let cluster = Cluster::plan(&insecure).expect("plan");
        assert!(cluster.peer_token_file().is_none());
        for node in &cluster.nodes {
            assert!(args(node).iter().any(|a| a == "--insecure-peers"));
            assert_eq!(flag(node, "--peer-token-file"), None);
        }
    }

    #[test]
    fn under_fiu_a_node_starts_through_fiu_run() {
        let mut with = options(1);
        with.fiu = true;
        let cluster = Cluster::plan(&with).expect("plan");
        let control = cluster.fiu_ctrl().display().to_string();
        assert_eq!(
            cluster.nodes[0].launcher,
            ["fiu-run", "-x", "-f", control.as_str()]
        );
    }

    /// A launcher that ignores the binary and its arguments.
    fn shell(script: &str) -> Vec<String> {
        ["sh", "-c", script, "sh"].map(String::from).to_vec()
    }

    #[test]
    fn processes_are_paused_resumed_killed_restarted_and_their_exits_noticed() {
        let mut cluster = Cluster::plan(&options(2)).expect("plan");
        cluster.nodes[0].launcher = shell("exec sleep 30");
        cluster.nodes[1].launcher = shell("echo started; exit 5");
        cluster.start_all().expect("start");
        let pid = cluster.nodes[0].pid().expect("running");
        assert!(cluster.nodes[0].pause() && cluster.nodes[0].paused);
        cluster.resume(1);
        assert!(!cluster.nodes[0].paused && cluster.nodes[0].is_running());
        cluster.restart(1).expect("restart");
        assert_eq!(
            cluster.nodes[0].pid(),
            Some(pid),
            "a running node is left alone"
        );
        cluster.pause(1);
        cluster.kill(1);
        assert!(cluster.nodes[0].child.is_none() && !cluster.nodes[0].paused);
        cluster.restart(1).expect("restart");
        assert_ne!(cluster.nodes[0].pid(), Some(pid));

        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let exits = loop {
            let exits = cluster.exits();
            if !exits.is_empty() || std::time::Instant::now() > deadline {
                break exits;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(exits.len(), 1);
        assert_eq!((exits[0].0, exits[0].1), (2, Some(5)));
        assert!(cluster.nodes[1].child.is_none());
        assert!(cluster.logs().contains("--- node 2 ---\nstarted"));
        let path = cluster.dir.path().to_path_buf();
        drop(cluster);
        assert!(!path.exists(), "the folder goes with the cluster");
    }

    #[tokio::test]
    async fn a_node_joins_at_a_free_slot_and_retiring_it_frees_the_slot() {
        let mut cluster = Cluster::plan(&options(2)).expect("plan");
        cluster.template.launcher = shell("exec sleep 30");
        cluster.reserve_slots(1).await.expect("a slot");
        let slots = cluster.slots();
        assert_eq!(slots.len(), 3);
        assert_eq!(
            (slots[0].0, slots[1].0, slots[2].0),
            (Some(1), Some(2), None)
        );
        let free = slots[2].1.clone();
        assert!(matches!(
            cluster.join(7, &slots[0].1),
            Err(JoinError::Occupied(1))
        ));
        assert!(matches!(cluster.join(2, &free), Err(JoinError::Exists(2))));
        assert!(matches!(
            cluster.join(7, "127.0.0.1:1"),
            Err(JoinError::NoSuchSlot(_))
        ));
        cluster.join(7, &free).expect("joins");
        let joined = cluster.node_mut(7).expect("node 7");
        assert!(joined.is_running());
        assert_eq!(joined.client, free);
        let args = args(joined);
        assert!(args.iter().any(|a| a == "--join"));
        assert!(!args.iter().any(|a| a == "--initial-cluster"));
        assert_eq!(flag(joined, "--id").as_deref(), Some("7"));
        let data = joined.data_dir.clone();
        std::fs::create_dir_all(&data).expect("data");
        assert_eq!(cluster.slots()[2].0, Some(7));
        assert!(cluster.retire(7));
        assert!(!cluster.retire(7));
        assert!(!data.exists(), "a retired node's data goes");
        assert_eq!(cluster.slots()[2].0, None);
        assert!(cluster.exits().is_empty(), "retiring is not an exit");
        cluster
            .join(8, &free)
            .expect("a fresh node in the same slot");
    }

    #[tokio::test]
    async fn with_private_disks_every_node_s_data_is_a_tmpfs_of_its_own() {
        if let Err(why) = crate::disk::available() {
            crate::testing::missing_dependency(
                "cluster::tests::with_private_disks_every_node_s_data_is_a_tmpfs_of_its_own",
                crate::testing::Dependency::Root,
                &why,
            );
            return;
        }
        let mut with = options(2);
        with.fiu = true;
        with.private_disks = Some(DiskOptions {
            size: "4m".into(),
            lifetime: Duration::from_secs(60),
        });
        let mut cluster = Cluster::plan(&with).expect("plan");
        let disks = cluster.disks().expect("disks");
        let pid = disks.holder_pid().to_string();
        let control = cluster.fiu_ctrl().display().to_string();
        for node in &cluster.nodes {
            // Into the disks' namespace, then under fiu.
            assert_eq!(
                node.launcher,
                [
                    "nsenter", "-t", &pid, "-m", "--", "fiu-run", "-x", "-f", &control
                ]
            );
            assert!(disks.is_mounted(&node.data_dir), "{}", node.id);
        }
        // A node that joins gets a disk of its own; retired, it goes.
        cluster.template.launcher = shell("exec sleep 30");
        cluster.reserve_slots(1).await.expect("a slot");
        let free = cluster.slots()[2].1.clone();
        cluster.join(3, &free).expect("joins");
        let joined = cluster.node_mut(3).expect("node 3").data_dir.clone();
        assert!(disks.is_mounted(&joined));
        assert!(cluster.retire(3));
        assert!(!disks.is_mounted(&joined));
        drop(disks);
        drop(cluster);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the disks' namespace goes with the cluster"
        );
    }

    #[test]
    fn a_kept_folder_outlives_the_cluster() {
        let mut cluster = Cluster::plan(&options(1)).expect("plan");
        let path = cluster.dir.keep();
        drop(cluster);
        assert!(path.is_dir());
        std::fs::remove_dir_all(path).expect("clean up");
    }
}

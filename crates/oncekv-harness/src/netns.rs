//! Hosts as network namespaces: [`Network`] gives every node of a run a
//! network stack of its own, with its own address, on a private bridge,
//! and cuts the links between those hosts on demand.
//!
//! # Layout
//!
//! A run creates, with the `ip` command (iproute2; root is needed):
//!
//! * a namespace for the bridge (`<tag>-br`), holding a Linux bridge of
//!   the same name and nothing else: no address, no route;
//! * a namespace per node (`<tag>-n<id>`, id in hex) and one for the
//!   run's clients (`<tag>-cl`), each with its loopback up and one veth
//!   whose other end is a port of the bridge;
//! * addresses from [`SUBNET`] (10.77.0.0/24): the clients are
//!   [`CLIENT_HOST`] (10.77.0.2), node `id` is `10.77.0.(10 + id)`
//!   ([`node_ip`]). Every node listens on its own address, on the same
//!   ports ([`CLIENT_PORT`], [`PEER_PORT`]): no port is drawn at random, so
//!   none can be taken by someone else first.
//!
//! The veths are created directly in their namespaces (`ip link add ...
//! netns A type veth peer ... netns B`), so nothing is ever added to the
//! root namespace's interfaces, addresses or routes; the namespaces have
//! no default route and no link to the root namespace, so no packet can
//! leave them, let alone the machine. Because each interface lives in a
//! namespace of the run's own, it carries the name of that namespace: the
//! host's veth and its bridge port are both `<tag>-<role>`, each in its
//! own namespace, and the bridge is `<tag>-br`.
//!
//! # Names and clean-up
//!
//! `<tag>` is `okv<creating PID in hex>-<run id in hex>`, the run id
//! counting the networks this process made (modulo 256), so a name is at
//! most 15 characters, the limit of an interface name. Dropping the
//! [`Network`] (also while a panic unwinds) kills any process left in its
//! namespaces and deletes them, which removes the veths and the bridge
//! with them. A harness that dies without unwinding leaves its namespaces
//! behind: every [`Network::create`] first removes those whose creating
//! PID no longer exists ([`remove_leftovers`]), with whatever still runs
//! in them.
//!
//! # How clients reach the nodes
//!
//! A namespace is a property of a thread, inherited by the threads and
//! processes it starts, and a socket lives in the namespace of the thread
//! that created it. So the harness's clients run on a thread that entered
//! the client namespace ([`Network::enter_client`], `setns(2)`) before it
//! built its tokio runtime: every worker and blocking thread of that
//! runtime starts from it, and every socket the clients, the fault proxies
//! and the leader watcher open is in the client namespace, on the bridge
//! beside the nodes; the process's other threads stay where they were.
//! [`Network::block_on`] does exactly that for one future (a scoped thread
//! of its own, a runtime, the future, the runtime's shutdown); `oncekv
//! verify --topology netns` runs the whole fault run on such a thread.
//! The nodes are started as `ip netns exec <namespace> oncekv serve ...`
//! ([`Network::exec_prefix`]): `ip netns exec` enters the namespace and
//! then execs the command in the same process, so the PID the harness
//! holds is the node's own, and stopping a node by PID is unchanged.
//!
//! # Peer proxies
//!
//! Every node's peer traffic passes through a peer proxy
//! ([`crate::peer_proxy`]) in the clients' namespace: node `id` listens on
//! its own address and [`PEER_PORT`], and advertises its proxy,
//! [`CLIENT_HOST`] and [`peer_proxy_port`]`(host)`, as its peer address (its
//! `--initial-cluster` entry, `--advertise-peer`). The proxy forwards to
//! the node's own address and tells callers apart by the address they
//! call from, their host's ([`node_ip`]; the node on a host is the one a
//! membership change put there last). The proxies run on a thread of
//! their own in the clients' namespace, with a tokio runtime of its own
//! ([`Network::run_peer_proxy`]), so they serve whatever runtime the
//! harness's clients use, and stop when the network is dropped, before its
//! namespaces go. Clients reach the nodes directly, never through a peer
//! proxy.
//!
//! # Faults
//!
//! * a link down: the node's veth is set down inside its namespace
//!   ([`Network::set_link`]); the node loses its connected route, its
//!   bridge port loses carrier, and nobody (peers, their proxies or
//!   clients) reaches it until it is set up again, when the kernel
//!   restores the route;
//! * flapping links are link downs and ups in quick succession (the
//!   nemesis times them);
//! * a cut from one node to another ([`crate::cluster::Cluster::cut`]) is
//!   made twice. In the peer proxies ([`crate::peer_proxy::Partitions::cut`]):
//!   what the sender sends the receiver over their peer links is held,
//!   silently (the sender sees only silence, as on a real lossy path),
//!   until the cut heals. And in the network ([`Network::cut`]): a policy
//!   rule in the receiver's namespace, `from <sender> iif <veth>
//!   blackhole`, drops every packet the sender sends the receiver
//!   directly, past the proxies (nodes forward etcd calls to the
//!   leader's peer address, so through the proxies; the rule guards
//!   whatever else one host might send another); the proxies' packets
//!   come from [`CLIENT_HOST`] and pass. Each
//!   node's namespace moves the `local` table's rule from priority 0 to
//!   [`LOCAL_RULE_PRIORITY`] when it is made, so that the cut rules
//!   ([`CUT_RULE_PRIORITY`]) are consulted before local delivery. A
//!   one-way partition is a set of such cuts in one direction, a node cut
//!   from the leader only is the two cuts between that pair, a split is
//!   both directions between two groups, and a partition of one node both
//!   directions between it and the others; the clients' packets are never
//!   cut;
//! * a link's delay, jitter and loss are the peer proxies' shaping
//!   ([`crate::peer_proxy::Shaping`]): this kernel has no `netem`.

use crate::peer_proxy::{Hosts, Partitions, PeerProxy};
use oncekv_check::record::NodeId;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The private range the hosts' addresses come from.
pub const SUBNET: &str = "10.77.0.0/24";

/// The address of the clients' namespace.
pub const CLIENT_HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// The port every node serves clients on, on its own address.
pub const CLIENT_PORT: u16 = 7379;

/// The port every node serves its peers on, on its own address.
pub const PEER_PORT: u16 = 7380;

/// The port of host 0's peer proxy on [`CLIENT_HOST`]: host `h`'s is this
/// plus `h` ([`peer_proxy_port`]).
pub const PEER_PROXY_PORT_BASE: u16 = 7400;

/// The most nodes a network holds (their role names stay one hex digit).
pub const NODES_MAX: usize = 15;

/// The priority each node's namespace gives the `local` table's rule.
pub const LOCAL_RULE_PRIORITY: u32 = 1000;

/// The priority of the rules that cut links (before local delivery).
pub const CUT_RULE_PRIORITY: u32 = 100;

/// How every name of the runs' namespaces begins.
pub const NAME_PREFIX: &str = "okv";

/// The longest name of a Linux network interface.
const INTERFACE_NAME_MAX: usize = 15;

/// The address of node `id`: `10.77.0.(10 + id)`.
pub fn node_ip(id: NodeId) -> Ipv4Addr {
    let host = u8::try_from(10 + id.min(NODES_MAX as NodeId)).unwrap_or(u8::MAX);
    Ipv4Addr::new(10, 77, 0, host)
}

/// The port of host `host`'s peer proxy, on [`CLIENT_HOST`].
pub fn peer_proxy_port(host: NodeId) -> u16 {
    let host = u16::try_from(host.min(NODES_MAX as NodeId)).unwrap_or(0);
    PEER_PROXY_PORT_BASE + host
}

/// Where host `host`'s peer proxy listens: [`CLIENT_HOST`] and
/// [`peer_proxy_port`]`(host)`.
pub fn peer_proxy_address(host: NodeId) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(CLIENT_HOST), peer_proxy_port(host))
}

/// Whether networks of namespaces can be made here: `Ok` if this process
/// is root and `ip netns` works, else what is missing.
pub fn available() -> Result<(), String> {
    let uid = effective_uid();
    if uid != Some(0) {
        return Err(format!(
            "not root (effective uid {}): network namespaces need root",
            uid.map_or_else(|| "unknown".to_string(), |uid| uid.to_string())
        ));
    }
    ip(&["netns", "list"]).map_err(|error| format!("`ip netns` is unavailable: {error}"))?;
    Ok(())
}

/// This process's effective user id, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Runs `ip ARGS`; its standard output, or why it failed.
fn ip<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::io::Result<String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let words: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        Err(std::io::Error::other(format!(
            "ip {}: {} ({})",
            words.join(" "),
            String::from_utf8_lossy(&output.stderr).trim(),
            output.status
        )))
    }
}

/// The network namespaces of this machine, by name (`ip netns list`).
pub fn list_namespaces() -> std::io::Result<Vec<String>> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The namespaces of networks created by process `pid`.
pub fn namespaces_of(pid: u32) -> std::io::Result<Vec<String>> {
    Ok(list_namespaces()?
        .into_iter()
        .filter(|name| creator(name) == Some(pid))
        .collect())
}

/// The PID that created namespace `name`, if it is a run's.
fn creator(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let mut parts = rest.split('-');
    let pid = u32::from_str_radix(parts.next()?, 16).ok()?;
    let run = parts.next()?;
    let role = parts.next()?;
    let well_formed = parts.next().is_none()
        && !run.is_empty()
        && run.chars().all(|c| c.is_ascii_hexdigit())
        && (role == "br" || role == "cl" || (role.len() == 2 && role.starts_with('n')));
    well_formed.then_some(pid)
}

/// Kills what runs in namespace `name` (never this process) and deletes
/// it. Errors are ignored: it may be gone already.
fn delete_namespace(name: &str) {
    let own = std::process::id();
    if let Ok(pids) = ip(&["netns", "pids", name]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            if u32::try_from(pid).ok() != Some(own) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _ = ip(&["netns", "delete", name]);
}

/// Removes the namespaces of runs whose creating process no longer
/// exists, with whatever still runs in them; returns their names.
pub fn remove_leftovers() -> std::io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for name in list_namespaces()? {
        let Some(pid) = creator(&name) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            delete_namespace(&name);
            removed.push(name);
        }
    }
    Ok(removed)
}

/// The networks this process has made, for their run ids.
static RUNS: AtomicU32 = AtomicU32::new(0);

/// One run's hosts: a bridge, a namespace per host and one for the
/// clients. Removed when dropped. Host `h` has address [`node_ip`]`(h)`;
/// node `h` runs on host `h` unless it was [placed](Network::place) on
/// another (a member that joined on a host another member left).
#[derive(Debug)]
pub struct Network {
    tag: String,
    /// The hosts, by number.
    hosts: Mutex<Vec<NodeId>>,
    /// The nodes placed on a host of another number, as (node, host).
    placed: Mutex<std::collections::BTreeMap<NodeId, NodeId>>,
    /// Links cut, as (from, to): packets from `from` to `to` are dropped.
    cuts: Mutex<BTreeSet<(NodeId, NodeId)>>,
    /// Nodes whose link is down.
    down: Mutex<BTreeSet<NodeId>>,
    /// The nodes on each host, as the peer proxies tell callers apart.
    callers: Hosts,
    /// The thread the peer proxies run on, once one runs.
    proxies: Mutex<Option<ProxyThread>>,
}

/// A thread in the clients' namespace driving the tokio runtime the peer
/// proxies run on, until it is told to stop.
#[derive(Debug)]
struct ProxyThread {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProxyThread {
    /// Starts it in namespace `namespace`.
    fn start(namespace: String) -> std::io::Result<ProxyThread> {
        let (started, handle) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("peer-proxies".into())
            .spawn(move || {
                let runtime = enter(&namespace).and_then(|()| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                });
                match runtime {
                    Ok(runtime) => {
                        let _ = started.send(Ok(runtime.handle().clone()));
                        runtime.block_on(async {
                            let _ = stopped.await;
                        });
                    }
                    Err(error) => {
                        let _ = started.send(Err(error));
                    }
                }
            })?;
        let handle = handle
            .recv()
            .map_err(|_| std::io::Error::other("the peer proxies' thread ended at its start"))??;
        Ok(ProxyThread {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for ProxyThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Network {
    /// Makes the bridge, the clients' namespace and one namespace per node
    /// of `nodes`, after removing the leftovers of dead runs.
    pub fn create(nodes: &[NodeId]) -> std::io::Result<Network> {
        if let Some(&id) = nodes
            .iter()
            .find(|&&id| id == 0 || id > NODES_MAX as NodeId)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("node id {id}: a network's node ids run from 1 to {NODES_MAX}"),
            ));
        }
        remove_leftovers()?;
        let existing: BTreeSet<String> = list_namespaces()?.into_iter().collect();
        let pid = std::process::id();
        let tag = (0..256)
            .map(|_| RUNS.fetch_add(1, Ordering::Relaxed) % 256)
            .map(|run| format!("{NAME_PREFIX}{pid:x}-{run:x}"))
            .find(|tag| !existing.contains(&format!("{tag}-br")))
            .ok_or_else(|| std::io::Error::other("256 networks of this process are live"))?;
        let network = Network {
            tag,
            hosts: Mutex::new(nodes.to_vec()),
            placed: Mutex::new(std::collections::BTreeMap::new()),
            cuts: Mutex::new(BTreeSet::new()),
            down: Mutex::new(BTreeSet::new()),
            callers: Hosts::default(),
            proxies: Mutex::new(None),
        };
        // From here on, a failure drops `network`, which removes what was
        // made.
        network.build()?;
        Ok(network)
    }

    fn build(&self) -> std::io::Result<()> {
        let bridge = self.bridge_namespace();
        debug_assert!(bridge.len() <= INTERFACE_NAME_MAX, "{bridge}");
        ip(&["netns", "add", &bridge])?;
        ip(&["-n", &bridge, "link", "set", "lo", "up"])?;
        ip(&["-n", &bridge, "link", "add", &bridge, "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", &bridge, "up"])?;
        self.add_host(&self.client_namespace(), CLIENT_HOST, false)?;
        for id in self.hosts() {
            self.add_host(&self.host_namespace(id), node_ip(id), true)?;
        }
        Ok(())
    }

    /// Makes host `host` (for a member that joins later), unless it
    /// exists.
    pub fn add_node_host(&self, host: NodeId) -> std::io::Result<()> {
        if host == 0 || host > NODES_MAX as NodeId {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("host {host}: a network's hosts run from 1 to {NODES_MAX}"),
            ));
        }
        if self.hosts().contains(&host) {
            return Ok(());
        }
        self.add_host(&self.host_namespace(host), node_ip(host), true)?;
        lock(&self.hosts).push(host);
        Ok(())
    }

    /// Node `node` runs on host `host` from now on.
    pub fn place(&self, node: NodeId, host: NodeId) {
        let mut placed = lock(&self.placed);
        if node == host {
            placed.remove(&node);
        } else {
            placed.insert(node, host);
        }
    }

    /// The host node `node` runs on.
    pub fn host_of(&self, node: NodeId) -> NodeId {
        lock(&self.placed).get(&node).copied().unwrap_or(node)
    }

    /// Makes host namespace `name` with address `address` on the bridge;
    /// `cuttable`: its `local` rule moves after the cut rules.
    fn add_host(&self, name: &str, address: Ipv4Addr, cuttable: bool) -> std::io::Result<()> {
        let bridge = self.bridge_namespace();
        debug_assert!(name.len() <= INTERFACE_NAME_MAX, "{name}");
        ip(&["netns", "add", name])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        // Both ends carry the host's name, each in its own namespace.
        ip(&[
            "link", "add", name, "netns", name, "type", "veth", "peer", "name", name, "netns",
            &bridge,
        ])?;
        ip(&["-n", &bridge, "link", "set", name, "master", &bridge, "up"])?;
        let cidr = format!("{address}/24");
        ip(&["-n", name, "addr", "add", &cidr, "dev", name])?;
        ip(&["-n", name, "link", "set", name, "up"])?;
        if cuttable {
            let local = LOCAL_RULE_PRIORITY.to_string();
            ip(&["-n", name, "rule", "add", "pref", &local, "lookup", "local"])?;
            ip(&["-n", name, "rule", "del", "pref", "0"])?;
        }
        Ok(())
    }

    /// Runs host `host`'s peer proxy in the clients' namespace, on
    /// [`CLIENT_HOST`] and [`peer_proxy_port`]`(host)`, forwarding to the
    /// host's address and [`PEER_PORT`] for the node `occupant` holds
    /// (0: none), under `partitions`; returns its address. The node
    /// `occupant` holds is also the one calling from the host's address,
    /// as every peer proxy of the network knows callers.
    pub fn run_peer_proxy(
        &self,
        host: NodeId,
        occupant: Arc<AtomicU64>,
        partitions: Partitions,
    ) -> std::io::Result<SocketAddr> {
        let address = peer_proxy_address(host);
        let upstream = SocketAddr::new(IpAddr::V4(node_ip(host)), PEER_PORT);
        self.callers
            .add(IpAddr::V4(node_ip(host)), occupant.clone());
        let handle = {
            let mut proxies = lock(&self.proxies);
            if proxies.is_none() {
                *proxies = Some(ProxyThread::start(self.client_namespace())?);
            }
            proxies.as_ref().map(|thread| thread.handle.clone())
        }
        .ok_or_else(|| std::io::Error::other("no peer proxies' thread"))?;
        let (bound, outcome) = std::sync::mpsc::channel();
        let callers = self.callers.clone();
        handle.spawn(async move {
            let listener = tokio::net::TcpListener::bind(address).await;
            let result = listener.map(|listener| {
                PeerProxy::run_between_hosts(listener, occupant, upstream, callers, partitions);
            });
            let _ = bound.send(result);
        });
        outcome
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| std::io::Error::other(format!("binding the peer proxy {address}")))??;
        Ok(address)
    }

    /// What every name of this network begins with: `okv<pid>-<run>`.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Its hosts' numbers (node `h` runs on host `h` unless placed
    /// elsewhere).
    pub fn hosts(&self) -> Vec<NodeId> {
        lock(&self.hosts).clone()
    }

    /// The bridge's namespace (and the bridge's name in it).
    pub fn bridge_namespace(&self) -> String {
        format!("{}-br", self.tag)
    }

    /// The clients' namespace (and its veth's name).
    pub fn client_namespace(&self) -> String {
        format!("{}-cl", self.tag)
    }

    /// The namespace of the host node `id` runs on (and its veth's name).
    pub fn namespace(&self, id: NodeId) -> String {
        self.host_namespace(self.host_of(id))
    }

    /// Host `host`'s namespace (and its veth's name).
    fn host_namespace(&self, host: NodeId) -> String {
        format!("{}-n{host:x}", self.tag)
    }

    /// Every namespace of this network.
    pub fn namespaces(&self) -> Vec<String> {
        let mut names = vec![self.bridge_namespace(), self.client_namespace()];
        names.extend(self.hosts().into_iter().map(|id| self.host_namespace(id)));
        names
    }

    /// The command a process of node `id` is started through:
    /// `ip netns exec <namespace>`.
    pub fn exec_prefix(&self, id: NodeId) -> Vec<String> {
        ["ip", "netns", "exec"]
            .iter()
            .map(|s| (*s).to_string())
            .chain([self.namespace(id)])
            .collect()
    }

    /// Moves the calling thread into the clients' namespace: the sockets
    /// it creates from now on, and the threads and processes it starts,
    /// are there. The process's other threads are not moved.
    pub fn enter_client(&self) -> std::io::Result<()> {
        enter(&self.client_namespace())
    }

    /// Runs `future` to completion on a thread of its own in the clients'
    /// namespace, on a tokio runtime built there (so every thread of it is
    /// there too). A panic of the future is resumed in the caller.
    pub fn block_on<F>(&self, future: F) -> std::io::Result<F::Output>
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                self.enter_client()?;
                let runtime = client_runtime()?;
                let output = runtime.block_on(future);
                runtime.shutdown_timeout(Duration::from_secs(5));
                Ok(output)
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Sets node `id`'s link (its veth, inside its namespace) down or up.
    pub fn set_link(&self, id: NodeId, up: bool) -> std::io::Result<()> {
        let name = self.namespace(id);
        ip(&[
            "-n",
            &name,
            "link",
            "set",
            &name,
            if up { "up" } else { "down" },
        ])?;
        let mut down = lock(&self.down);
        if up {
            down.remove(&id);
        } else {
            down.insert(id);
        }
        Ok(())
    }

    /// Drops every packet node `from` sends node `to` directly (one
    /// direction); their peer traffic passes through the peer proxies,
    /// where [`crate::cluster::Cluster::cut`] cuts it too.
    pub fn cut(&self, from: NodeId, to: NodeId) -> std::io::Result<()> {
        if from == to || lock(&self.cuts).contains(&(from, to)) {
            return Ok(());
        }
        ip(&self.cut_rule("add", from, to))?;
        lock(&self.cuts).insert((from, to));
        Ok(())
    }

    /// Lets packets from `from` reach `to` again.
    pub fn uncut(&self, from: NodeId, to: NodeId) -> std::io::Result<()> {
        if !lock(&self.cuts).contains(&(from, to)) {
            return Ok(());
        }
        ip(&self.cut_rule("del", from, to))?;
        lock(&self.cuts).remove(&(from, to));
        Ok(())
    }

    fn cut_rule(&self, verb: &str, from: NodeId, to: NodeId) -> Vec<String> {
        let receiver = self.namespace(to);
        [
            "-n",
            &receiver,
            "rule",
            verb,
            "pref",
            &CUT_RULE_PRIORITY.to_string(),
            "from",
            &node_ip(self.host_of(from)).to_string(),
            "iif",
            &receiver,
            "blackhole",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect()
    }

    /// Cuts both directions between every node of `side` and every node
    /// of `other`.
    pub fn split(&self, side: &[NodeId], other: &[NodeId]) -> std::io::Result<()> {
        for &a in side {
            for &b in other {
                self.cut(a, b)?;
                self.cut(b, a)?;
            }
        }
        Ok(())
    }

    /// The links cut, as (from, to).
    pub fn cuts(&self) -> BTreeSet<(NodeId, NodeId)> {
        lock(&self.cuts).clone()
    }

    /// The nodes whose link is down.
    pub fn links_down(&self) -> BTreeSet<NodeId> {
        lock(&self.down).clone()
    }

    /// Ends every fault: all links up, no cut. Tries every repair; the
    /// first failure, if any.
    pub fn heal(&self) -> std::io::Result<()> {
        let mut result = Ok(());
        for id in self.links_down() {
            if let Err(error) = self.set_link(id, true) {
                result = result.and(Err(error));
            }
        }
        for (from, to) in self.cuts() {
            if let Err(error) = self.uncut(from, to) {
                result = result.and(Err(error));
            }
        }
        result
    }

    /// Deletes the namespaces (and with them the veths and the bridge),
    /// killing what still runs in them.
    fn remove(&self) {
        let mine = format!("{}-", self.tag);
        let names = list_namespaces().unwrap_or_else(|_| self.namespaces());
        for name in names.iter().filter(|name| name.starts_with(&mine)) {
            delete_namespace(name);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // The proxies stop before their namespace goes.
        drop(lock(&self.proxies).take());
        self.remove();
    }
}

/// Moves the calling thread into namespace `name` (`setns(2)`).
fn enter(name: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(Path::new("/run/netns").join(name))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|errno| std::io::Error::other(format!("setns into {name}: {errno}")))
}

/// A tokio runtime for the clients, built on the calling thread.
fn client_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_an_interface_and_name_their_creator() {
        let tag = format!("{NAME_PREFIX}{:x}-{:x}", 0x3f_ffff, 255);
        for role in ["br", "cl", "n1", "nf"] {
            let name = format!("{tag}-{role}");
            assert!(name.len() <= INTERFACE_NAME_MAX, "{name}");
            assert_eq!(creator(&name), Some(0x3f_ffff), "{name}");
        }
        for foreign in [
            "okv",
            "okvzz-1-br",
            "okv12-1-xx",
            "okv12-1-n1-x",
            "cni-1234",
            "okv12--br",
        ] {
            assert_eq!(creator(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn every_node_has_its_own_address_on_the_clients_subnet() {
        let ips: BTreeSet<Ipv4Addr> = (1..=NODES_MAX as NodeId).map(node_ip).collect();
        assert_eq!(ips.len(), NODES_MAX);
        assert!(!ips.contains(&CLIENT_HOST));
        for ip in ips.iter().chain([&CLIENT_HOST]) {
            assert!(ip.is_private() && ip.octets()[..3] == [10, 77, 0], "{ip}");
        }
    }

    /// A network of two nodes, when this machine allows one.
    fn network() -> Option<Network> {
        match available() {
            Ok(()) => Some(Network::create(&[1, 2]).expect("a network")),
            Err(why) => {
                crate::testing::missing_dependency(
                    "netns::tests",
                    crate::testing::Dependency::NetworkNamespaces,
                    &why,
                );
                None
            }
        }
    }

    /// Whether a TCP connection from the calling thread's namespace
    /// reaches `to` within a second.
    async fn reaches(to: std::net::SocketAddr) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(to)).await,
            Ok(Ok(_))
        )
    }

    #[test]
    fn hosts_reach_each_other_on_the_bridge_and_are_removed_on_drop() {
        let Some(network) = network() else { return };
        let names = network.namespaces();
        let listed = list_namespaces().expect("list");
        assert!(names.iter().all(|name| listed.contains(name)), "{listed:?}");
        // Nothing of the network in the root namespace.
        let root = ip(&["-o", "addr"]).expect("addresses");
        assert!(!root.contains("10.77.0."), "{root}");
        assert!(!ip(&["link"]).expect("links").contains(network.tag()));
        // A listener in node 1's namespace, reached from the clients'.
        let server = std::process::Command::new("ip")
            .args(["netns", "exec", &network.namespace(1)])
            .args(["sleep", "30"])
            .spawn()
            .expect("a process in node 1's namespace");
        // `ip netns exec` enters the namespace, then execs the command in
        // the same process: the PID is the command's.
        let pid = server.id().to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let pids = ip(&["netns", "pids", &network.namespace(1)]).expect("pids");
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if pids.split_whitespace().any(|p| p == pid) && exe.ends_with("sleep") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{pids} {exe:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let reached = network
            .block_on(async {
                let listener = tokio::net::TcpListener::bind((CLIENT_HOST, 0))
                    .await
                    .expect("the clients' address is here");
                let address = listener.local_addr().expect("address");
                let accept = tokio::spawn(async move { listener.accept().await.is_ok() });
                reaches(address).await && accept.await.unwrap_or(false)
            })
            .expect("the clients' namespace");
        assert!(reached);
        drop(network);
        let listed = list_namespaces().expect("list");
        assert!(
            !names.iter().any(|name| listed.contains(name)),
            "{listed:?}"
        );
        let mut server = server;
        let status = server.wait().expect("reaped");
        assert!(!status.success(), "the process left in it was killed");
    }

    #[test]
    fn a_panic_removes_the_network_as_it_unwinds() {
        let Some(network) = network() else { return };
        let names = network.namespaces();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _network = network;
            panic!("a failing run");
        }));
        assert!(unwound.is_err());
        let listed = list_namespaces().expect("list");
        assert!(
            !names.iter().any(|name| listed.contains(name)),
            "{listed:?}"
        );
    }

    #[test]
    fn the_namespaces_of_dead_runs_are_removed_and_live_ones_kept() {
        if let Err(why) = available() {
            crate::testing::missing_dependency(
                "netns::tests::the_namespaces_of_dead_runs_are_removed_and_live_ones_kept",
                crate::testing::Dependency::NetworkNamespaces,
                &why,
            );
            return;
        }
        let dead = (0x30_0000..0x3f_ffff_u32)
            .rev()
            .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            .expect("a PID nobody has");
        let leftover = format!("{NAME_PREFIX}{dead:x}-0-br");
        let live = format!("{NAME_PREFIX}{:x}-ff-cl", std::process::id());
        ip(&["netns", "add", &leftover]).expect("a leftover");
        ip(&["netns", "add", &live]).expect("a live one");
        // (Another process may remove the leftover first.)
        remove_leftovers().expect("removed");
        let listed = list_namespaces().expect("list");
        delete_namespace(&live);
        assert!(
            !listed.contains(&leftover) && listed.contains(&live),
            "{listed:?}"
        );
    }

    #[test]
    fn a_link_goes_down_and_up_and_cuts_come_and_go() {
        let Some(network) = network() else { return };
        network.set_link(1, false).expect("down");
        assert_eq!(network.links_down(), BTreeSet::from([1]));
        let state = ip(&[
            "-n",
            &network.namespace(1),
            "link",
            "show",
            &network.namespace(1),
        ])
        .expect("link");
        assert!(!state.contains(",UP"), "{state}");
        network.split(&[1], &[2]).expect("split");
        assert_eq!(network.cuts(), BTreeSet::from([(1, 2), (2, 1)]));
        let rules = ip(&["-n", &network.namespace(2), "rule"]).expect("rules");
        assert!(
            rules.contains("from 10.77.0.11") && rules.contains("blackhole"),
            "{rules}"
        );
        network.heal().expect("heal");
        assert!(network.cuts().is_empty() && network.links_down().is_empty());
        let rules = ip(&["-n", &network.namespace(2), "rule"]).expect("rules");
        assert!(!rules.contains("blackhole"), "{rules}");
        let state = ip(&[
            "-n",
            &network.namespace(1),
            "link",
            "show",
            &network.namespace(1),
        ])
        .expect("link");
        assert!(state.contains(",UP"), "{state}");
    }
}

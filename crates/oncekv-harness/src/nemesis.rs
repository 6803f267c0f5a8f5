//! The nemesis: injects faults on a seeded schedule and records each one's
//! window. Kinds ([`Fault`]): SIGKILL and restart of the leader or a
//! follower, SIGSTOP pauses longer than the election timeout, replies
//! dropped by the client proxies after the node committed, delayed
//! replies, reset client connections, peer-link partitions, and (where
//! `fiu-run`/`fiu-ctrl` are installed) failing disk syncs on one node.
//!
//! Between hosts of their own ([`crate::netns`], the netns topology) the
//! network itself fails ([`Fault::NETWORK`]): a node's link goes down, a
//! node's packets to its peers (or theirs to it) are dropped one way, a
//! follower is cut from the leader only, the cluster splits into a
//! minority and a majority (2/3 of five), and a node's link flaps. There
//! a cut is silent, in the peer proxies and in the network
//! ([`Cluster::cut`]), and a partition is a cut of both directions between
//! the node and the others. The links heal
//! at the end of each fault's window; a failure to make or heal one is
//! kept in [`Nemesis::failures`].
//!
//! Asked for by name, on either topology, the membership changes
//! ([`crate::membership`]): leadership handed over, a learner added and
//! promoted, a follower or the leader removed, a member replaced, the
//! cluster grown by two and shrunk back, a rolling restart. Each runs its
//! steps to the end (each bounded, waiting on what the nodes report), so
//! its window is as long as the change takes.
//!
//! Asked for by name, on either topology, where the run started the
//! nodes, a peer link slows ([`Fault::SlowLink`]): the peer proxies delay, jitter and lose
//! what a node and another send each other, both ways.
//!
//! Asked for by name, where each node's data directory is a disk of its
//! own ([`crate::disk`], root only), a node's disk fills up
//! ([`Fault::FullDisk`]): the node must stop on it (exit code 12), and
//! once the disk is freed it is started again and catches up.

use crate::client_proxy::{ClientProxy, ReplyFault};
use crate::cluster::{Cluster, Topology};
use crate::membership::Changes;
use crate::netns::Network;
use crate::peer_proxy::{LinkShape, Spread};
use crate::recorder::Recorder;
use oncekv_check::record::{FaultKind, NodeId};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long a node given failing syncs is waited for to exit before it
/// is started again (one that syncs nothing meanwhile keeps running).
const SYNC_STOP_MAX: Duration = Duration::from_secs(3);

/// The share of a slowed link's chunks lost ([`Fault::SlowLink`]).
const SLOW_LINK_LOSS_PERCENT: f64 = 10.0;

/// How long a node whose disk was filled is waited for to stop on it:
/// under load its next log write, within milliseconds, needs a block.
const DISK_STOP_MAX: Duration = Duration::from_secs(20);

/// A kind of fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// SIGKILL a node, restart it later on the same data.
    Kill,
    /// SIGSTOP a node for longer than the election timeout.
    Pause,
    /// Drop replies after commit.
    DropReply,
    /// Delay replies.
    Delay,
    /// Reset client connections.
    Reset,
    /// Cut a node off from its peers.
    Partition,
    /// Make a node's disk syncs fail.
    Fsync,
    /// Flood the cluster with sessions and idempotency keys.
    Flood,
    /// Set a node's link down, then up (between namespaces).
    LinkDown,
    /// Drop a node's packets to every peer, or every peer's to it: one
    /// direction only (between namespaces).
    OneWay,
    /// Cut a follower from the leader only, both ways (between
    /// namespaces).
    CutLeader,
    /// Split the cluster into a minority and a majority, both ways
    /// (between namespaces).
    Split,
    /// Take a node's link down and up again and again (between
    /// namespaces).
    Flap,
    /// Hand leadership to a follower (MoveLeader).
    Transfer,
    /// Add a learner, let it catch up, promote it; then remove a
    /// follower.
    Learner,
    /// Remove a follower (cut off first, the first time, so it misses its
    /// removal); then add a fresh member.
    RemoveFollower,
    /// Remove the leader; then add a fresh member.
    RemoveLeader,
    /// Stop a member, wipe its data, remove it, add a fresh member at its
    /// addresses.
    Replace,
    /// Grow by two members, then shrink by two (3 -> 5 -> 3).
    GrowShrink,
    /// Restart every member in turn, the leader last.
    RollingRestart,
    /// Fill a node's disk (its data directory, a tmpfs of its own): it
    /// must stop (exit code 12); then free it and start the node again.
    FullDisk,
    /// Slow the peer link between a node and another, both ways: a delay
    /// of 50 to 200 ms with as much jitter, and 10% of its chunks lost
    /// (each a retransmission timeout late), in the peer proxies.
    SlowLink,
}

impl Fault {
    /// Every kind, in the order of `--faults`.
    pub const ALL: [Fault; 22] = [
        Fault::Kill,
        Fault::Pause,
        Fault::DropReply,
        Fault::Delay,
        Fault::Reset,
        Fault::Partition,
        Fault::Fsync,
        Fault::Flood,
        Fault::LinkDown,
        Fault::OneWay,
        Fault::CutLeader,
        Fault::Split,
        Fault::Flap,
        Fault::Transfer,
        Fault::Learner,
        Fault::RemoveFollower,
        Fault::RemoveLeader,
        Fault::Replace,
        Fault::GrowShrink,
        Fault::RollingRestart,
        Fault::FullDisk,
        Fault::SlowLink,
    ];

    /// The kinds made in the network between hosts of their own: only on
    /// the netns topology.
    pub const NETWORK: [Fault; 5] = [
        Fault::LinkDown,
        Fault::OneWay,
        Fault::CutLeader,
        Fault::Split,
        Fault::Flap,
    ];

    /// The kinds a run on `topology` injects unless told otherwise: all
    /// that can run there, but those asked for by name only
    /// ([`Fault::by_name_only`]).
    pub fn defaults(topology: Topology) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| topology == Topology::Netns || !f.needs_namespaces())
            .filter(|f| !f.by_name_only())
            .collect()
    }

    /// Whether a run injects it only when asked for by name: the
    /// membership changes ([`crate::membership::KINDS`]: each takes
    /// seconds, and a short run would not reach the others), the full
    /// disk (it mounts a disk for each node, as root, and its window lasts
    /// until the node caught up again), and the slow link (so the default
    /// schedules of earlier runs replay unchanged).
    pub fn by_name_only(self) -> bool {
        self.changes_membership() || matches!(self, Fault::FullDisk | Fault::SlowLink)
    }

    /// Whether it changes the cluster's membership or leadership on
    /// purpose ([`crate::membership`]).
    pub fn changes_membership(self) -> bool {
        crate::membership::KINDS.contains(&self)
    }

    /// Whether it is made in the network between hosts of their own
    /// (the netns topology).
    pub fn needs_namespaces(self) -> bool {
        Fault::NETWORK.contains(&self)
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::DropReply => "drop-reply",
            Fault::Delay => "delay",
            Fault::Reset => "reset",
            Fault::Partition => "partition",
            Fault::Fsync => "fsync",
            Fault::Flood => "flood",
            Fault::LinkDown => "link-down",
            Fault::OneWay => "one-way",
            Fault::CutLeader => "cut-leader",
            Fault::Split => "split",
            Fault::Flap => "flap",
            Fault::Transfer => "transfer",
            Fault::Learner => "add-learner",
            Fault::RemoveFollower => "remove-follower",
            Fault::RemoveLeader => "remove-leader",
            Fault::Replace => "replace",
            Fault::GrowShrink => "grow-shrink",
            Fault::RollingRestart => "rolling-restart",
            Fault::FullDisk => "full-disk",
            Fault::SlowLink => "slow-link",
        }
    }

    /// Parses a name of [`Fault::name`].
    pub fn parse(text: &str) -> Result<Fault, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == text.trim())
            .ok_or_else(|| {
                let names: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault `{text}` (known: {})", names.join(", "))
            })
    }

    /// Whether it needs the nodes' processes (not available against an
    /// existing cluster).
    pub fn needs_processes(self) -> bool {
        matches!(
            self,
            Fault::Kill
                | Fault::Pause
                | Fault::Partition
                | Fault::Fsync
                | Fault::Flood
                | Fault::FullDisk
                | Fault::SlowLink
        ) || self.needs_namespaces()
            || self.changes_membership()
    }

    /// Whether it moves leadership (its first window takes the leader
    /// off the majority for longer than the election timeout).
    pub fn disturbs_leadership(self) -> bool {
        matches!(
            self,
            Fault::Kill
                | Fault::Pause
                | Fault::Partition
                | Fault::LinkDown
                | Fault::Split
                | Fault::Transfer
                | Fault::RemoveLeader
                | Fault::Replace
                | Fault::RollingRestart
                | Fault::FullDisk
        )
    }

    /// The kind recorded in the history: the network faults are
    /// partitions (their detail says which), flapping and slow links are
    /// failing links (`message_loss`), a full disk is `other` (its detail says
    /// `disk of node N full`).
    pub fn kind(self) -> FaultKind {
        match self {
            Fault::Kill => FaultKind::Kill,
            Fault::Pause => FaultKind::Pause,
            Fault::DropReply => FaultKind::DropReplies,
            Fault::Delay => FaultKind::Delay,
            Fault::Reset => FaultKind::Reset,
            Fault::Partition => FaultKind::Partition,
            Fault::Fsync => FaultKind::FsyncFailure,
            Fault::Flood => FaultKind::Flood,
            Fault::LinkDown | Fault::OneWay | Fault::CutLeader | Fault::Split => {
                FaultKind::Partition
            }
            Fault::Flap | Fault::SlowLink => FaultKind::MessageLoss,
            Fault::Transfer => FaultKind::LeaderTransfer,
            Fault::RollingRestart => FaultKind::Restart,
            Fault::Learner
            | Fault::RemoveFollower
            | Fault::RemoveLeader
            | Fault::Replace
            | Fault::GrowShrink
            | Fault::FullDisk => FaultKind::Other,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `fiu-run` and `fiu-ctrl` are on `PATH`.
pub fn fiu_available() -> bool {
    ["fiu-run", "fiu-ctrl"].iter().all(|tool| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
    })
}

/// What the nemesis works on.
#[derive(Debug)]
pub struct Nemesis {
    /// The kinds to inject.
    pub faults: Vec<Fault>,
    /// The cluster's processes, when the run started them.
    pub cluster: Option<Arc<Mutex<Cluster>>>,
    /// The client proxies.
    pub proxies: Vec<ClientProxy>,
    /// The leader last observed (0: none).
    pub leader: Arc<AtomicU64>,
    /// The nodes' minimum election timeout.
    pub election_timeout: Duration,
    /// Where faults are recorded.
    pub recorder: Arc<Recorder>,
    /// Seeds the schedule.
    pub seed: u64,
    /// Faults that could not be made or healed (an `ip` command that
    /// failed), for the run's report.
    pub failures: Arc<Mutex<Vec<String>>>,
    /// Set once every kind has been injected once (the first round of
    /// the schedule is over), or there is none to inject: the run goes on
    /// until then ([`crate::run`]), within a bound.
    pub first_round_done: Arc<AtomicBool>,
    /// What removed members did that they must not (led, or were
    /// followed), for the run's verdict: a violation.
    pub disruptions: Arc<Mutex<Vec<String>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Nemesis {
    /// Injects faults until `stop` is set, then heals everything.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x6e65_6d65_7369_7321);
        let network = self.network();
        let faults: Vec<Fault> = self
            .faults
            .iter()
            .copied()
            .filter(|f| !f.needs_processes() || self.cluster.is_some())
            .filter(|f| !f.needs_namespaces() || network.is_some())
            .collect();
        // Round-robin over a shuffled order, so a short run sees every kind.
        let mut order = Vec::new();
        let mut rounds = 0u32;
        while !*stop.borrow() && !faults.is_empty() {
            if order.is_empty() {
                rounds += 1;
                order = faults.clone();
                order.reverse();
                let len = order.len();
                for i in (1..len).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
            }
            let gap = Duration::from_millis(rng.random_range(300..900));
            if sleep_or_stop(gap, &mut stop).await {
                break;
            }
            let Some(fault) = order.pop() else { break };
            let hold = Duration::from_millis(rng.random_range(800..2_000));
            self.inject(fault, hold, rounds == 1, &mut rng, &mut stop)
                .await;
            if order.is_empty() {
                self.first_round_done.store(true, Ordering::Relaxed);
            }
        }
        self.first_round_done.store(true, Ordering::Relaxed);
        self.heal();
    }

    /// The hosts' network, on the netns topology.
    fn network(&self) -> Option<Arc<Network>> {
        self.cluster.as_ref().and_then(|c| lock(c).network())
    }

    /// Keeps a failure to make or heal a fault.
    fn failed(&self, what: String) {
        lock(&self.failures).push(what);
    }

    /// Runs `change` on the network, keeping its failure, if any.
    fn change(&self, what: &str, change: impl FnOnce() -> std::io::Result<()>) {
        if let Err(error) = change() {
            self.failed(format!("{what}: {error}"));
        }
    }

    fn nodes(&self) -> Vec<NodeId> {
        self.cluster
            .as_ref()
            .map(|c| lock(c).nodes.iter().map(|n| n.id).collect())
            .unwrap_or_default()
    }

    /// The leader the first time (so even a short run moves leadership),
    /// then the leader with probability one half, else any node.
    fn target(&self, first: bool, rng: &mut StdRng) -> Option<NodeId> {
        let nodes = self.nodes();
        let leader = self.leader.load(Ordering::Relaxed);
        if leader != 0 && (first || rng.random_bool(0.5)) && nodes.contains(&leader) {
            return Some(leader);
        }
        nodes.choose(rng).copied()
    }

    async fn inject(
        &self,
        fault: Fault,
        hold: Duration,
        first: bool,
        rng: &mut StdRng,
        stop: &mut watch::Receiver<bool>,
    ) {
        let recorder = &self.recorder;
        match fault {
            Fault::Kill | Fault::Pause | Fault::Fsync => {
                let (Some(cluster), Some(target)) = (&self.cluster, self.target(first, rng)) else {
                    return;
                };
                let hold = if fault == Fault::Pause {
                    hold.max(self.election_timeout * 2)
                } else {
                    hold
                };
                let id = recorder.fault_started(fault.kind(), Some(target), None);
                match fault {
                    Fault::Kill => lock(cluster).kill(target),
                    Fault::Pause => lock(cluster).pause(target),
                    _ => fiu_syncs(&lock(cluster), target, true),
                }
                sleep_or_stop(hold, stop).await;
                if !matches!(fault, Fault::Kill | Fault::Pause) {
                    fiu_syncs(&lock(cluster), target, false);
                    // A node that failed a sync stops, which takes it a
                    // moment: wait for its exit (a bounded while) so that
                    // it is started again, not found still running.
                    let exiting = tokio::time::Instant::now() + SYNC_STOP_MAX;
                    while tokio::time::Instant::now() < exiting
                        && lock(cluster)
                            .node_mut(target)
                            .is_some_and(|node| node.is_running())
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                let mut cluster = lock(cluster);
                match fault {
                    Fault::Kill => {
                        let _ = cluster.restart(target);
                    }
                    Fault::Pause => cluster.resume(target),
                    _ => {
                        // A node that stopped on a failed sync starts again.
                        let _ = cluster.restart(target);
                    }
                }
                recorder.fault_ended(id);
            }
            Fault::Partition => {
                let (Some(cluster), Some(target)) = (&self.cluster, self.target(first, rng)) else {
                    return;
                };
                let others: Vec<NodeId> =
                    self.nodes().into_iter().filter(|&n| n != target).collect();
                let detail = format!("{target} | {others:?}");
                let id = recorder.fault_started(fault.kind(), Some(target), Some(detail));
                let between_hosts = lock(cluster).network().is_some();
                if between_hosts {
                    self.change("partition", || {
                        lock(cluster).cut_between(&[target], &others)
                    });
                } else {
                    lock(cluster).partitions().split(&[target], &others);
                }
                sleep_or_stop(hold, stop).await;
                self.change("healing a partition", || lock(cluster).heal_cuts());
                recorder.fault_ended(id);
            }
            Fault::LinkDown | Fault::OneWay | Fault::CutLeader | Fault::Split | Fault::Flap => {
                self.inject_network(fault, hold, first, rng, stop).await;
            }
            Fault::Transfer
            | Fault::Learner
            | Fault::RemoveFollower
            | Fault::RemoveLeader
            | Fault::Replace
            | Fault::GrowShrink
            | Fault::RollingRestart => {
                let Some(cluster) = &self.cluster else { return };
                let changes = Changes {
                    cluster,
                    proxies: &self.proxies,
                    recorder,
                    election_timeout: self.election_timeout,
                    disruptions: &self.disruptions,
                };
                if let Err(error) = changes.make(fault, first, rng).await {
                    self.failed(error.to_string());
                }
            }
            Fault::FullDisk => self.fill_disk(hold, first, rng, stop).await,
            Fault::SlowLink => self.slow_link(hold, first, rng, stop).await,
            Fault::DropReply | Fault::Delay => {
                let reply_fault = if fault == Fault::DropReply {
                    ReplyFault::Drop { probability: 0.5 }
                } else {
                    ReplyFault::Delay {
                        min: Duration::from_millis(50),
                        max: Duration::from_millis(400),
                    }
                };
                let id = recorder.fault_started(fault.kind(), None, None);
                self.proxies.iter().for_each(|p| p.set_fault(reply_fault));
                sleep_or_stop(hold, stop).await;
                self.proxies
                    .iter()
                    .for_each(|p| p.set_fault(ReplyFault::None));
                recorder.fault_ended(id);
            }
            Fault::Flood => {
                let Some(cluster) = &self.cluster else { return };
                let addresses: Vec<String> = lock(cluster)
                    .nodes
                    .iter()
                    .map(|n| n.client.clone())
                    .collect();
                let id = recorder.fault_started(fault.kind(), None, None);
                crate::flood::flood(&addresses, hold, rng.random(), stop).await;
                recorder.fault_ended(id);
            }
            Fault::Reset => {
                let id = recorder.fault_started(fault.kind(), None, None);
                for _ in 0..3 {
                    self.proxies.iter().for_each(ClientProxy::reset_connections);
                    if sleep_or_stop(hold / 3, stop).await {
                        break;
                    }
                }
                recorder.fault_ended(id);
            }
        }
    }

    /// Injects one of [`Fault::NETWORK`] and heals it after `hold`.
    async fn inject_network(
        &self,
        fault: Fault,
        hold: Duration,
        first: bool,
        rng: &mut StdRng,
        stop: &mut watch::Receiver<bool>,
    ) {
        let (Some(cluster), Some(network), Some(target)) =
            (&self.cluster, self.network(), self.target(first, rng))
        else {
            return;
        };
        let cut = |from: NodeId, to: NodeId| lock(cluster).cut(from, to);
        let heal = || lock(cluster).heal_cuts();
        let nodes = self.nodes();
        let others: Vec<NodeId> = nodes.iter().copied().filter(|&n| n != target).collect();
        // Long enough for the others to elect a leader without the target.
        let hold = hold.max(self.election_timeout * 2);
        let recorder = &self.recorder;
        let (target, detail): (NodeId, String) = match fault {
            Fault::LinkDown => (target, format!("link of node {target} down")),
            Fault::Flap => (target, format!("link of node {target} flapping")),
            Fault::OneWay => {
                let outbound = rng.random_bool(0.5);
                let detail = if outbound {
                    format!("one-way: {target} -> {others:?} dropped")
                } else {
                    format!("one-way: {others:?} -> {target} dropped")
                };
                let id = recorder.fault_started(fault.kind(), Some(target), Some(detail));
                self.change("one-way partition", || {
                    others.iter().try_for_each(|&other| {
                        if outbound {
                            cut(target, other)
                        } else {
                            cut(other, target)
                        }
                    })
                });
                sleep_or_stop(hold, stop).await;
                self.change("healing a one-way partition", heal);
                recorder.fault_ended(id);
                return;
            }
            Fault::CutLeader => {
                let leader = self.leader.load(Ordering::Relaxed);
                let followers: Vec<NodeId> =
                    nodes.iter().copied().filter(|&n| n != leader).collect();
                let Some(&follower) = followers.choose(rng) else {
                    return;
                };
                if !nodes.contains(&leader) {
                    return;
                }
                let detail = format!("node {follower} cut from the leader {leader} only");
                let id = recorder.fault_started(fault.kind(), Some(follower), Some(detail));
                self.change("cutting a node from the leader", || {
                    lock(cluster).cut_between(&[follower], &[leader])
                });
                sleep_or_stop(hold, stop).await;
                self.change("healing a cut from the leader", heal);
                recorder.fault_ended(id);
                return;
            }
            _ => {
                // Split: a minority (two of five, one of three) with the
                // target, the leader the first time.
                let mut rest = others.clone();
                let mut minority = vec![target];
                while minority.len() < nodes.len() / 2 && !rest.is_empty() {
                    minority.push(rest.swap_remove(rng.random_range(0..rest.len())));
                }
                minority.sort_unstable();
                rest.sort_unstable();
                let detail = format!("split {minority:?} | {rest:?}");
                let id = recorder.fault_started(fault.kind(), Some(target), Some(detail));
                self.change("splitting the cluster", || {
                    lock(cluster).cut_between(&minority, &rest)
                });
                sleep_or_stop(hold, stop).await;
                self.change("healing a split", heal);
                recorder.fault_ended(id);
                return;
            }
        };
        let id = recorder.fault_started(fault.kind(), Some(target), Some(detail));
        if fault == Fault::LinkDown {
            self.change("a link down", || network.set_link(target, false));
            sleep_or_stop(hold, stop).await;
        } else {
            // Down and up in turns, each for 100 to 500 ms.
            let began = tokio::time::Instant::now();
            let mut up = true;
            while began.elapsed() < hold {
                up = !up;
                self.change("a flapping link", || network.set_link(target, up));
                let turn = Duration::from_millis(rng.random_range(100..500));
                if sleep_or_stop(turn, stop).await {
                    break;
                }
            }
        }
        self.change("a link up", || network.set_link(target, true));
        recorder.fault_ended(id);
    }

    /// Slows the peer link between a node (the leader the first time) and
    /// another, both ways, for `hold`; then gives it every link's shape
    /// again.
    async fn slow_link(
        &self,
        hold: Duration,
        first: bool,
        rng: &mut StdRng,
        stop: &mut watch::Receiver<bool>,
    ) {
        let (Some(cluster), Some(target)) = (&self.cluster, self.target(first, rng)) else {
            return;
        };
        let others: Vec<NodeId> = self.nodes().into_iter().filter(|&n| n != target).collect();
        let Some(&other) = others.choose(rng) else {
            return;
        };
        let delay = Duration::from_millis(rng.random_range(50..=200));
        let slow = match LinkShape::new(delay, delay, Spread::Uniform, SLOW_LINK_LOSS_PERCENT) {
            Ok(slow) => slow,
            Err(error) => {
                self.failed(format!("slow-link: {error}"));
                return;
            }
        };
        let shaping = lock(cluster).partitions().shaping().clone();
        let detail = format!(
            "slow link {target} <-> {other}: {delay:?} one way, jitter {delay:?}, \
             {SLOW_LINK_LOSS_PERCENT}% lost"
        );
        let id = self
            .recorder
            .fault_started(Fault::SlowLink.kind(), Some(target), Some(detail));
        shaping.set_link(target, other, slow);
        shaping.set_link(other, target, slow);
        sleep_or_stop(hold, stop).await;
        shaping.clear_link(target, other);
        shaping.clear_link(other, target);
        self.recorder.fault_ended(id);
    }

    /// Fills the disk of a running node (the leader the first time) and
    /// waits until the node stops on it (exit code 12, reaped later with
    /// the cluster's other exits: [`crate::run`] counts it as a stop on
    /// a storage failure, not a crash); the others run without it for the
    /// rest of `hold`. Then frees the disk, starts the node again on its
    /// data and waits until it has applied what the leader had committed.
    /// The disk's window (`disk of node N full`), the node's exit and its
    /// restart are on the timeline; a disk that cannot be filled or freed,
    /// a node that does not stop, or one that does not catch up, is a
    /// failure of the nemesis.
    async fn fill_disk(
        &self,
        hold: Duration,
        first: bool,
        rng: &mut StdRng,
        stop: &mut watch::Receiver<bool>,
    ) {
        let Some(cluster) = &self.cluster else { return };
        let Some(disks) = lock(cluster).disks() else {
            return;
        };
        let Some(target) = self.target(first, rng) else {
            return;
        };
        let node = lock(cluster).node_mut(target).and_then(|node| {
            node.is_running()
                .then(|| (node.data_dir.clone(), node.client.clone()))
        });
        let Some((data_dir, address)) = node else {
            return;
        };
        let recorder = &self.recorder;
        let usage = match disks.usage(&data_dir) {
            Ok(usage) => usage,
            Err(error) => {
                self.failed(format!("full-disk: node {target}'s disk: {error}"));
                return;
            }
        };
        let detail = format!(
            "disk of node {target} full (its data held {} KiB of its {} MiB tmpfs; a filler took \
             the rest)",
            usage.used_kib(),
            usage.size_mib()
        );
        let began = tokio::time::Instant::now();
        let id = recorder.fault_started(Fault::FullDisk.kind(), Some(target), Some(detail));
        if let Err(error) = disks.fill(&data_dir) {
            self.failed(format!("full-disk: filling node {target}'s disk: {error}"));
            let _ = disks.free(&data_dir);
            recorder.fault_ended(id);
            return;
        }
        match self.stopped(cluster, target, stop).await {
            Some(status) => {
                let log = lock(cluster)
                    .node_mut(target)
                    .map(|node| node.log_tail(20))
                    .unwrap_or_default();
                let why = if log.contains("disk holding the data directory is full") {
                    ": the disk holding the data directory is full"
                } else {
                    ""
                };
                let mark = recorder.fault_started(
                    Fault::FullDisk.kind(),
                    Some(target),
                    Some(format!("full-disk: node {target} stopped{why} ({status})")),
                );
                recorder.fault_ended(mark);
            }
            None if *stop.borrow() => {}
            None => self.failed(format!(
                "full-disk: node {target} still ran {DISK_STOP_MAX:?} after its disk was filled"
            )),
        }
        // The others go on without it for the rest of the window.
        sleep_or_stop(hold.saturating_sub(began.elapsed()), stop).await;
        if let Err(error) = disks.free(&data_dir) {
            self.failed(format!("full-disk: freeing node {target}'s disk: {error}"));
        }
        recorder.fault_ended(id);
        let detail = format!(
            "full-disk: node {target} started again on its data, its disk freed, until it \
             applied what the leader had committed"
        );
        let id = recorder.fault_started(FaultKind::Restart, Some(target), Some(detail));
        if let Err(error) = lock(cluster).restart(target) {
            self.failed(format!("full-disk: starting node {target} again: {error}"));
        } else {
            let changes = Changes {
                cluster,
                proxies: &self.proxies,
                recorder,
                election_timeout: self.election_timeout,
                disruptions: &self.disruptions,
            };
            if let Err(error) = changes.catch_up(Fault::FullDisk, target, &address).await {
                self.failed(error.to_string());
            }
        }
        recorder.fault_ended(id);
    }

    /// Waits until node `target` has exited, for at most
    /// [`DISK_STOP_MAX`] or until the run stops; how it ended. The exit is
    /// left for the cluster to reap.
    async fn stopped(
        &self,
        cluster: &Mutex<Cluster>,
        target: NodeId,
        stop: &watch::Receiver<bool>,
    ) -> Option<std::process::ExitStatus> {
        let until = tokio::time::Instant::now() + DISK_STOP_MAX;
        loop {
            let exited = lock(cluster)
                .node_mut(target)
                .and_then(|node| node.child.as_mut()?.try_wait().ok().flatten());
            if exited.is_some() || *stop.borrow() || tokio::time::Instant::now() >= until {
                return exited;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends every fault: replies pass, links heal, disks are freed, nodes
    /// run.
    pub fn heal(&self) {
        self.proxies
            .iter()
            .for_each(|p| p.set_fault(ReplyFault::None));
        if let Some(cluster) = &self.cluster {
            let mut cluster = lock(cluster);
            if let Some(disks) = cluster.disks() {
                for node in &cluster.nodes {
                    if let Err(error) = disks.free(&node.data_dir) {
                        self.failed(format!("freeing node {}'s disk: {error}", node.id));
                    }
                }
            }
            for id in cluster.nodes.iter().map(|n| n.id).collect::<Vec<_>>() {
                fiu_syncs(&cluster, id, false);
            }
            if let Err(error) = cluster.heal() {
                self.failed(format!("healing the cluster: {error}"));
            }
        }
    }
}

/// Turns failing syncs on or off in node `id` (started under `fiu-run`).
fn fiu_syncs(cluster: &Cluster, id: NodeId, fail: bool) {
    let Some(pid) = cluster
        .nodes
        .iter()
        .find(|n| n.id == id)
        .and_then(|n| n.pid())
    else {
        return;
    };
    let control = cluster.fiu_ctrl();
    let verb = if fail { "enable" } else { "disable" };
    for call in ["posix/io/sync/fdatasync", "posix/io/sync/fsync"] {
        let _ = std::process::Command::new("fiu-ctrl")
            .arg("-f")
            .arg(&control)
            .args(["-c", &format!("{verb} name={call}"), &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Sleeps for `duration`; `true` if the run stopped meanwhile.
async fn sleep_or_stop(duration: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(duration) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_faults_are_the_netns_topology_s_only() {
        let loopback = Fault::defaults(Topology::Loopback);
        let netns = Fault::defaults(Topology::Netns);
        // The membership kinds, the full disk and the slow link, by name
        // only.
        let named = crate::membership::KINDS.len() + 2;
        assert!(Fault::ALL.iter().filter(|f| f.by_name_only()).count() == named);
        assert_eq!(netns.len(), Fault::ALL.len() - named);
        assert!(netns.iter().all(|f| !f.by_name_only()));
        assert!(!loopback.contains(&Fault::FullDisk) && Fault::FullDisk.needs_processes());
        assert_eq!(
            loopback.len(),
            Fault::ALL.len() - Fault::NETWORK.len() - named
        );
        for fault in Fault::NETWORK {
            assert!(!loopback.contains(&fault) && fault.needs_processes());
            assert!(matches!(
                fault.kind(),
                FaultKind::Partition | FaultKind::MessageLoss
            ));
        }
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()), Ok(fault));
        }
        let error = Fault::parse("meteor").unwrap_err();
        assert!(error.contains("unknown fault `meteor`") && error.contains("drop-reply"));
    }
}

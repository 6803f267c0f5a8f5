//! The nemesis: injects faults on a seeded schedule and records each one's
//! window. Kinds ([`Fault`]): SIGKILL and restart of the leader or a
//! follower, SIGSTOP pauses longer than the election timeout, replies
//! dropped by the client proxies after the node committed, delayed
//! replies, reset client connections, peer-link partitions, and (where
//! `fiu-run`/`fiu-ctrl` are installed) failing disk syncs on one node.

use crate::client_proxy::{ClientProxy, ReplyFault};
use crate::cluster::Cluster;
use crate::recorder::Recorder;
use oncekv_check::record::{FaultKind, NodeId};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

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
}

impl Fault {
    /// Every kind, in the order of `--faults`.
    pub const ALL: [Fault; 8] = [
        Fault::Kill,
        Fault::Pause,
        Fault::DropReply,
        Fault::Delay,
        Fault::Reset,
        Fault::Partition,
        Fault::Fsync,
        Fault::Flood,
    ];

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
            Fault::Kill | Fault::Pause | Fault::Partition | Fault::Fsync | Fault::Flood
        )
    }

    /// Whether it moves leadership.
    pub fn disturbs_leadership(self) -> bool {
        matches!(self, Fault::Kill | Fault::Pause | Fault::Partition)
    }

    /// The kind recorded in the history.
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
}

fn lock(cluster: &Mutex<Cluster>) -> std::sync::MutexGuard<'_, Cluster> {
    cluster
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Nemesis {
    /// Injects faults until `stop` is set, then heals everything.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x6e65_6d65_7369_7321);
        let faults: Vec<Fault> = self
            .faults
            .iter()
            .copied()
            .filter(|f| !f.needs_processes() || self.cluster.is_some())
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
        }
        self.heal();
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
                let mut cluster = lock(cluster);
                match fault {
                    Fault::Kill => {
                        let _ = cluster.restart(target);
                    }
                    Fault::Pause => cluster.resume(target),
                    _ => {
                        fiu_syncs(&cluster, target, false);
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
                lock(cluster).partitions().split(&[target], &others);
                sleep_or_stop(hold, stop).await;
                lock(cluster).partitions().heal();
                recorder.fault_ended(id);
            }
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

    /// Ends every fault: replies pass, links heal, nodes run.
    pub fn heal(&self) {
        self.proxies
            .iter()
            .for_each(|p| p.set_fault(ReplyFault::None));
        if let Some(cluster) = &self.cluster {
            let mut cluster = lock(cluster);
            for id in cluster.nodes.iter().map(|n| n.id).collect::<Vec<_>>() {
                fiu_syncs(&cluster, id, false);
            }
            let _ = cluster.heal();
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
    fn names_round_trip_and_unknown_names_are_refused() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()), Ok(fault));
        }
        let error = Fault::parse("meteor").unwrap_err();
        assert!(error.contains("unknown fault `meteor`") && error.contains("drop-reply"));
    }
}

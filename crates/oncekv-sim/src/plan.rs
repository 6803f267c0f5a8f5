//! The seeded fault schedule of a simulation: one fault at a time, in
//! windows of about a second or two with quiet gaps between them, every
//! kind once before any repeats (in a seeded order), the first crash on
//! the leader, and faults that lose replies always at the leader.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::time::Duration;

/// What goes wrong in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimFault {
    /// A node's host crashes (every task dropped, its files kept) and
    /// restarts from its data directory when the window ends.
    Crash,
    /// A node cut off from its peers and from the clients.
    Isolate,
    /// The link between the clients and a node cut: requests in flight
    /// there may commit and lose their replies.
    CutClients,
    /// Replies dropped after commit (by the proxies in front of the nodes;
    /// only the leader's replies are committed ones).
    DropReplies,
    /// Every link breaks at random on some messages (TCP connections
    /// break and are redialled).
    MessageLoss,
}

impl SimFault {
    /// Every kind.
    pub const ALL: [SimFault; 5] = [
        SimFault::Crash,
        SimFault::Isolate,
        SimFault::CutClients,
        SimFault::DropReplies,
        SimFault::MessageLoss,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimFault::Crash => "crash",
            SimFault::Isolate => "isolate",
            SimFault::CutClients => "cut-clients",
            SimFault::DropReplies => "drop-replies",
            SimFault::MessageLoss => "message-loss",
        }
    }
}

impl fmt::Display for SimFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault window, in time since the workload started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// When it starts.
    pub start: Duration,
    /// When it is healed.
    pub end: Duration,
    /// What it does.
    pub fault: SimFault,
    /// Whether it hits the node leading when it starts (else `node`).
    pub on_leader: bool,
    /// The node it hits when not the leader (1-based).
    pub node: u64,
}

/// The windows of a run of `length` on `nodes` nodes, from `seed`.
pub fn plan(seed: u64, length: Duration, nodes: u64) -> Vec<Window> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f417_0000_0001);
    let mut kinds = SimFault::ALL.to_vec();
    kinds.shuffle(&mut rng);
    let mut windows = Vec::new();
    let mut at = Duration::from_millis(rng.random_range(500..1500));
    let mut crashed_leader = false;
    for index in 0.. {
        let span = Duration::from_millis(rng.random_range(800..2500));
        if at + span > length {
            break;
        }
        let fault = kinds[index % kinds.len()];
        // Replies are lost only where requests commit: at the leader.
        let on_leader = matches!(fault, SimFault::DropReplies | SimFault::CutClients)
            || (fault == SimFault::Crash && !crashed_leader)
            || rng.random_bool(0.5);
        crashed_leader |= fault == SimFault::Crash && on_leader;
        windows.push(Window {
            start: at,
            end: at + span,
            fault,
            on_leader,
            node: rng.random_range(1..=nodes.max(1)),
        });
        at += span + Duration::from_millis(rng.random_range(300..1200));
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_a_function_of_its_seed() {
        let length = Duration::from_secs(20);
        assert_eq!(plan(7, length, 3), plan(7, length, 3));
        assert_ne!(plan(7, length, 3), plan(8, length, 3));
    }

    #[test]
    fn windows_do_not_overlap_and_every_kind_comes_up() {
        for seed in 0..50 {
            let windows = plan(seed, Duration::from_secs(20), 3);
            for pair in windows.windows(2) {
                assert!(pair[0].end < pair[1].start, "seed {seed}: {pair:?}");
            }
            for kind in SimFault::ALL {
                assert!(
                    windows.iter().any(|w| w.fault == kind),
                    "seed {seed}: no {kind}"
                );
            }
            let first_crash = windows.iter().find(|w| w.fault == SimFault::Crash);
            assert!(first_crash.is_some_and(|w| w.on_leader), "seed {seed}");
            assert!(
                windows.iter().all(|w| w.on_leader
                    || !matches!(w.fault, SimFault::DropReplies | SimFault::CutClients))
            );
            assert!(windows.iter().all(|w| (1..=3).contains(&w.node)));
            assert!(
                windows
                    .last()
                    .is_some_and(|w| w.end <= Duration::from_secs(20))
            );
        }
    }
}

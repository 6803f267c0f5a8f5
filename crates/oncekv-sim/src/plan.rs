//! The seeded fault schedule of a simulation: one fault at a time, in
//! windows of about a second or two with quiet gaps between them, every
//! kind once before any repeats (in a seeded order), the first crash on
//! the leader, and faults that lose replies always at the leader.
//!
//! A lose-connections window is longer ([`LOSE_CONNECTIONS_SPAN_MS`],
//! about 9 s): the leader stays out of the clients' reach long enough for
//! a call, and the call that sends its request again, to run out of time.
//! Where it no longer fits in what is left of the run, it is left out and
//! the shorter kinds go on; in a run of 24 s (the default) nearly every
//! seed has every kind, in one of 20 s about three seeds out of four have
//! it.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// When the first window starts, in milliseconds.
const FIRST_MS: Range<u64> = 500..1500;

/// The quiet gap after a window, in milliseconds.
const GAP_MS: Range<u64> = 300..1200;

/// How long most windows last, in milliseconds.
pub const SPAN_MS: Range<u64> = 800..2500;

/// How long a [`SimFault::LoseConnections`] window lasts, in
/// milliseconds: more than two client deadlines (4 s each, the workload's
/// client options), so that the call whose attempt lost its connection
/// runs out of time while no attempt can reach the leader, and so does
/// the call that sends the same request again.
pub const LOSE_CONNECTIONS_SPAN_MS: Range<u64> = 8500..9500;

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
    /// A connection lost after commit, then the leader out of reach: the
    /// proxies break the client connection of the first committed reply
    /// instead of forwarding it (the client's attempt ends with a
    /// transport error, as when a node dies after answering), and the
    /// clients are cut off that node at once, for the rest of the window.
    /// It stays leader, so followers point at it and every later attempt
    /// fails to connect: one attempt that may have been delivered, then a
    /// long run of attempts that could not be.
    LoseConnections,
    /// Messages lost between hosts: a connection that loses one breaks
    /// (as TCP does when it cannot deliver), at random on some writes, and
    /// is dialled again.
    MessageLoss,
}

impl SimFault {
    /// Every kind.
    pub const ALL: [SimFault; 6] = [
        SimFault::Crash,
        SimFault::Isolate,
        SimFault::CutClients,
        SimFault::DropReplies,
        SimFault::LoseConnections,
        SimFault::MessageLoss,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimFault::Crash => "crash",
            SimFault::Isolate => "isolate",
            SimFault::CutClients => "cut-clients",
            SimFault::DropReplies => "drop-replies",
            SimFault::LoseConnections => "lose-connections",
            SimFault::MessageLoss => "message-loss",
        }
    }
}

impl SimFault {
    /// How long its windows last, in milliseconds.
    pub fn span_ms(self) -> Range<u64> {
        match self {
            SimFault::LoseConnections => LOSE_CONNECTIONS_SPAN_MS,
            _ => SPAN_MS,
        }
    }

    /// Whether it loses committed replies, and so hits the leader.
    pub fn loses_replies(self) -> bool {
        matches!(
            self,
            SimFault::CutClients | SimFault::DropReplies | SimFault::LoseConnections
        )
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
    let mut at = Duration::from_millis(rng.random_range(FIRST_MS));
    let mut crashed_leader = false;
    // Kinds in a row that did not fit in what is left of the run.
    let mut skipped = 0;
    for index in 0.. {
        let fault = kinds[index % kinds.len()];
        let span = Duration::from_millis(rng.random_range(fault.span_ms()));
        if at + span > length {
            // A long window may not fit where a short one still does.
            skipped += 1;
            if skipped == kinds.len() {
                break;
            }
            continue;
        }
        skipped = 0;
        // Replies are lost only where requests commit: at the leader.
        let on_leader = fault.loses_replies()
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
        at += span + Duration::from_millis(rng.random_range(GAP_MS));
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    const LENGTH: Duration = Duration::from_secs(20);

    /// A run with room for one window of every kind, however long each is
    /// drawn.
    fn room_for_every_kind() -> Duration {
        let spans: u64 = SimFault::ALL.iter().map(|kind| kind.span_ms().end).sum();
        let gaps = GAP_MS.end * SimFault::ALL.len() as u64;
        Duration::from_millis(FIRST_MS.end + spans + gaps)
    }

    #[test]
    fn a_plan_is_a_function_of_its_seed() {
        assert_eq!(plan(7, LENGTH, 3), plan(7, LENGTH, 3));
        assert_ne!(plan(7, LENGTH, 3), plan(8, LENGTH, 3));
    }

    #[test]
    fn windows_do_not_overlap_and_hit_where_they_must() {
        for length in [LENGTH, room_for_every_kind()] {
            for seed in 0..50 {
                let windows = plan(seed, length, 3);
                for pair in windows.windows(2) {
                    assert!(pair[0].end < pair[1].start, "seed {seed}: {pair:?}");
                }
                let first_crash = windows.iter().find(|w| w.fault == SimFault::Crash);
                assert!(first_crash.is_none_or(|w| w.on_leader), "seed {seed}");
                assert!(
                    windows
                        .iter()
                        .all(|w| w.on_leader || !w.fault.loses_replies())
                );
                assert!(windows.iter().all(|w| {
                    let span = u64::try_from((w.end - w.start).as_millis()).unwrap_or(u64::MAX);
                    w.fault.span_ms().contains(&span)
                }));
                assert!(windows.iter().all(|w| (1..=3).contains(&w.node)));
                assert!(windows.last().is_some_and(|w| w.end <= length));
            }
        }
    }

    #[test]
    fn every_kind_comes_up_once_before_any_repeats() {
        for seed in 0..50 {
            let windows = plan(seed, room_for_every_kind(), 3);
            let first: std::collections::BTreeSet<SimFault> = windows
                .iter()
                .take(SimFault::ALL.len())
                .map(|w| w.fault)
                .collect();
            assert_eq!(first.len(), SimFault::ALL.len(), "seed {seed}: {windows:?}");
        }
    }

    #[test]
    fn a_run_of_the_default_length_mostly_loses_connections() {
        // The long window fits in most runs of 20 s, and leaves room for
        // other kinds.
        let plans: Vec<_> = (0..50).map(|seed| plan(seed, LENGTH, 3)).collect();
        let losing = plans
            .iter()
            .filter(|windows| windows.iter().any(|w| w.fault == SimFault::LoseConnections))
            .count();
        assert!(losing >= 30, "{losing} of 50 runs lose connections");
        assert!(plans.iter().all(|windows| windows.len() >= 3));
    }
}

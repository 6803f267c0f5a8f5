//! The seeded fault schedule of a simulation: one fault at a time, in
//! windows of about a second or two with quiet gaps between them, every
//! kind once before any repeats (in a seeded order), the first crash on
//! the leader, and faults that lose replies always at the leader.
//!
//! Five kinds are membership changes ([`SimFault::changes_membership`]),
//! made by [`crate::membership`]: leadership moved to a follower, a
//! learner added (and a follower removed), a follower removed (and a fresh
//! member added), the leader removed (and a fresh member added), a member
//! replaced. Each ends with three voters, so the kinds after it find the
//! cluster they expect. A change's window lasts at least its planned span
//! and until the change completes.
//!
//! A lose-connections window is longer ([`LOSE_CONNECTIONS_SPAN_MS`],
//! about 9 s): the leader stays out of the clients' reach long enough for
//! a call, and the call that sends its request again, to run out of time.
//!
//! The first round (every kind once) keeps room for the membership
//! changes: another kind is left out of it where it would leave too
//! little room for the changes still to come (their spans are drawn
//! first), so every change of the round fits in any run long enough for
//! all of them ([`room_for_every_change`]: the default run of 42 s is).
//! A kind that does not fit in what is left of the run is left out and
//! the shorter kinds go on; in the default run nearly every seed has
//! every kind.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// When the first window starts, in milliseconds.
const FIRST_MS: Range<u64> = 500..1500;

/// The quiet gap after a window, in milliseconds.
pub const GAP_MS: Range<u64> = 300..1200;

/// How long most windows last, in milliseconds.
pub const SPAN_MS: Range<u64> = 800..2500;

/// How long a [`SimFault::LoseConnections`] window lasts, in
/// milliseconds: more than two client deadlines (4 s each, the workload's
/// client options), so that the call whose attempt lost its connection
/// runs out of time while no attempt can reach the leader, and so does
/// the call that sends the same request again.
pub const LOSE_CONNECTIONS_SPAN_MS: Range<u64> = 8500..9500;

/// How long a membership change that removes a member that still runs
/// lasts at least, in milliseconds: about as long as it takes (the
/// change, the removed member watched for three election timeouts, a
/// fresh member added).
pub const REMOVE_SPAN_MS: Range<u64> = 3000..4000;

/// How long a [`SimFault::Replace`] window lasts at least, in
/// milliseconds (the member stopped, removed, a fresh one added).
pub const REPLACE_SPAN_MS: Range<u64> = 1000..2500;

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
    /// Leadership moved to a follower (etcd's `MoveLeader`, asked of the
    /// leader); the window's `node` picks the follower.
    TransferLeader,
    /// A fresh node started on the free host, added as a learner once the
    /// leader's log no longer starts at index 1 (so it catches up from a
    /// snapshot), promoted to voter; then a follower (the window's `node`
    /// picks it) removed, watched while it still runs, stopped, its data
    /// removed.
    AddLearner,
    /// A follower (picked by the window's `node`) cut off from the other
    /// members, removed (so it misses its removal), let back, watched
    /// while it still runs, stopped, its data removed; then a fresh node
    /// added on its host.
    RemoveFollower,
    /// The leader removed (it hands leadership over first), watched while
    /// it still runs, stopped, its data removed; then a fresh node added
    /// on a free host.
    RemoveLeader,
    /// A member (the leader if the window hits it, else the follower its
    /// `node` picks) stopped at once, its data removed, removed from the
    /// membership; then a fresh node added on its host.
    Replace,
}

impl SimFault {
    /// Every kind.
    pub const ALL: [SimFault; 11] = [
        SimFault::Crash,
        SimFault::Isolate,
        SimFault::CutClients,
        SimFault::DropReplies,
        SimFault::LoseConnections,
        SimFault::MessageLoss,
        SimFault::TransferLeader,
        SimFault::AddLearner,
        SimFault::RemoveFollower,
        SimFault::RemoveLeader,
        SimFault::Replace,
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
            SimFault::TransferLeader => "transfer-leader",
            SimFault::AddLearner => "add-learner",
            SimFault::RemoveFollower => "remove-follower",
            SimFault::RemoveLeader => "remove-leader",
            SimFault::Replace => "replace",
        }
    }

    /// Whether it changes the membership (or moves leadership): made by
    /// [`crate::membership`], not injected.
    pub fn changes_membership(self) -> bool {
        matches!(
            self,
            SimFault::TransferLeader
                | SimFault::AddLearner
                | SimFault::RemoveFollower
                | SimFault::RemoveLeader
                | SimFault::Replace
        )
    }
}

impl SimFault {
    /// How long its windows last (a membership change's at least), in
    /// milliseconds.
    pub fn span_ms(self) -> Range<u64> {
        match self {
            SimFault::LoseConnections => LOSE_CONNECTIONS_SPAN_MS,
            SimFault::AddLearner | SimFault::RemoveFollower | SimFault::RemoveLeader => {
                REMOVE_SPAN_MS
            }
            SimFault::Replace => REPLACE_SPAN_MS,
            SimFault::Crash
            | SimFault::Isolate
            | SimFault::CutClients
            | SimFault::DropReplies
            | SimFault::MessageLoss
            | SimFault::TransferLeader => SPAN_MS,
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

/// One window as drawn, before it is placed.
#[derive(Clone, Copy, Debug)]
struct Drawn {
    fault: SimFault,
    span: Duration,
    /// The quiet gap after it.
    gap: Duration,
    /// Whether it hits the leader, where that is left to chance.
    coin: bool,
    node: u64,
}

fn draw(rng: &mut StdRng, fault: SimFault, nodes: u64) -> Drawn {
    Drawn {
        fault,
        span: Duration::from_millis(rng.random_range(fault.span_ms())),
        gap: Duration::from_millis(rng.random_range(GAP_MS)),
        coin: rng.random_bool(0.5),
        node: rng.random_range(1..=nodes.max(1)),
    }
}

/// How long from its start `drawn` and the windows of `later` that are
/// `kept` take, in order, with the gaps between them.
fn with_kept_after(drawn: &Drawn, later: &[Drawn], kept: &[bool]) -> Duration {
    let mut total = drawn.span;
    let mut gap = drawn.gap;
    for (later, _) in later.iter().zip(kept).filter(|(_, kept)| **kept) {
        total += gap + later.span;
        gap = later.gap;
    }
    total
}

/// The shortest run in which every membership change fits, however long
/// each is drawn and in whatever order.
pub fn room_for_every_change() -> Duration {
    let changes = SimFault::ALL
        .iter()
        .filter(|kind| kind.changes_membership());
    let spans: u64 = changes.clone().map(|kind| kind.span_ms().end).sum();
    let gaps = GAP_MS.end * (changes.count() as u64).saturating_sub(1);
    Duration::from_millis(FIRST_MS.end + spans + gaps)
}

/// The windows of a run of `length` on `nodes` nodes, from `seed`.
pub fn plan(seed: u64, length: Duration, nodes: u64) -> Vec<Window> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f417_0000_0001);
    let mut kinds = SimFault::ALL.to_vec();
    kinds.shuffle(&mut rng);
    let mut windows = Vec::new();
    let mut at = Duration::from_millis(rng.random_range(FIRST_MS));
    let mut crashed_leader = false;
    let mut place = |at: &mut Duration, drawn: Drawn| {
        let on_leader = match drawn.fault {
            SimFault::TransferLeader | SimFault::RemoveLeader => true,
            SimFault::AddLearner | SimFault::RemoveFollower => false,
            // Replies are lost only where requests commit: at the leader.
            fault => {
                fault.loses_replies() || (fault == SimFault::Crash && !crashed_leader) || drawn.coin
            }
        };
        crashed_leader |= drawn.fault == SimFault::Crash && on_leader;
        windows.push(Window {
            start: *at,
            end: *at + drawn.span,
            fault: drawn.fault,
            on_leader,
            node: drawn.node,
        });
        *at += drawn.span + drawn.gap;
    };
    // The first round, drawn at once: the membership changes that fit
    // one after the other (all of them in a run long enough) are kept,
    // and every other kind is placed only where it leaves room for the
    // kept changes after it.
    let first: Vec<Drawn> = kinds
        .iter()
        .map(|&fault| draw(&mut rng, fault, nodes))
        .collect();
    let mut kept = vec![false; first.len()];
    let mut end = at;
    for (position, drawn) in first.iter().enumerate() {
        if drawn.fault.changes_membership() && end + drawn.span <= length {
            kept[position] = true;
            end += drawn.span + drawn.gap;
        }
    }
    for (position, drawn) in first.iter().enumerate() {
        let later = position + 1;
        let fits = at + with_kept_after(drawn, &first[later..], &kept[later..]) <= length;
        if fits && (kept[position] || !drawn.fault.changes_membership()) {
            place(&mut at, *drawn);
        }
    }
    // Then every kind again, in the same order, while one fits.
    // Kinds in a row that did not fit in what is left of the run.
    let mut skipped = 0;
    for index in 0.. {
        let drawn = draw(&mut rng, kinds[index % kinds.len()], nodes);
        if at + drawn.span > length {
            // A long window may not fit where a short one still does.
            skipped += 1;
            if skipped == kinds.len() {
                break;
            }
            continue;
        }
        skipped = 0;
        place(&mut at, drawn);
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default run's length.
    fn default_length() -> Duration {
        crate::run::SimOptions::default().length
    }

    /// A run with room for one window of every kind, however long each is
    /// drawn.
    fn room_for_every_kind() -> Duration {
        let spans: u64 = SimFault::ALL.iter().map(|kind| kind.span_ms().end).sum();
        let gaps = GAP_MS.end * SimFault::ALL.len() as u64;
        Duration::from_millis(FIRST_MS.end + spans + gaps)
    }

    #[test]
    fn a_plan_is_a_function_of_its_seed() {
        let length = default_length();
        assert_eq!(plan(7, length, 3), plan(7, length, 3));
        assert_ne!(plan(7, length, 3), plan(8, length, 3));
    }

    #[test]
    fn windows_do_not_overlap_and_hit_where_they_must() {
        for length in [
            Duration::from_secs(8),
            Duration::from_secs(20),
            default_length(),
            room_for_every_kind(),
        ] {
            for seed in 0..50 {
                let windows = plan(seed, length, 3);
                for pair in windows.windows(2) {
                    assert!(pair[0].end < pair[1].start, "seed {seed}: {pair:?}");
                }
                let first_crash = windows.iter().find(|w| w.fault == SimFault::Crash);
                assert!(first_crash.is_none_or(|w| w.on_leader), "seed {seed}");
                assert!(windows.iter().all(|w| match w.fault {
                    SimFault::TransferLeader | SimFault::RemoveLeader => w.on_leader,
                    SimFault::AddLearner | SimFault::RemoveFollower => !w.on_leader,
                    fault => w.on_leader || !fault.loses_replies(),
                }));
                assert!(windows.iter().all(|w| {
                    let span = u64::try_from((w.end - w.start).as_millis()).unwrap_or(u64::MAX);
                    w.fault.span_ms().contains(&span)
                }));
                assert!(windows.iter().all(|w| (1..=3).contains(&w.node)));
                assert!(windows.last().is_none_or(|w| w.end <= length));
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
    fn every_run_of_the_default_length_makes_every_membership_change() {
        assert!(room_for_every_change() <= default_length());
        let changes: Vec<SimFault> = SimFault::ALL
            .into_iter()
            .filter(|kind| kind.changes_membership())
            .collect();
        assert_eq!(changes.len(), 5);
        for seed in 0..500 {
            let windows = plan(seed, room_for_every_change(), 3);
            for change in &changes {
                assert!(
                    windows.iter().any(|w| w.fault == *change),
                    "seed {seed} has no {change}: {windows:?}"
                );
            }
        }
    }

    #[test]
    fn a_run_of_the_default_length_mostly_has_every_kind() {
        // The long window fits in most runs, with room for the others.
        let plans: Vec<_> = (0..50)
            .map(|seed| plan(seed, default_length(), 3))
            .collect();
        let losing = plans
            .iter()
            .filter(|windows| windows.iter().any(|w| w.fault == SimFault::LoseConnections))
            .count();
        assert!(losing >= 40, "{losing} of 50 runs lose connections");
        let complete = plans
            .iter()
            .filter(|windows| {
                SimFault::ALL
                    .iter()
                    .all(|kind| windows.iter().any(|w| w.fault == *kind))
            })
            .count();
        assert!(complete >= 40, "{complete} of 50 runs have every kind");
    }
}

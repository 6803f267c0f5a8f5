//! [`LeaderClock`]: the cluster time a leader stamps on the entries it
//! proposes. It is the leader's monotonic clock, continued from the last
//! applied cluster time when the node takes office (a new term), so time
//! neither jumps with wall clocks nor runs while there is no leader. It
//! reads tokio's clock, which is the monotonic clock except under a
//! simulated runtime, where it is simulated time.

use oncekv_state::ClusterTime;
use std::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
struct Office {
    term: u64,
    base: ClusterTime,
    since: Instant,
}

/// Stamps cluster time on proposals.
#[derive(Debug, Default)]
pub struct LeaderClock {
    office: Mutex<Option<Office>>,
    last: Mutex<ClusterTime>,
}

impl LeaderClock {
    /// The time to stamp on a proposal made now in `term`, given the cluster
    /// time of the last applied entry. Never decreases on this node.
    pub fn stamp(&self, term: u64, applied: ClusterTime) -> ClusterTime {
        let mut last = crate::sync::lock(&self.last);
        let mut office = crate::sync::lock(&self.office);
        let running = office.as_ref().filter(|o| o.term == term).map(|o| {
            let elapsed = u64::try_from(o.since.elapsed().as_millis()).unwrap_or(u64::MAX);
            o.base.plus_ms(elapsed)
        });
        let current = match running {
            Some(current) if current >= applied => current,
            // A new term, or entries applied ahead of this clock: continue
            // from the later of what was applied and what was stamped.
            _ => {
                let base = applied.max(*last);
                *office = Some(Office {
                    term,
                    base,
                    since: Instant::now(),
                });
                base
            }
        };
        *last = (*last).max(current);
        *last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_from_applied_time_and_never_goes_back() {
        let clock = LeaderClock::default();
        let first = clock.stamp(3, ClusterTime(10_000));
        assert!(first >= ClusterTime(10_000));
        // A new term whose applied time is behind what this node stamped.
        let second = clock.stamp(4, ClusterTime(5));
        assert!(second >= first);
        // Applied time ahead of the clock (entries of a faster leader).
        let third = clock.stamp(4, ClusterTime(50_000));
        assert!(third >= ClusterTime(50_000));
    }
}

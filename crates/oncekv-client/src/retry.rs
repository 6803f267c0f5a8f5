//! Retry timing: exponential backoff with jitter from an injected
//! [`RandomSource`], so tests and simulations can make it deterministic.

use crate::random::{RandomSource, fraction};
use std::time::Duration;

/// Exponential backoff: `initial * 2^attempt`, capped at `max`, then
/// "full jitter" (a random point between half and all of it).
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(1000),
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (0-based).
    pub fn delay(&self, retry: u32, random: &dyn RandomSource) -> Duration {
        let exponential = self.initial.saturating_mul(1u32 << retry.min(16));
        let capped = exponential.min(self.max);
        capped.mul_f64(0.5 + 0.5 * fraction(random))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Fixed;

    const HIGHEST: Fixed = Fixed(u64::MAX);
    const LOWEST: Fixed = Fixed(0);

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        let near = |delay: Duration, ms: u64| {
            let want = Duration::from_millis(ms);
            assert!(
                delay <= want && want - delay < Duration::from_micros(1),
                "{delay:?} vs {want:?}"
            );
        };
        near(backoff.delay(0, &HIGHEST), 10);
        near(backoff.delay(2, &HIGHEST), 40);
        near(backoff.delay(9, &HIGHEST), 100);
        assert_eq!(backoff.delay(9, &LOWEST), Duration::from_millis(50));
    }
}

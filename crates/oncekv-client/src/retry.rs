//! Retry timing: exponential backoff with injected jitter, so tests and
//! simulations can make it deterministic.

use std::time::Duration;

/// A source of jitter: a fraction in `0.0..1.0` per call.
pub trait Jitter: Send + Sync + std::fmt::Debug {
    /// The next fraction.
    fn fraction(&self) -> f64;
}

/// Jitter from the thread-local random generator.
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomJitter;

impl Jitter for RandomJitter {
    fn fraction(&self) -> f64 {
        rand::random::<f64>()
    }
}

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
    pub fn delay(&self, retry: u32, jitter: &dyn Jitter) -> Duration {
        let exponential = self.initial.saturating_mul(1u32 << retry.min(16));
        let capped = exponential.min(self.max);
        capped.mul_f64(0.5 + 0.5 * jitter.fraction().clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed(f64);

    impl Jitter for Fixed {
        fn fraction(&self) -> f64 {
            self.0
        }
    }

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        assert_eq!(backoff.delay(0, &Fixed(1.0)), Duration::from_millis(10));
        assert_eq!(backoff.delay(2, &Fixed(1.0)), Duration::from_millis(40));
        assert_eq!(backoff.delay(9, &Fixed(1.0)), Duration::from_millis(100));
        assert_eq!(backoff.delay(9, &Fixed(0.0)), Duration::from_millis(50));
    }
}

//! The client's random draws (backoff jitter, fresh idempotency keys) come
//! from a [`RandomSource`] in the options, so a simulation can seed them and
//! replay a run exactly. By default they come from the operating system's
//! entropy ([`OsRandom`]), which keeps keys unguessable and unique.

/// A source of random bits.
pub trait RandomSource: Send + Sync + std::fmt::Debug {
    /// The next 64 random bits.
    fn next_u64(&self) -> u64;
}

/// Random bits from the thread's generator, seeded from the operating
/// system (a cryptographic generator).
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn next_u64(&self) -> u64 {
        rand::random()
    }
}

/// A fraction in `0.0..1.0`, uniformly.
pub(crate) fn fraction(source: &dyn RandomSource) -> f64 {
    // The top 53 bits fill a double's mantissa exactly.
    (source.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A fresh 128-bit key as 32 hex digits.
pub(crate) fn key_hex(source: &dyn RandomSource) -> String {
    format!("{:016x}{:016x}", source.next_u64(), source.next_u64())
}

/// Always the same bits (for tests).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Fixed(pub(crate) u64);

#[cfg(test)]
impl RandomSource for Fixed {
    fn next_u64(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_stay_below_one() {
        assert_eq!(fraction(&Fixed(0)), 0.0);
        let top = fraction(&Fixed(u64::MAX));
        assert!(top < 1.0 && top > 0.999_999, "{top}");
        assert_eq!(fraction(&Fixed(1 << 63)), 0.5);
    }

    #[test]
    fn keys_are_32_hex_digits_from_two_draws() {
        assert_eq!(key_hex(&Fixed(0xab)), format!("{:016x}{:016x}", 0xab, 0xab));
        assert_eq!(key_hex(&OsRandom).len(), 32);
        assert_ne!(key_hex(&OsRandom), key_hex(&OsRandom));
    }
}

//! [`RaftRuntime`]: the async runtime openraft runs on, and the node's
//! random draws. It is openraft's tokio runtime, except for the random
//! numbers openraft draws (election timeouts, tick jitter): they come from
//! a generator the caller may seed for the current thread
//! ([`seed_thread_rng`]), as do the secrets of new sessions
//! ([`secret_bits`]). A simulation seeds it so that a seed replays the same
//! elections and the same secrets. Unseeded, every draw comes from the
//! operating system's entropy (secrets through a cryptographic generator).

use openraft::AsyncRuntime;
use openraft::OptionalSend;
use openraft_rt_tokio::TokioRuntime;
use rand10::rngs::SmallRng;
use rand10::{Rng as _, SeedableRng};
use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

thread_local! {
    /// The master generator of this thread, if seeded.
    static SEEDED: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// Seeds (or, with `None`, unseeds) the random numbers openraft draws on
/// this thread.
pub fn seed_thread_rng(seed: Option<u64>) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(SmallRng::seed_from_u64));
}

/// 128 random bits for a session secret: from this thread's seeded
/// generator if there is one, otherwise from the operating system's
/// entropy through a cryptographic generator.
pub fn secret_bits() -> u128 {
    SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
        Some(master) => (u128::from(master.next_u64()) << 64) | u128::from(master.next_u64()),
        None => rand10::random(),
    })
}

/// openraft's tokio runtime with seedable random numbers.
#[derive(Debug)]
pub struct RaftRuntime(TokioRuntime);

impl AsyncRuntime for RaftRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
            Some(master) => SmallRng::seed_from_u64(master.next_u64()),
            None => SmallRng::seed_from_u64(rand10::random()),
        })
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        RaftRuntime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand10::RngExt;

    fn draws() -> Vec<u64> {
        (0..4)
            .map(|_| RaftRuntime::thread_rng().random_range(0..1_000_000))
            .collect()
    }

    #[test]
    fn a_seeded_thread_draws_the_same_numbers_again() {
        seed_thread_rng(Some(42));
        let first = draws();
        seed_thread_rng(Some(42));
        assert_eq!(draws(), first);
        seed_thread_rng(Some(43));
        assert_ne!(draws(), first);
        seed_thread_rng(None);
    }

    #[test]
    fn secrets_follow_the_seed_and_are_random_without_one() {
        seed_thread_rng(Some(7));
        let first = (secret_bits(), secret_bits());
        seed_thread_rng(Some(7));
        assert_eq!((secret_bits(), secret_bits()), first);
        assert_ne!(first.0, first.1);
        seed_thread_rng(None);
        assert_ne!(secret_bits(), secret_bits());
    }
}

//! [`LoginGuard`]: what a login may cost a node, and how often logins may
//! fail. A password check (argon2id) is slow and memory-hard on purpose;
//! unbounded, a flood of wrong passwords delays every honest login behind
//! it. So, on each node (one guard per process, [`guard`]):
//!
//! - **Failed logins are rate-limited** per user name and per source
//!   address, each with a token bucket ([`FailureTable`]): a user name may
//!   fail [`USER_FAILURES_BURST`] times at once, then once per
//!   [`USER_FAILURE_REFILL`]; an address [`SOURCE_FAILURES_BURST`] times,
//!   then once per [`SOURCE_FAILURE_REFILL`]. A login is admitted
//!   ([`LoginGuard::begin_attempt`]) only if both buckets hold a failure to spend,
//!   and it takes one from each at once, given back if the login does not
//!   fail on its password. A login refused here costs no read barrier and
//!   no password check: [`LoginRefused`], "too many failed logins ...,
//!   retry after N s" (RESOURCE_EXHAUSTED).
//! - **Password checks are bounded**: at most [`VERIFICATIONS_MAX`] run at
//!   once (hashing a new password shares them), and a login whose user
//!   name or address failed recently (a *suspect*: its bucket is not full)
//!   waits for one of [`SUSPECT_VERIFICATIONS_MAX`] slots first, so
//!   suspects never hold every check and a clean login waits behind at
//!   most that many of theirs. At most [`LOGINS_WAITING_MAX`] logins wait
//!   or run; more are shed ([`LoginRefused::Busy`], retry later).
//! - **An unknown user costs what a wrong password costs**: its password
//!   is checked against a dummy hash made like every stored one
//!   ([`crate::auth::dummy_hash`]), its failure is counted the same, and it is answered
//!   the same.
//!
//! The tables hold only names and addresses with a failure not yet
//! refilled, at most [`TABLE_ENTRIES_MAX`] each: a full table drops
//! entries whose bucket refilled, then the one least recently touched.
//! User names are kept as their SHA-256 (a name may be long); an IPv6
//! address counts by its /64 prefix (one host often holds the whole
//! prefix), an IPv4-mapped one as the IPv4 address. A call with no known
//! address (not over TCP) is limited per user name only.

use sha2::Digest as _;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Failed logins a user name may have at once.
pub const USER_FAILURES_BURST: u32 = 5;
/// How long a user name waits for each failed login beyond the burst.
pub const USER_FAILURE_REFILL: Duration = Duration::from_secs(60);
/// Failed logins an address may have at once.
pub const SOURCE_FAILURES_BURST: u32 = 20;
/// How long an address waits for each failed login beyond the burst.
pub const SOURCE_FAILURE_REFILL: Duration = Duration::from_secs(5);
/// Entries of each table (user names, addresses), at most.
pub const TABLE_ENTRIES_MAX: usize = 4096;
/// Password checks (and hashes) running at once on a node.
pub const VERIFICATIONS_MAX: usize = 2;
/// Password checks of suspect logins running or waiting for a slot at once.
pub const SUSPECT_VERIFICATIONS_MAX: usize = 1;
/// Logins waiting for a password check or running one, at most.
pub const LOGINS_WAITING_MAX: usize = 64;

/// How often a refused login is logged, at most (the counters count each).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a login was refused before its password was checked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoginRefused {
    /// The user name failed too often lately.
    #[error(
        "too many failed logins for this user name, retry after {} s",
        seconds(*retry_after)
    )]
    User {
        /// When its next failure may be spent.
        retry_after: Duration,
    },
    /// The address failed too often lately.
    #[error(
        "too many failed logins from {address}, retry after {} s",
        seconds(*retry_after)
    )]
    Source {
        /// The address (an IPv6 one as its /64 prefix).
        address: IpAddr,
        /// When its next failure may be spent.
        retry_after: Duration,
    },
    /// Too many logins wait for a password check.
    #[error(
        "too many logins waiting for a password check ({LOGINS_WAITING_MAX}): not handled, retry later"
    )]
    Busy,
    /// The node is shutting down.
    #[error("shutting down")]
    Stopping,
}

impl LoginRefused {
    /// The label of `oncekv_logins_refused_total`.
    fn reason(&self) -> &'static str {
        match self {
            LoginRefused::User { .. } => "user",
            LoginRefused::Source { .. } => "source",
            LoginRefused::Busy => "busy",
            LoginRefused::Stopping => "stopping",
        }
    }
}

/// Whole seconds, rounded up, at least 1.
fn seconds(duration: Duration) -> u64 {
    duration.as_millis().div_ceil(1000).max(1) as u64
}

/// A token bucket of failures.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Failures that may still be spent (fractions accrue).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    updated: Instant,
}

/// Failure buckets by key, bounded: a key absent is a full bucket.
#[derive(Debug)]
pub struct FailureTable<K> {
    burst: f64,
    refill: Duration,
    entries_max: usize,
    entries: HashMap<K, Bucket>,
}

impl<K: Hash + Eq + Clone> FailureTable<K> {
    /// A table allowing `burst` failures per key, one more per `refill`,
    /// of at most `entries_max` keys.
    pub fn new(burst: u32, refill: Duration, entries_max: usize) -> FailureTable<K> {
        FailureTable {
            burst: f64::from(burst),
            refill,
            entries_max: entries_max.max(1),
            entries: HashMap::new(),
        }
    }

    /// The failures `bucket` may spend at `now`.
    fn tokens_at(&self, bucket: &Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(bucket.updated);
        let refilled = elapsed.as_secs_f64() / self.refill.as_secs_f64();
        (bucket.tokens + refilled).min(self.burst)
    }

    /// The failures `key` may spend at `now`.
    pub fn tokens(&self, key: &K, now: Instant) -> f64 {
        self.entries
            .get(key)
            .map_or(self.burst, |bucket| self.tokens_at(bucket, now))
    }

    /// Whether `key` failed lately (its bucket is not full).
    pub fn is_suspect(&self, key: &K, now: Instant) -> bool {
        self.tokens(key, now) < self.burst
    }

    /// How long until `key` may spend a failure (zero: now).
    pub fn wait(&self, key: &K, now: Instant) -> Duration {
        let missing = 1.0 - self.tokens(key, now);
        if missing <= 0.0 {
            return Duration::ZERO;
        }
        self.refill.mul_f64(missing)
    }

    /// Spends one failure of `key` (which must have one: [`Self::wait`]).
    pub fn take(&mut self, key: &K, now: Instant) {
        let tokens = self.tokens(key, now) - 1.0;
        if !self.entries.contains_key(key) {
            self.make_room(now);
        }
        self.entries.insert(
            key.clone(),
            Bucket {
                tokens,
                updated: now,
            },
        );
    }

    /// Gives back a failure of `key` taken by [`Self::take`] (the login
    /// did not fail on its password); a full bucket is dropped.
    pub fn give_back(&mut self, key: &K, now: Instant) {
        let Some(bucket) = self.entries.get(key) else {
            return;
        };
        let tokens = self.tokens_at(bucket, now) + 1.0;
        if tokens >= self.burst {
            self.entries.remove(key);
        } else {
            self.entries.insert(
                key.clone(),
                Bucket {
                    tokens,
                    updated: now,
                },
            );
        }
    }

    /// Keys held (with a failure not yet refilled, or not yet dropped).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Makes room for one more key: drops every full bucket, then, if the
    /// table is still full, the bucket least recently touched.
    fn make_room(&mut self, now: Instant) {
        if self.entries.len() < self.entries_max {
            return;
        }
        let burst = self.burst;
        let refill = self.refill;
        self.entries.retain(|_, bucket| {
            let elapsed = now.saturating_duration_since(bucket.updated);
            bucket.tokens + elapsed.as_secs_f64() / refill.as_secs_f64() < burst
        });
        while self.entries.len() >= self.entries_max {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, bucket)| bucket.updated)
                .map(|(key, _)| key.clone());
            match oldest {
                Some(key) => self.entries.remove(&key),
                None => break,
            };
        }
    }
}

/// A user name as the table keeps it.
type UserKey = [u8; 32];

fn user_key(user: &str) -> UserKey {
    sha2::Sha256::digest(user.as_bytes()).into()
}

/// An address as the table keeps it: IPv4 as it is (an IPv4-mapped IPv6
/// address too), IPv6 by its /64 prefix.
pub fn source_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

#[derive(Debug)]
struct Tables {
    users: FailureTable<UserKey>,
    sources: FailureTable<IpAddr>,
}

/// The login limits of a node: see the module's documentation.
#[derive(Debug)]
pub struct LoginGuard {
    tables: Mutex<Tables>,
    verifications: Semaphore,
    suspects: Semaphore,
    waiting: Semaphore,
    last_logged: Mutex<Option<Instant>>,
}

impl Default for LoginGuard {
    fn default() -> Self {
        LoginGuard::new(
            FailureTable::new(USER_FAILURES_BURST, USER_FAILURE_REFILL, TABLE_ENTRIES_MAX),
            FailureTable::new(
                SOURCE_FAILURES_BURST,
                SOURCE_FAILURE_REFILL,
                TABLE_ENTRIES_MAX,
            ),
        )
    }
}

/// The guard of this process's node.
pub fn guard() -> &'static LoginGuard {
    static GUARD: LazyLock<LoginGuard> = LazyLock::new(LoginGuard::default);
    &GUARD
}

impl LoginGuard {
    /// A guard over these tables, with the node's slot counts.
    fn new(users: FailureTable<UserKey>, sources: FailureTable<IpAddr>) -> LoginGuard {
        LoginGuard {
            tables: Mutex::new(Tables { users, sources }),
            verifications: Semaphore::new(VERIFICATIONS_MAX),
            suspects: Semaphore::new(SUSPECT_VERIFICATIONS_MAX),
            waiting: Semaphore::new(LOGINS_WAITING_MAX),
            last_logged: Mutex::new(None),
        }
    }

    /// Admits a login of `user` from `source` if both may fail once more,
    /// and takes that failure from each until the attempt is settled;
    /// refuses it otherwise (cheap: before any other work).
    pub fn begin_attempt(
        &self,
        user: &str,
        source: Option<IpAddr>,
    ) -> Result<LoginAttempt<'_>, LoginRefused> {
        self.begin_attempt_at(user, source, Instant::now())
    }

    fn begin_attempt_at(
        &self,
        user: &str,
        source: Option<IpAddr>,
        now: Instant,
    ) -> Result<LoginAttempt<'_>, LoginRefused> {
        let user = user_key(user);
        let source = source.map(source_key);
        let mut tables = crate::sync::lock(&self.tables);
        let refused = {
            let wait = tables.users.wait(&user, now);
            if wait > Duration::ZERO {
                Some(LoginRefused::User { retry_after: wait })
            } else {
                source.and_then(|address| {
                    let wait = tables.sources.wait(&address, now);
                    (wait > Duration::ZERO).then_some(LoginRefused::Source {
                        address,
                        retry_after: wait,
                    })
                })
            }
        };
        if let Some(refused) = refused {
            drop(tables);
            self.refused(&refused);
            return Err(refused);
        }
        let suspect = tables.users.is_suspect(&user, now)
            || source.is_some_and(|address| tables.sources.is_suspect(&address, now));
        tables.users.take(&user, now);
        if let Some(address) = &source {
            tables.sources.take(address, now);
        }
        Ok(LoginAttempt {
            guard: self,
            user,
            source,
            suspect,
            failed: false,
        })
    }

    /// Counts and (at most every [`REFUSAL_LOG_INTERVAL`]) logs a refusal.
    fn refused(&self, refused: &LoginRefused) {
        metrics::counter!("oncekv_logins_refused_total", "reason" => refused.reason()).increment(1);
        let now = Instant::now();
        let mut last = crate::sync::lock(&self.last_logged);
        if last.is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_INTERVAL) {
            *last = Some(now);
            tracing::warn!(%refused, "login refused before its password was checked (logged at most every 10 s)");
        }
    }

    /// A slot to hash a new password in (shared with password checks).
    pub async fn hashing_slot(&self) -> Result<SemaphorePermit<'_>, LoginRefused> {
        self.verifications
            .acquire()
            .await
            .map_err(|_| LoginRefused::Stopping)
    }
}

/// An admitted login: holds one failure of its user name and address
/// until it is settled. Dropped without [`LoginAttempt::failed`], it gives
/// them back.
#[derive(Debug)]
pub struct LoginAttempt<'a> {
    guard: &'a LoginGuard,
    user: UserKey,
    source: Option<IpAddr>,
    suspect: bool,
    failed: bool,
}

impl LoginAttempt<'_> {
    /// Whether its user name or address failed lately.
    pub fn is_suspect(&self) -> bool {
        self.suspect
    }

    /// Runs `check` (a password check) on a blocking thread once a slot is
    /// free: a suspect first takes one of the suspects' slots. Refused
    /// ([`LoginRefused::Busy`]) when too many logins wait already.
    pub async fn verify(
        &self,
        check: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<bool, LoginRefused> {
        let guard = self.guard;
        let _waiting = guard.waiting.try_acquire().map_err(|_| {
            guard.refused(&LoginRefused::Busy);
            LoginRefused::Busy
        })?;
        let _suspect = if self.suspect {
            let slot = guard.suspects.acquire().await;
            Some(slot.map_err(|_| LoginRefused::Stopping)?)
        } else {
            None
        };
        let _slot = guard
            .verifications
            .acquire()
            .await
            .map_err(|_| LoginRefused::Stopping)?;
        metrics::counter!("oncekv_password_verifications_total").increment(1);
        Ok(tokio::task::spawn_blocking(check).await.unwrap_or(false))
    }

    /// The login failed on its password: the failure it holds is spent.
    pub fn failed(mut self) {
        self.failed = true;
        metrics::counter!("oncekv_logins_total", "result" => "failed").increment(1);
    }
}

impl Drop for LoginAttempt<'_> {
    fn drop(&mut self) {
        if self.failed {
            return;
        }
        let now = Instant::now();
        let mut tables = crate::sync::lock(&self.guard.tables);
        tables.users.give_back(&self.user, now);
        if let Some(address) = &self.source {
            tables.sources.give_back(address, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const SECOND: Duration = Duration::from_secs(1);

    fn table(burst: u32, refill: Duration, max: usize) -> FailureTable<&'static str> {
        FailureTable::new(burst, refill, max)
    }

    #[test]
    fn a_bucket_spends_its_burst_then_refills_one_failure_per_period() {
        let start = Instant::now();
        let mut table = table(3, 10 * SECOND, 16);
        assert!(!table.is_suspect(&"a", start));
        for _ in 0..3 {
            assert_eq!(table.wait(&"a", start), Duration::ZERO);
            table.take(&"a", start);
        }
        assert!(table.is_suspect(&"a", start));
        assert_eq!(table.wait(&"a", start), 10 * SECOND);
        let later = start + 4 * SECOND;
        assert_eq!(table.wait(&"a", later), 6 * SECOND);
        // Another key is not touched.
        assert_eq!(table.wait(&"b", start), Duration::ZERO);
        // One failure refills per period, never beyond the burst.
        let refilled = start + 10 * SECOND;
        assert_eq!(table.wait(&"a", refilled), Duration::ZERO);
        table.take(&"a", refilled);
        assert_eq!(table.wait(&"a", refilled), 10 * SECOND);
        let much_later = start + 1000 * SECOND;
        assert_eq!(table.tokens(&"a", much_later), 3.0);
        assert!(!table.is_suspect(&"a", much_later));
    }

    #[test]
    fn a_failure_given_back_is_as_if_never_taken() {
        let now = Instant::now();
        let mut table = table(2, 10 * SECOND, 16);
        table.take(&"a", now);
        assert_eq!(table.len(), 1);
        table.give_back(&"a", now);
        assert!(table.is_empty(), "a full bucket is dropped");
        table.take(&"a", now);
        table.take(&"a", now);
        table.give_back(&"a", now);
        assert_eq!(table.tokens(&"a", now), 1.0);
        assert_eq!(table.len(), 1);
        // Giving back what was never taken changes nothing.
        table.give_back(&"b", now);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_full_table_drops_refilled_buckets_then_the_least_recently_touched() {
        let start = Instant::now();
        let mut table = table(2, 10 * SECOND, 3);
        table.take(&"old", start);
        table.take(&"mid", start + SECOND);
        table.take(&"new", start + 2 * SECOND);
        // Full: the least recently touched goes.
        table.take(&"fourth", start + 3 * SECOND);
        assert_eq!(table.len(), 3);
        assert!(!table.is_suspect(&"old", start + 3 * SECOND), "evicted");
        assert!(table.is_suspect(&"mid", start + 3 * SECOND));
        // Once buckets have refilled, they go first, whatever their age.
        let refilled = start + 13 * SECOND;
        table.take(&"mid", refilled);
        table.take(&"mid", refilled);
        table.take(&"fifth", refilled);
        assert_eq!(table.len(), 2, "\"new\" and \"fourth\" refilled and went");
        assert!(table.is_suspect(&"fifth", refilled));
        assert_eq!(table.wait(&"mid", refilled), 10 * SECOND);
    }

    #[test]
    fn the_table_never_holds_more_than_its_cap() {
        let now = Instant::now();
        let mut table: FailureTable<u32> = FailureTable::new(5, SECOND, 100);
        for key in 0..10_000 {
            table.take(&key, now + Duration::from_millis(u64::from(key)));
            assert!(table.len() <= 100);
        }
    }

    fn guard() -> LoginGuard {
        LoginGuard::new(
            FailureTable::new(2, 60 * SECOND, 16),
            FailureTable::new(4, 60 * SECOND, 16),
        )
    }

    const HOME: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
    const AWAY: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));

    #[test]
    fn failures_are_limited_per_user_name() {
        let guard = guard();
        let now = Instant::now();
        for _ in 0..2 {
            guard
                .begin_attempt_at("alice", HOME, now)
                .expect("admitted")
                .failed();
        }
        let refused = guard
            .begin_attempt_at("alice", AWAY, now)
            .expect_err("refused");
        assert!(
            matches!(refused, LoginRefused::User { retry_after } if retry_after == 60 * SECOND)
        );
        assert_eq!(
            refused.to_string(),
            "too many failed logins for this user name, retry after 60 s"
        );
        // Another user from the same address still logs in.
        drop(
            guard
                .begin_attempt_at("bob", HOME, now)
                .expect("another user"),
        );
        // A minute later alice may fail once more.
        let later = now + 60 * SECOND;
        guard
            .begin_attempt_at("alice", HOME, later)
            .expect("refilled")
            .failed();
        assert!(guard.begin_attempt_at("alice", HOME, later).is_err());
    }

    #[test]
    fn failures_are_limited_per_address() {
        let guard = guard();
        let now = Instant::now();
        for user in ["a", "b", "c", "d"] {
            guard
                .begin_attempt_at(user, AWAY, now)
                .expect("admitted")
                .failed();
        }
        let refused = guard.begin_attempt_at("e", AWAY, now).expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "too many failed logins from 127.0.0.2, retry after 60 s"
        );
        // Another address is not limited, nor a call with no address.
        drop(
            guard
                .begin_attempt_at("e", HOME, now)
                .expect("another address"),
        );
        drop(guard.begin_attempt_at("e", None, now).expect("no address"));
    }

    #[test]
    fn a_login_that_does_not_fail_costs_nothing() {
        let guard = guard();
        let now = Instant::now();
        for _ in 0..10 {
            let attempt = guard
                .begin_attempt_at("alice", HOME, now)
                .expect("admitted");
            assert!(!attempt.is_suspect());
            drop(attempt);
        }
        let tables = crate::sync::lock(&guard.tables);
        assert!(tables.users.is_empty() && tables.sources.is_empty());
    }

    #[test]
    fn attempts_in_flight_hold_their_failure_so_a_flood_cannot_overshoot() {
        let guard = guard();
        let now = Instant::now();
        let first = guard.begin_attempt_at("alice", HOME, now).expect("first");
        let second = guard.begin_attempt_at("alice", HOME, now).expect("second");
        assert!(!first.is_suspect());
        assert!(second.is_suspect(), "alice has a failure outstanding");
        assert!(
            guard.begin_attempt_at("alice", HOME, now).is_err(),
            "both held"
        );
        drop(first);
        let third = guard
            .begin_attempt_at("alice", HOME, now)
            .expect("given back");
        drop((second, third));
    }

    #[test]
    fn ipv6_counts_by_its_prefix_and_mapped_ipv4_as_ipv4() {
        let one: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let two: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_key(one), source_key(two));
        assert_ne!(source_key(one), source_key(other));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(4001)), 5);
        assert_eq!(seconds(Duration::from_secs(60)), 60);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn suspects_hold_at_most_their_slots_and_clean_logins_get_the_others() {
        let guard: &'static LoginGuard = Box::leak(Box::new(guard()));
        let now = Instant::now();
        // A suspect's check that does not end until told.
        guard
            .begin_attempt_at("mallory", AWAY, now)
            .expect("first")
            .failed();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let suspect = guard
            .begin_attempt_at("mallory", AWAY, now)
            .expect("suspect");
        assert!(suspect.is_suspect());
        let held = tokio::spawn(async move {
            suspect
                .verify(move || released.recv().is_ok())
                .await
                .expect("checked")
        });
        // Another suspect waits for the suspects' slot...
        let other = guard
            .begin_attempt_at("trudy", AWAY, now)
            .expect("admitted");
        assert!(other.is_suspect(), "its address failed");
        let waiting = tokio::spawn(async move { other.verify(|| false).await });
        // ...while a clean login is checked at once, in the other slot.
        let clean = guard.begin_attempt_at("alice", HOME, now).expect("clean");
        assert!(!clean.is_suspect());
        let checked = tokio::time::timeout(Duration::from_secs(30), clean.verify(|| true))
            .await
            .expect("a clean login is not starved")
            .expect("checked");
        assert!(checked);
        assert!(!waiting.is_finished(), "the second suspect waits");
        release.send(()).expect("release");
        assert!(held.await.expect("task"));
        assert_eq!(waiting.await.expect("task"), Ok(false));
    }

    #[tokio::test]
    async fn too_many_waiting_logins_are_shed() {
        let guard = guard();
        let attempt = guard
            .begin_attempt_at("alice", None, Instant::now())
            .expect("admitted");
        let all = guard
            .waiting
            .acquire_many(LOGINS_WAITING_MAX as u32)
            .await
            .expect("every waiting slot");
        assert_eq!(attempt.verify(|| true).await, Err(LoginRefused::Busy));
        drop(all);
        assert_eq!(attempt.verify(|| true).await, Ok(true));
    }
}

//! Loaders that grow a cluster's state to a given size, for measuring how
//! costs grow with it: `--fill` makes a PUT run write keys `0, 1, 2, ...` in
//! order, one shared sequence for all tasks (so `--keys N --ops N --warmup
//! 0s` writes every key exactly once), and `--open-sessions N` opens N
//! sessions that stay live until their TTL (on etcd, N leases: etcd's
//! sessions are leases).

use oncekv_client::{Client, ClientError, ClientOptions, SessionOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A shared sequence of key numbers, on once started.
struct Sequence {
    on: AtomicBool,
    next: AtomicU64,
}

impl Sequence {
    const fn new() -> Sequence {
        Sequence {
            on: AtomicBool::new(false),
            next: AtomicU64::new(0),
        }
    }

    fn start(&self) {
        self.next.store(0, Ordering::Relaxed);
        self.on.store(true, Ordering::Relaxed);
    }

    fn next(&self, keys: u64) -> Option<u64> {
        self.on
            .load(Ordering::Relaxed)
            .then(|| self.next.fetch_add(1, Ordering::Relaxed) % keys.max(1))
    }
}

/// The fill of this process's run (set once, before the run).
static FILL: Sequence = Sequence::new();

/// Makes every task of this process's run draw its keys from one
/// sequence, `0, 1, 2, ...` (wrapping at `--keys`), instead of at random.
pub fn start_sequential() {
    FILL.start();
}

/// The next key number of a sequential fill over `keys` keys, or `None`
/// when keys are drawn at random.
pub fn next_index(keys: u64) -> Option<u64> {
    FILL.next(keys)
}

/// How long the sessions of `--open-sessions` live without keep-alive.
pub const SESSION_TTL: Duration = Duration::from_secs(3600);

/// Tries per session open refused as overloaded (the node's session-open
/// rate limit) before the loader gives up.
const OPEN_TRIES: u32 = 50;

/// Pause after a refused open (doubling, at most a second).
const OPEN_BACKOFF: Duration = Duration::from_millis(20);

/// What `--open-sessions` did.
#[derive(Debug, Default)]
pub struct Opened {
    /// Sessions opened (and left open).
    pub opened: u64,
    /// Opens refused as overloaded and retried.
    pub retried: u64,
    /// Opens that failed for good.
    pub failed: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Wall time of the whole load.
    pub elapsed: Duration,
}

impl Opened {
    /// One JSON object for scripts.
    pub fn json(&self) -> String {
        let seconds = self.elapsed.as_secs_f64();
        let rate = if seconds > 0.0 {
            self.opened as f64 / seconds
        } else {
            0.0
        };
        format!(
            "{{\"opened\":{},\"retried\":{},\"failed\":{},\"elapsed_s\":{seconds:.3},\"opens_per_s\":{rate:.1},\"first_error\":{}}}",
            self.opened,
            self.retried,
            self.failed,
            self.first_error
                .as_ref()
                .map_or("null".to_string(), |e| format!("{e:?}")),
        )
    }
}

/// Opens `sessions` sessions with `concurrency` tasks over `connections`
/// clients, and leaves them open (no keep-alive: each lives
/// [`SESSION_TTL`] of cluster time).
pub async fn open_sessions(
    endpoints: &[String],
    options: ClientOptions,
    sessions: u64,
    connections: usize,
    concurrency: usize,
) -> anyhow::Result<Opened> {
    let clients = (0..connections.max(1))
        .map(|_| Client::connect(endpoints.iter().cloned(), options.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    open_each(sessions, clients, concurrency, |client| async move {
        let mut retried = 0;
        let opened = open_one(&client, &mut retried).await;
        (retried, opened.map_err(|error| error.to_string()))
    })
    .await
}

/// Runs `open` `count` times, from `concurrency` tasks dealt over
/// `clients`; `open` says how often it retried and whether it succeeded.
pub async fn open_each<C, F, Fut>(
    count: u64,
    clients: Vec<C>,
    concurrency: usize,
    open: F,
) -> anyhow::Result<Opened>
where
    C: Clone + Send + 'static,
    F: Fn(C) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u64, Result<(), String>)> + Send,
{
    anyhow::ensure!(!clients.is_empty(), "no client to open with");
    let started = Instant::now();
    let claimed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(concurrency);
    for task in 0..concurrency.max(1) {
        let client = clients[task % clients.len()].clone();
        let claimed = claimed.clone();
        let open = open.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Opened::default();
            while claimed.fetch_add(1, Ordering::Relaxed) < count {
                let (retried, opened) = open(client.clone()).await;
                done.retried += retried;
                match opened {
                    Ok(()) => done.opened += 1,
                    Err(error) => {
                        done.failed += 1;
                        done.first_error.get_or_insert(error);
                    }
                }
            }
            done
        }));
    }
    let mut total = Opened::default();
    for task in tasks {
        let done = task.await?;
        total.opened += done.opened;
        total.retried += done.retried;
        total.failed += done.failed;
        if total.first_error.is_none() {
            total.first_error = done.first_error;
        }
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

/// Opens one session and detaches it, retrying (bounded) while the node
/// refuses opens as overloaded.
async fn open_one(client: &Client, retried: &mut u64) -> Result<(), ClientError> {
    let options = SessionOptions {
        ttl: SESSION_TTL,
        keep_alive: false,
        ..SessionOptions::default()
    };
    let mut pause = OPEN_BACKOFF;
    let mut tries = 0;
    loop {
        tries += 1;
        match client.open_session(options).await {
            Ok(session) => {
                session.detach();
                return Ok(());
            }
            Err(ClientError::Overloaded(_)) if tries < OPEN_TRIES => {
                *retried += 1;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequential_fill_draws_every_key_once_then_wraps() {
        let sequence = Sequence::new();
        assert_eq!(sequence.next(5), None);
        sequence.start();
        let drawn: Vec<u64> = (0..7).filter_map(|_| sequence.next(5)).collect();
        assert_eq!(drawn, vec![0, 1, 2, 3, 4, 0, 1]);
        sequence.start();
        assert_eq!(sequence.next(5), Some(0));
    }
}

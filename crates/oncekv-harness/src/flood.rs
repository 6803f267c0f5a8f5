//! [`flood`]: the flood fault. Outside the recorded history, a few tasks
//! open sessions that are never used or kept alive and send one-shot reads
//! under fresh idempotency keys, straight to the nodes, until the window
//! ends or a bounded number of requests was sent. The cluster's tables
//! fill and must refuse what does not fit without evicting anything live,
//! so the checkers still find every acknowledged request applied once.

use oncekv_client::{Backoff, Client, ClientError, ClientOptions};
use oncekv_state::{Command, Query, Secret};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Most requests one flood window sends.
pub const REQUESTS_MAX: u64 = 2_000;
/// Concurrent flooding tasks.
const TASKS: u64 = 4;
/// The time-to-live of a flood's sessions: they expire soon after the
/// window, so the table is not full for the rest of the run.
const SESSION_TTL_MS: u64 = 2_000;

/// What one flood window sent and how it was answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloodCounts {
    /// Requests sent.
    pub sent: u64,
    /// Sessions opened and keys recorded.
    pub accepted: u64,
    /// Refused as overloaded (a full table or budget, or shed load).
    pub refused: u64,
}

/// Floods the nodes at `addresses` for up to `hold`, or until `stop`.
pub async fn flood(
    addresses: &[String],
    hold: Duration,
    seed: u64,
    stop: &watch::Receiver<bool>,
) -> FloodCounts {
    let options = ClientOptions {
        attempt_timeout: Duration::from_millis(500),
        deadline: Duration::from_secs(1),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
        ..ClientOptions::default()
    };
    let Ok(client) = Client::connect(addresses.iter().cloned(), options) else {
        return FloodCounts::default();
    };
    let until = Instant::now() + hold;
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (client, next, accepted, refused) = (
            client.clone(),
            next.clone(),
            accepted.clone(),
            refused.clone(),
        );
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until && !*stop.borrow() {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= REQUESTS_MAX {
                    break;
                }
                let answer = if n % 2 == 0 {
                    let open = Command::OpenSession {
                        ttl_ms: SESSION_TTL_MS,
                        window: 1,
                        secret: Secret(0),
                    };
                    client.execute_plain(open).await.map(|_| ())
                } else {
                    let read = Command::Read(Query::Get {
                        key: b"flood".to_vec(),
                    });
                    let key = format!("flood-{seed:x}-{n}").into_bytes();
                    client.execute_once(read, Some(key)).await.map(|_| ())
                };
                match answer {
                    Ok(()) => accepted.fetch_add(1, Ordering::Relaxed),
                    Err(ClientError::Overloaded(_)) => refused.fetch_add(1, Ordering::Relaxed),
                    Err(_) => 0,
                };
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    FloodCounts {
        sent: next.load(Ordering::Relaxed).min(REQUESTS_MAX),
        accepted: accepted.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
    }
}

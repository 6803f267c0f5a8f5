//! The oncekv target: one `Client` per connection (its own HTTP/2
//! connections, leader discovery and retries) and, in session mode, one
//! session per connection that all of its tasks pipeline into, up to the
//! session's window. Tasks are dealt to connections round-robin.

use super::Mode;
use super::closed_loop::{Completion, OpError, TaskClient};
use super::watch::WatchClient;
use super::workload::Op;
use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Completed, EventKind, Query, Reply, Session,
    SessionOptions, Txn, TxnOp, WatchOptions, WatchUpdate, Watcher,
};
use std::time::Duration;

/// How often an idle watcher hears its progress: a watcher counts as
/// started at its first update, and before any write that is a progress
/// notice.
const WATCH_PROGRESS: Duration = Duration::from_millis(200);

/// The clients of a run, one per task, and the sessions to close after.
#[derive(Debug)]
pub struct Setup {
    /// One per task.
    pub tasks: Vec<OncekvTask>,
    /// One per connection, in session mode.
    pub sessions: Vec<Session>,
}

/// The client of one task.
#[derive(Debug)]
pub struct OncekvTask {
    client: Client,
    session: Option<Session>,
    mode: Mode,
}

/// How many of `concurrency` tasks, dealt round-robin, land on the
/// busiest of `connections` connections.
fn tasks_per_connection(concurrency: usize, connections: usize) -> usize {
    concurrency.div_ceil(connections.max(1))
}

/// The session window for that many tasks: at least the default of 128,
/// at most the largest a cluster allows.
fn window(tasks: usize) -> u32 {
    u32::try_from(tasks).unwrap_or(u32::MAX).clamp(
        oncekv_state::WINDOW_DEFAULT,
        oncekv_state::WINDOW_MAX_ABSOLUTE,
    )
}

/// Connects `connections` clients with `options` (transport, credentials,
/// deadline; and opens their sessions in session mode), and deals
/// `concurrency` tasks over them.
pub async fn connect(
    endpoints: &[String],
    mode: Mode,
    connections: usize,
    concurrency: usize,
    options: ClientOptions,
) -> anyhow::Result<Setup> {
    let mut clients = Vec::with_capacity(connections);
    let mut sessions = Vec::new();
    let window = window(tasks_per_connection(concurrency, connections));
    for _ in 0..connections {
        let client = Client::connect(endpoints.iter().cloned(), options.clone())?;
        let session = match mode {
            Mode::Session => {
                let session = client
                    .open_session(SessionOptions {
                        window,
                        ..SessionOptions::default()
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("opening a session: {e}"))?;
                sessions.push(session.clone());
                Some(session)
            }
            Mode::Plain | Mode::Key => None,
        };
        clients.push((client, session));
    }
    let tasks = (0..concurrency)
        .map(|task| {
            let (client, session) = &clients[task % connections];
            OncekvTask {
                client: client.clone(),
                session: session.clone(),
                mode,
            }
        })
        .collect();
    Ok(Setup { tasks, sessions })
}

/// Closes the sessions (best effort: an unclosed one expires by itself).
pub async fn close(sessions: Vec<Session>) {
    for session in sessions {
        let _ = session.close().await;
    }
}

/// A short, stable name of a client error, to count errors by.
fn error_kind(error: &ClientError) -> String {
    let name = |debug: String| {
        debug
            .split(['(', ' ', '{'])
            .next()
            .unwrap_or("Error")
            .to_string()
    };
    match error {
        ClientError::Rejected(rejection) => format!("Rejected:{}", name(format!("{rejection:?}"))),
        other => name(format!("{other:?}")),
    }
}

fn failure(error: ClientError) -> OpError {
    OpError::new(error_kind(&error), error.to_string())
}

impl OncekvTask {
    /// Runs a mutating command the way the mode says.
    async fn write(&self, command: Command) -> Result<Completed, ClientError> {
        match (self.mode, &self.session) {
            (Mode::Session, Some(session)) => session.execute_completed(command).await,
            (Mode::Key, _) => self.client.execute_once(command, None).await,
            _ => self.client.execute_plain(command).await,
        }
    }

    async fn get(&self, key: Vec<u8>, serializable: bool) -> Result<Option<Vec<u8>>, ClientError> {
        match self.client.read(Query::Get { key }, serializable).await? {
            Reply::Get { value, .. } => Ok(value),
            other => Err(ClientError::Invalid(format!(
                "a GET was answered with {other:?}"
            ))),
        }
    }
}

impl TaskClient for OncekvTask {
    async fn execute(&mut self, op: Op) -> Result<Completion, OpError> {
        let command = match op {
            Op::Get { key, serializable } => {
                self.get(key, serializable).await.map_err(failure)?;
                return Ok(Completion::default());
            }
            Op::Put { key, value } => Command::Put {
                key,
                value: value.into(),
                lease: None,
            },
            Op::Append { key, value } => Command::Append { key, value },
            Op::Incr { key } => Command::Incr { key, by: 1 },
            Op::Cas { key, new } => {
                let expected = self.get(key.clone(), false).await.map_err(failure)?;
                Command::Cas { key, expected, new }
            }
            // One transaction, no compare: the server adds and subtracts.
            Op::Transfer { from, to } => Command::Txn(
                Txn::new()
                    .on_success(TxnOp::incr(from, -1))
                    .on_success(TxnOp::incr(to, 1)),
            ),
        };
        let completed = self.write(command).await.map_err(failure)?;
        Ok(Completion {
            cas_conflict: matches!(completed.reply, Reply::Cas { swapped: false, .. }),
            retries: 0,
            duplicate: completed.replayed,
        })
    }
}

/// One watcher of the watch workload.
#[derive(Debug)]
pub struct OncekvWatcher {
    watcher: Watcher,
}

/// Connects `connections` clients (each its own HTTP/2 connection; the
/// server takes a bounded number of streams per connection) and makes
/// `watchers` watchers of `prefix` dealt over them round-robin. Each
/// client first reads a key, so that it knows the leader: the watches go
/// to it.
pub async fn watchers(
    endpoints: &[String],
    connections: usize,
    watchers: usize,
    prefix: &[u8],
    options: ClientOptions,
) -> anyhow::Result<Vec<OncekvWatcher>> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let client = Client::connect(endpoints.iter().cloned(), options.clone())?;
        client
            .read(
                Query::Get {
                    key: prefix.to_vec(),
                },
                false,
            )
            .await
            .map_err(|e| anyhow::anyhow!("reaching the cluster: {e}"))?;
        clients.push(client);
    }
    Ok((0..watchers)
        .map(|n| OncekvWatcher {
            watcher: clients[n % connections].watch(
                prefix.to_vec(),
                WatchOptions::default()
                    .with_prefix()
                    .with_progress_interval(WATCH_PROGRESS),
            ),
        })
        .collect())
}

impl WatchClient for OncekvWatcher {
    async fn next_values(&mut self) -> Result<Vec<Vec<u8>>, OpError> {
        match self.watcher.next().await.map_err(failure)? {
            WatchUpdate::Changes { events, .. } => Ok(events
                .into_iter()
                .filter(|event| event.kind == EventKind::Put)
                .map(|event| event.value)
                .collect()),
            WatchUpdate::Progress(_) => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_client::Rejection;

    #[test]
    fn errors_are_counted_by_a_short_name() {
        assert_eq!(error_kind(&ClientError::SessionExpired), "SessionExpired");
        assert_eq!(
            error_kind(&ClientError::OutcomeUnknown {
                request_id: None,
                attempts: 3,
                last_answer: None,
            }),
            "OutcomeUnknown"
        );
        assert_eq!(
            error_kind(&ClientError::Unreachable("x y".into())),
            "Unreachable"
        );
        assert_eq!(
            error_kind(&ClientError::Rejected(Rejection::NotAnInteger)),
            "Rejected:NotAnInteger"
        );
    }

    #[test]
    fn the_window_covers_the_tasks_of_a_connection() {
        assert_eq!(tasks_per_connection(64, 1), 64);
        assert_eq!(tasks_per_connection(65, 2), 33);
        assert_eq!(window(1), 128);
        assert_eq!(window(300), 300);
        assert_eq!(window(5000), 1024);
    }
}
